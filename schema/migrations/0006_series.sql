-- Series functions for Grafana and reports that stay under 200 ms for a 24 h job on 64 GPUs:
-- - gpu_series: at the finest step (<= 1 s) raw samples are returned as stored, with no
--   aggregation; coarser steps bin with date_bin (timestamp arithmetic, not numeric epochs).
--   The series functions return rows unordered: callers ORDER BY. A sort inside made the planner
--   aggregate by sorting (spilling to disk) instead of hashing: 2.5x slower for 64 GPUs x 15 min.
-- - process_rollup gains 300 s buckets and rank_series reads ranks like gpu_series reads GPUs.
-- - step_rollup (60 s, 300 s) holds step events' throughput; step_series reads it.

-- gpu_series(cluster, job, from, to, step_s) is generated from the field table and (re)created by
-- `jobpulse db upgrade` after the migrations (collector/store/series.py).

-- A rank's data-loader workers inherit its SLURM_PROCID: a rank's value is the mean over its
-- processes and the step. Raw samples up to 1 h, 60 s roll-ups up to 12 h, 300 s beyond.
CREATE FUNCTION jobpulse.rank_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
                                     p_step_s integer DEFAULT 0)
RETURNS TABLE ("time" timestamptz, rank integer, cpu_percent float8, sm_util float8, source text)
LANGUAGE sql STABLE AS $$
SELECT date_bin(make_interval(secs => greatest(p_step_s, 1)), p.ts, timestamptz 'epoch'), p.rank,
       avg(p.cpu_percent::float8), avg(p.sm_util::float8), 'process_samples'
  FROM jobpulse.process_samples p
 WHERE p_to - p_from <= interval '1 hour'
   AND p.job_id = p_job AND p.cluster = p_cluster AND p.ts BETWEEN p_from AND p_to AND p.rank IS NOT NULL
 GROUP BY 1, 2
UNION ALL
SELECT date_bin(make_interval(secs => greatest(p_step_s, r.width_s)), r.bucket, timestamptz 'epoch'), r.rank,
       sum(r.sum_cpu_percent) / nullif(sum(r.n_cpu), 0), sum(r.sum_sm_util) / nullif(sum(r.n_sm), 0),
       'process_rollup ' || min(r.width_s) || ' s'
  FROM jobpulse.process_rollup r
 WHERE p_to - p_from > interval '1 hour'
   AND r.width_s = CASE WHEN p_to - p_from <= interval '12 hours' THEN 60 ELSE 300 END
   AND r.cluster = p_cluster AND r.job_id = p_job AND r.rank IS NOT NULL
   AND r.bucket BETWEEN p_from - make_interval(secs => r.width_s) AND p_to
 GROUP BY 1, 2
$$;

-- 300 s process buckets from the 60 s ones already stored (sums, counts and maxima add up).
INSERT INTO jobpulse.process_rollup (width_s, bucket, cluster, job_id, node, pid, rank, local_rank, gpu_uuid,
                                     command, n, n_cpu, sum_cpu_percent, max_cpu_percent, n_sm, sum_sm_util,
                                     max_gpu_mem_mib, max_rss_mib)
SELECT 300, date_bin(interval '300 seconds', bucket, timestamptz 'epoch'), cluster, job_id, node, pid, max(rank),
       max(local_rank), max(gpu_uuid), max(command), sum(n), sum(n_cpu), sum(sum_cpu_percent), max(max_cpu_percent),
       sum(n_sm), sum(sum_sm_util), max(max_gpu_mem_mib), max(max_rss_mib)
  FROM jobpulse.process_rollup WHERE width_s = 60
 GROUP BY 2, 3, 4, 5, 6;

-- Numbers from an event's attrs, NULL when absent or not a number (what the job_steps view and
-- the step roll-up both read).
CREATE FUNCTION jobpulse.attr_number(attrs jsonb, key text) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN jsonb_typeof(attrs -> key) = 'number' THEN (attrs ->> key)::double precision END
$$;
CREATE FUNCTION jobpulse.attr_bigint(attrs jsonb, key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN (attrs ->> key) ~ '^-?[0-9]{1,18}$' THEN (attrs ->> key)::bigint END
$$;

CREATE OR REPLACE VIEW jobpulse.job_steps AS
SELECT e.ts, e.cluster, e.job_id, e.step, e.rank, e.node, e.pid,
       jobpulse.attr_bigint(e.attrs, 'step') AS step_number,
       jobpulse.attr_number(e.attrs, 'samples') AS samples,
       jobpulse.attr_number(e.attrs, 'samples_per_s') AS samples_per_s,
       e.attrs AS metrics
  FROM jobpulse.events e
 WHERE e.kind = 'step' AND e.job_id IS NOT NULL;

-- Step events per job and rank (-1: no rank) in 60 s and 300 s buckets, kept at ingest.
CREATE TABLE jobpulse.step_rollup (
    width_s           smallint    NOT NULL,
    bucket            timestamptz NOT NULL,
    cluster           text        NOT NULL,
    job_id            text        NOT NULL,
    rank              integer     NOT NULL,
    n                 integer     NOT NULL,
    n_rate            integer     NOT NULL,
    sum_samples_per_s float8,
    max_step_number   bigint,
    PRIMARY KEY (width_s, cluster, job_id, rank, bucket)
) PARTITION BY RANGE (bucket);

-- the new table gets a partition for every day events has one, then the steps already stored
DO $$
DECLARE
    day text;
BEGIN
    FOR day IN SELECT substring(c.relname FROM '_p(\d{8})$') FROM pg_inherits i
                 JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
                 JOIN pg_namespace n ON n.oid = p.relnamespace
                WHERE n.nspname = 'jobpulse' AND p.relname = 'events' AND c.relname ~ '_p\d{8}$'
    LOOP
        EXECUTE format('CREATE TABLE jobpulse.%I PARTITION OF jobpulse.step_rollup FOR VALUES FROM (%L) TO (%L)',
                       'step_rollup_p' || day, to_date(day, 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC',
                       (to_date(day, 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC');
    END LOOP;
END
$$;

INSERT INTO jobpulse.step_rollup (width_s, bucket, cluster, job_id, rank, n, n_rate, sum_samples_per_s,
                                  max_step_number)
SELECT w.width_s, date_bin(make_interval(secs => w.width_s), s.ts, timestamptz 'epoch'), s.cluster, s.job_id,
       coalesce(s.rank, -1), count(*), count(s.samples_per_s), sum(s.samples_per_s), max(s.step_number)
  FROM jobpulse.job_steps s CROSS JOIN (VALUES (60::smallint), (300::smallint)) AS w(width_s)
 GROUP BY 1, 2, 3, 4, 5;

-- Throughput (samples/s) per rank: raw step events up to 1 h, 60 s roll-ups up to 12 h, 300 s beyond.
CREATE FUNCTION jobpulse.step_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
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

DO $$
BEGIN
    GRANT SELECT ON jobpulse.step_rollup, jobpulse.job_steps TO jobpulse_reader;
EXCEPTION WHEN undefined_object THEN
    RAISE NOTICE 'role jobpulse_reader does not exist: grant SELECT on the new table yourself';
END
$$;
GRANT EXECUTE ON FUNCTION jobpulse.rank_series, jobpulse.step_series, jobpulse.attr_number, jobpulse.attr_bigint
    TO PUBLIC;
