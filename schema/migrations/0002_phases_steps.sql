-- Phases and steps from application events, per job and rank: what Grafana regions,
-- annotations and throughput panels read.

-- One row per phase: ended phases (phase_end; its start is ts - duration_s, or the latest
-- matching phase_start) and phases still open (a phase_start with no later phase_end).
-- Events are matched by job, rank and phase name, so a shell script's separate `emit`
-- processes pair as well as a `with phase(...)` block.
CREATE VIEW jobpulse.job_phases AS
SELECT e.cluster, e.job_id, e.step, e.rank, e.node, e.pid, e.name AS phase,
       coalesce(CASE WHEN jsonb_typeof(e.attrs->'duration_s') = 'number'
                     THEN e.ts - make_interval(secs => least((e.attrs->>'duration_s')::double precision, 1e8)) END,
                (SELECT max(s.ts) FROM jobpulse.events s
                  WHERE s.kind = 'phase_start' AND s.cluster = e.cluster AND s.job_id = e.job_id
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
                    WHERE e.kind = 'phase_end' AND e.cluster = s.cluster AND e.job_id = s.job_id
                      AND e.rank IS NOT DISTINCT FROM s.rank AND e.name = s.name AND e.ts >= s.ts);

-- One row per reported step: step number, samples and samples/s (the client computes the rate
-- between consecutive steps of one process), other metrics in attrs.
CREATE VIEW jobpulse.job_steps AS
SELECT e.ts, e.cluster, e.job_id, e.step, e.rank, e.node, e.pid,
       CASE WHEN (e.attrs->>'step') ~ '^-?[0-9]{1,18}$' THEN (e.attrs->>'step')::bigint END AS step_number,
       CASE WHEN jsonb_typeof(e.attrs->'samples') = 'number' THEN (e.attrs->>'samples')::double precision END
           AS samples,
       CASE WHEN jsonb_typeof(e.attrs->'samples_per_s') = 'number'
            THEN (e.attrs->>'samples_per_s')::double precision END AS samples_per_s,
       e.attrs AS metrics
  FROM jobpulse.events e
 WHERE e.kind = 'step' AND e.job_id IS NOT NULL;

CREATE INDEX events_job_kind ON jobpulse.events (job_id, kind, ts) WHERE job_id IS NOT NULL;

DO $$
BEGIN
    GRANT SELECT ON jobpulse.job_phases, jobpulse.job_steps TO jobpulse_reader;
EXCEPTION WHEN undefined_object THEN
    RAISE NOTICE 'role jobpulse_reader does not exist: grant SELECT on the new views yourself';
END
$$;
