-- The compact tier: samples older than the hot window (48 h by default) are packed into one row per
-- (GPU, job, hour) and per (job, PID, hour) by `jobpulse db compact` (collector/store/compact.py).
-- Only the key columns are declared here: each sampled field gets its packed columns from the field
-- table (schema/fields.py) when `jobpulse db upgrade` runs, with the functions that unpack them
-- (gpu_samples_between, process_samples_between) and the views over both tiers (gpu_samples_all,
-- process_samples_all). A sample is in exactly one tier at any time: compaction moves a chunk in
-- one transaction. Retention drops daily partitions of chunk_start, as for the raw tables.
CREATE TABLE jobpulse.gpu_samples_compact (
    cluster     text        NOT NULL,
    node        text        NOT NULL,
    gpu_uuid    text        NOT NULL,
    job_id      text,
    chunk_start timestamptz NOT NULL,
    n           integer     NOT NULL
) PARTITION BY RANGE (chunk_start);
CREATE UNIQUE INDEX gpu_samples_compact_key
    ON jobpulse.gpu_samples_compact (cluster, node, chunk_start, gpu_uuid, job_id) NULLS NOT DISTINCT;
CREATE INDEX gpu_samples_compact_job ON jobpulse.gpu_samples_compact (job_id, chunk_start) WHERE job_id IS NOT NULL;

CREATE TABLE jobpulse.process_samples_compact (
    cluster     text        NOT NULL,
    node        text        NOT NULL,
    job_id      text,
    pid         integer     NOT NULL,
    chunk_start timestamptz NOT NULL,
    n           integer     NOT NULL
) PARTITION BY RANGE (chunk_start);
CREATE UNIQUE INDEX process_samples_compact_key
    ON jobpulse.process_samples_compact (cluster, node, chunk_start, job_id, pid) NULLS NOT DISTINCT;
CREATE INDEX process_samples_compact_job ON jobpulse.process_samples_compact (job_id, chunk_start)
    WHERE job_id IS NOT NULL;

-- the new tables get a partition for every day gpu_samples has one
DO $$
DECLARE
    day text;
    tbl text;
BEGIN
    FOR day IN SELECT substring(c.relname FROM '_p(\d{8})$') FROM pg_inherits i
                 JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
                 JOIN pg_namespace n ON n.oid = p.relnamespace
                WHERE n.nspname = 'jobpulse' AND p.relname = 'gpu_samples' AND c.relname ~ '_p\d{8}$'
    LOOP
        FOREACH tbl IN ARRAY ARRAY['gpu_samples_compact', 'process_samples_compact'] LOOP
            EXECUTE format('CREATE TABLE jobpulse.%I PARTITION OF jobpulse.%I FOR VALUES FROM (%L) TO (%L)',
                           tbl || '_p' || day, tbl, to_date(day, 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC',
                           (to_date(day, 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC');
        END LOOP;
    END LOOP;
END
$$;

-- rank_series reads raw and compact process samples alike (process_samples_between is made by
-- `jobpulse db upgrade` right after the migrations, from the field table).
SET LOCAL check_function_bodies = off;
CREATE OR REPLACE FUNCTION jobpulse.rank_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
                                                p_step_s integer DEFAULT 0)
RETURNS TABLE ("time" timestamptz, rank integer, cpu_percent float8, sm_util float8, source text)
LANGUAGE sql STABLE AS $$
SELECT date_bin(make_interval(secs => greatest(p_step_s, 1)), p.ts, timestamptz 'epoch'), p.rank,
       avg(p.cpu_percent::float8), avg(p.sm_util::float8), 'process_samples'
  FROM jobpulse.process_samples_between(p_from, p_to) p
 WHERE p_to - p_from <= interval '1 hour'
   AND p.job_id = p_job AND p.cluster = p_cluster AND p.rank IS NOT NULL
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
