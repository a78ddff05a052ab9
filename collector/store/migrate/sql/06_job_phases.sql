-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE VIEW jobpulse.job_phases AS
SELECT e.cluster, e.job_id, e.step, e.rank, e.node, e.pid, e.name AS phase,
       coalesce(CASE WHEN jsonb_typeof(e.attrs->'duration_s') = 'number'
                     THEN e.ts - make_interval(secs => least((e.attrs->>'duration_s')::double precision, 1e8)) END,
                (SELECT max(s.ts) FROM jobpulse.events s
                  WHERE s.kind = 'phase_start' AND s.node = e.node AND s.cluster = e.cluster AND s.job_id = e.job_id
                    AND s.rank IS NOT DISTINCT FROM e.rank AND s.name = e.name AND s.ts <= e.ts)) AS started_at,
       e.ts AS ended_at,
       coalesce((e.attrs->>'status'), 'ok') AS status,
       e.attrs
  FROM jobpulse.events e
 WHERE e.kind = 'phase_end' AND e.job_id IS NOT NULL
UNION ALL
SELECT s.cluster, s.job_id, s.step, s.rank, s.node, s.pid, s.name, s.ts, NULL, 'running', s.attrs
  FROM jobpulse.events s
 WHERE s.kind = 'phase_start' AND s.job_id IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM jobpulse.events e
                    WHERE e.kind = 'phase_end' AND e.node = s.node AND e.cluster = s.cluster AND e.job_id = s.job_id
                      AND e.rank IS NOT DISTINCT FROM s.rank AND e.name = s.name AND e.ts >= s.ts);
