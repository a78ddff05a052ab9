-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE VIEW jobpulse.job_steps AS
SELECT e.ts, e.cluster, e.job_id, e.step, e.rank, e.node, e.pid,
       jobpulse.attr_bigint(e.attrs, 'step') AS step_number,
       jobpulse.attr_number(e.attrs, 'samples') AS samples,
       jobpulse.attr_number(e.attrs, 'samples_per_s') AS samples_per_s,
       e.attrs AS metrics
  FROM jobpulse.events e
 WHERE e.kind = 'step' AND e.job_id IS NOT NULL;
