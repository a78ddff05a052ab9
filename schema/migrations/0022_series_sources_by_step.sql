-- rank_series reads the coarsest source that still draws the panel's step (as gpu_series does,
-- collector/store/series.py): process samples for steps under 20 s over at most 1 h, 60 s roll-ups
-- for steps under 150 s over at most 12 h, 300 s roll-ups otherwise (coarse ones at steps of
-- 1,800 s or more). The 60 s roll-ups are taken from a third of their width (a panel's step of
-- 20-30 s then shows minutes): a 1 h panel of 64 ranks at 29 s steps reads 3,840 rows of 60 s
-- instead of 230,400 samples.
SET LOCAL check_function_bodies = off;
CREATE OR REPLACE FUNCTION jobpulse.rank_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
                                                p_step_s integer DEFAULT 0)
RETURNS TABLE ("time" timestamptz, rank integer, cpu_percent float8, sm_util float8, source text)
LANGUAGE sql STABLE AS $$
SELECT date_bin(make_interval(secs => greatest(p_step_s, 1)), p.ts, timestamptz 'epoch'), p.rank,
       avg(p.cpu_percent::float8), avg(p.sm_util::float8), 'process_samples'
  FROM jobpulse.process_samples_between(p_from, p_to) p
 WHERE p_to - p_from <= interval '1 hour' AND p_step_s < 20
   AND p.job_id = p_job AND p.cluster = p_cluster AND p.rank IS NOT NULL
 GROUP BY 1, 2
UNION ALL
SELECT date_bin(make_interval(secs => greatest(p_step_s, r.width_s)), r.bucket, timestamptz 'epoch'), r.rank,
       sum(r.sum_cpu_percent) / nullif(sum(r.n_cpu), 0), sum(r.sum_sm_util) / nullif(sum(r.n_sm), 0),
       'process_rollup ' || min(r.width_s) || ' s'
  FROM jobpulse.process_rollup_between(p_cluster, p_job, p_from, p_to,
                                       CASE WHEN p_to - p_from <= interval '12 hours' AND p_step_s < 150 THEN 60
                                            ELSE 300 END,
                                       p_step_s >= 1800) r
 WHERE (p_to - p_from > interval '1 hour' OR p_step_s >= 20) AND r.rank IS NOT NULL
 GROUP BY 1, 2
$$;
