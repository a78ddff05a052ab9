-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
-- A process row stands for 1 + held ticks (the agent holds back unchanged ones): means weigh it so.
CREATE OR REPLACE FUNCTION jobpulse.rank_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
                                                p_step_s integer DEFAULT 0)
RETURNS TABLE ("time" timestamptz, rank integer, cpu_percent float8, sm_util float8, source text)
LANGUAGE sql STABLE AS $$
SELECT date_bin(make_interval(secs => greatest(p_step_s, 1)), p.ts, timestamptz 'epoch'), p.rank,
       sum(p.cpu_percent::float8 * (1 + coalesce(p.held, 0)))
         / nullif(sum(1 + coalesce(p.held, 0)) FILTER (WHERE p.cpu_percent IS NOT NULL), 0),
       sum(p.sm_util::float8 * (1 + coalesce(p.held, 0)))
         / nullif(sum(1 + coalesce(p.held, 0)) FILTER (WHERE p.sm_util IS NOT NULL), 0), 'process_samples'
  FROM jobpulse.process_samples_between(p_from, p_to) p
 WHERE p_to - p_from <= interval '1 hour' AND p_step_s < 5
   AND p.job_id = p_job AND p.cluster = p_cluster AND p.rank IS NOT NULL
 GROUP BY 1, 2
UNION ALL
SELECT date_bin(make_interval(secs => greatest(p_step_s, 10)), b.bin, timestamptz 'epoch'), b.rank,
       sum(b.sum_cpu) / nullif(sum(b.n_cpu), 0), sum(b.sum_sm)::float8 / nullif(sum(b.n_sm), 0),
       'process_samples 10 s bins'
  FROM jobpulse.rank_bins_between(p_cluster, p_job, p_from, p_to) b
 WHERE p_to - p_from <= interval '1 hour' AND p_step_s >= 5 AND p_step_s < 20
   AND NOT jobpulse.rank_bins_missing(p_cluster, p_job, p_from, p_to)
 GROUP BY 1, 2
UNION ALL
SELECT date_bin(make_interval(secs => greatest(p_step_s, 10)),
                date_bin(interval '10 seconds', p.ts, timestamptz 'epoch'), timestamptz 'epoch'), p.rank,
       sum(p.cpu_percent::float8 * (1 + coalesce(p.held, 0)))
         / nullif(sum(1 + coalesce(p.held, 0)) FILTER (WHERE p.cpu_percent IS NOT NULL), 0),
       sum(p.sm_util::float8 * (1 + coalesce(p.held, 0)))
         / nullif(sum(1 + coalesce(p.held, 0)) FILTER (WHERE p.sm_util IS NOT NULL), 0), 'process_samples 10 s bins'
  FROM jobpulse.process_samples_between(date_bin(interval '10 seconds', p_from, timestamptz 'epoch'),
                                        date_bin(interval '10 seconds', p_to, timestamptz 'epoch')
                                        + interval '10 seconds' - interval '1 microsecond') p
 WHERE p_to - p_from <= interval '1 hour' AND p_step_s >= 5 AND p_step_s < 20
   AND jobpulse.rank_bins_missing(p_cluster, p_job, p_from, p_to)
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
