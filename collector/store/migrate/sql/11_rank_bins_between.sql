-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE FUNCTION jobpulse.rank_bins_between(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz)
RETURNS TABLE (bin timestamptz, rank integer, n_cpu bigint, sum_cpu float8, n_sm bigint, sum_sm bigint)
LANGUAGE sql STABLE AS $$
SELECT date_bin(interval '10 seconds', s.ts, timestamptz 'epoch'), s.rank,  -- a row weighs 1 + held ticks
       coalesce(sum(1 + coalesce(s.held, 0)) FILTER (WHERE s.cpu_percent IS NOT NULL), 0),
       sum(s.cpu_percent::float8 * (1 + coalesce(s.held, 0))),
       coalesce(sum(1 + coalesce(s.held, 0)) FILTER (WHERE s.sm_util IS NOT NULL), 0),
       sum(s.sm_util * (1 + coalesce(s.held, 0)))
  FROM jobpulse.process_samples s
 WHERE s.cluster = p_cluster AND s.job_id = p_job AND s.rank IS NOT NULL
   AND s.ts >= date_bin(interval '10 seconds', p_from, timestamptz 'epoch')
   AND s.ts < date_bin(interval '10 seconds', p_to, timestamptz 'epoch') + interval '10 seconds'
 GROUP BY 1, 2
UNION ALL
SELECT b.chunk_start + make_interval(secs => 10 * (b.first_bin + r.lo + u.i - 2)), b.rank, u.n_cpu::bigint,
       u.sum_cpu, u.n_sm::bigint, u.sum_sm
  FROM jobpulse.rank_bins_compact b
 CROSS JOIN LATERAL (  -- the positions of the range's bins (a slice clips to the array; lo from 1)
       SELECT greatest(1, floor(extract(epoch FROM p_from - b.chunk_start) / 10)::int - b.first_bin + 1) AS lo,
              floor(extract(epoch FROM p_to - b.chunk_start) / 10)::int - b.first_bin + 1 AS hi) r
 CROSS JOIN LATERAL unnest(b.n_cpu[r.lo:r.hi], b.sum_cpu[r.lo:r.hi], b.n_sm[r.lo:r.hi], b.sum_sm[r.lo:r.hi])
       WITH ORDINALITY AS u(n_cpu, sum_cpu, n_sm, sum_sm, i)
 WHERE b.cluster = p_cluster AND b.job_id = p_job
   AND b.chunk_start > p_from - interval '6 hours' AND b.chunk_start <= p_to
$$;
