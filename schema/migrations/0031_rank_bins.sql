-- Ten-second sums of each rank's process samples in the compact tier, what rank_series reads at
-- steps of 5-20 s over ranges up to an hour (a 15-minute panel of 64 ranks asks for 8 s steps).
-- Unpacking the compact rows' samples for that cost ~1.3 us a sample in SQL (230,400 process
-- samples: 300-450 ms); the bins of the same quarter hour are 64 rows of 90 positions. Compaction
-- writes them in the statement that packs a chunk (collector/store/compact.py), so a chunk's
-- samples and its bins are compacted, merged with late data and dropped together.
--
-- One row per (node, job, rank, chunk): position i of each array is the 10 s bin
-- chunk_start + (first_bin + i - 1) x 10 s (chunks start on whole 10 s from the epoch, so a bin
-- never crosses one), holding the count of non-NULL values and their sum for CPU percent (summed
-- as float8, as avg does) and SM utilization over all the rank's processes; a bin without samples
-- in between holds 0 and NULL. Samples without a job or rank are not binned (rank_series skips
-- them). Compaction makes its partitions, for the day it writes, as for the other compact tables.
DO $$
DECLARE
    packed text := CASE WHEN (SELECT 'lz4' = ANY(enumvals) FROM pg_settings
                               WHERE name = 'default_toast_compression') THEN ' COMPRESSION lz4' ELSE '' END;
BEGIN
    EXECUTE format($t$
        CREATE TABLE jobpulse.rank_bins_compact (
            cluster     text        NOT NULL,
            node        text        NOT NULL,
            job_id      text        NOT NULL,
            rank        integer     NOT NULL,
            chunk_start timestamptz NOT NULL,
            n           integer     NOT NULL,  -- the process samples binned (NULL values included)
            first_bin   integer     NOT NULL,
            n_cpu       integer[]   %1$s NOT NULL,
            sum_cpu     float8[]    %1$s NOT NULL,
            n_sm        integer[]   %1$s NOT NULL,
            sum_sm      bigint[]    %1$s NOT NULL,
            PRIMARY KEY (cluster, node, chunk_start, job_id, rank)
        ) PARTITION BY RANGE (chunk_start)$t$, packed);
END
$$;
CREATE INDEX rank_bins_compact_job ON jobpulse.rank_bins_compact (job_id, chunk_start);

-- Bins of [from, to] widened to whole 10 s bins, from both tiers: the raw samples binned here, the
-- compact tier's as stored. A sample is in one tier at a time, so a bin that is partly late raw
-- data and partly compacted comes as two rows whose sums add up.
SET LOCAL check_function_bodies = off;
CREATE FUNCTION jobpulse.rank_bins_between(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz)
RETURNS TABLE (bin timestamptz, rank integer, n_cpu bigint, sum_cpu float8, n_sm bigint, sum_sm bigint)
LANGUAGE sql STABLE AS $$
SELECT date_bin(interval '10 seconds', s.ts, timestamptz 'epoch'), s.rank, count(s.cpu_percent),
       sum(s.cpu_percent::float8), count(s.sm_util), sum(s.sm_util)
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
GRANT EXECUTE ON FUNCTION jobpulse.rank_bins_between TO PUBLIC;

-- Whether a chunk of [from, to] holds compacted process samples of the job but no bins of it (a
-- chunk compacted before this migration; rank_series then bins the samples itself). PL/pgSQL: a
-- one-time test in rank_series on one server, and Citus plans its query with the values.
CREATE FUNCTION jobpulse.rank_bins_missing(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN EXISTS (SELECT 1 FROM jobpulse.process_samples_compact c
                  WHERE c.cluster = p_cluster AND c.job_id = p_job
                    AND c.chunk_start > p_from - interval '6 hours' AND c.chunk_start <= p_to
                    AND NOT EXISTS (SELECT 1 FROM jobpulse.rank_bins_compact b
                                     WHERE b.cluster = c.cluster AND b.node = c.node
                                       AND b.chunk_start = c.chunk_start AND b.job_id = c.job_id));
END
$$;
GRANT EXECUTE ON FUNCTION jobpulse.rank_bins_missing TO PUBLIC;

-- rank_series as in 0022, with the bins for steps of 5-20 s over at most an hour (a bin of 10 s
-- is taken from half its width, as gpu_series takes its 10 s roll-ups): binned to the step from
-- whole 10 s bins in both tiers, so a range returns the same before and after compaction. Chunks
-- compacted before this migration have no bins: over a range with one of them (compact process
-- rows of the job, no bins of the job in their chunk) the same bins are made from the samples.
CREATE OR REPLACE FUNCTION jobpulse.rank_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
                                                p_step_s integer DEFAULT 0)
RETURNS TABLE ("time" timestamptz, rank integer, cpu_percent float8, sm_util float8, source text)
LANGUAGE sql STABLE AS $$
SELECT date_bin(make_interval(secs => greatest(p_step_s, 1)), p.ts, timestamptz 'epoch'), p.rank,
       avg(p.cpu_percent::float8), avg(p.sm_util::float8), 'process_samples'
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
       avg(p.cpu_percent::float8), avg(p.sm_util::float8), 'process_samples 10 s bins'
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

-- The coarse (1,800 s) process buckets by job and time, for the coarse reader's question "which
-- half hours of this run have coarse rows" (process_rollup_between): without it each probe read
-- all of the job's coarse rows (86,000 for 64 ranks over a week, ~40 ms a panel) and the bucket
-- fetch used the primary key. Partial: ingest never writes width 1800, so it costs ingest nothing.
-- gpu_rollup has gpu_rollup_job_time (0011) for the same.
CREATE INDEX process_rollup_coarse_time ON jobpulse.process_rollup (cluster, job_id, bucket) WHERE width_s = 1800;
