-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE FUNCTION jobpulse.step_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
                                     p_step_s integer DEFAULT 0)
RETURNS TABLE ("time" timestamptz, rank integer, samples_per_s float8, step_number bigint, source text)
LANGUAGE sql STABLE AS $$
SELECT date_bin(make_interval(secs => greatest(p_step_s, 1)), s.ts, timestamptz 'epoch'), s.rank,
       avg(s.samples_per_s), max(s.step_number), 'events'
  FROM jobpulse.job_steps s
 WHERE p_to - p_from <= interval '1 hour'
   AND s.job_id = p_job AND s.cluster = p_cluster AND s.ts BETWEEN p_from AND p_to
 GROUP BY 1, 2
UNION ALL
SELECT date_bin(make_interval(secs => greatest(p_step_s, r.width_s)), r.bucket, timestamptz 'epoch'),
       nullif(r.rank, -1), sum(r.sum_samples_per_s) / nullif(sum(r.n_rate), 0), max(r.max_step_number),
       'step_rollup ' || min(r.width_s) || ' s'
  FROM jobpulse.step_rollup r
 WHERE p_to - p_from > interval '1 hour'
   AND r.width_s = CASE WHEN p_to - p_from <= interval '12 hours' THEN 60 ELSE 300 END
   AND r.cluster = p_cluster AND r.job_id = p_job
   AND r.bucket BETWEEN p_from - make_interval(secs => r.width_s) AND p_to
 GROUP BY 1, 2
$$;
