-- The cluster dashboards' pyramid (collector/store/pyramid.py): the 300 s GPU roll-ups summed per
-- (job, node, bucket), kept by the leader every minute, so that a panel over the whole cluster reads
-- one row per job and node instead of one per GPU (8,000 GPUs: ~1,100 rows per bucket instead of
-- 8,000). Only the columns the cluster panels read: sums add, so a panel aggregating these rows gets
-- the numbers it got from gpu_rollup. wasted_s is the GPU-seconds allocated but not busy (a MIG
-- slice or MPS job counted as its share of the GPU), worked out per GPU when the row is built.
-- Keyed by job like gpu_rollup (Citus: distributed by job_id, co-located with jobs and gpu_rollup,
-- so the build from gpu_rollup and the panels' joins with jobs run on each shard whole).
CREATE TABLE jobpulse.node_job_rollup (
    bucket        timestamptz NOT NULL,  -- 300 s buckets (gpu_rollup width_s = 300)
    cluster       text        NOT NULL,
    job_id        text        NOT NULL,  -- '' = no job
    node          text        NOT NULL,
    gpus          integer     NOT NULL,  -- GPUs (MIG slices) with samples in the bucket
    n             integer     NOT NULL,
    n_gpm         integer     NOT NULL,
    sum_sm_util   float8,
    sum_sm_active float8,
    n_hw_throttle integer     NOT NULL,
    n_loaded      integer     NOT NULL,
    n_pcie_low    integer     NOT NULL,
    wasted_s      float8      NOT NULL,
    PRIMARY KEY (cluster, job_id, node, bucket)
) PARTITION BY RANGE (bucket);
CREATE INDEX node_job_rollup_time ON jobpulse.node_job_rollup (cluster, bucket);

-- Its rows summed over nodes: one row per job and bucket (~900 per bucket at 8,000 GPUs), what
-- the wasted GPU-hours panel reads.
CREATE TABLE jobpulse.job_bucket_rollup (
    bucket   timestamptz NOT NULL,  -- 300 s
    cluster  text        NOT NULL,
    job_id   text        NOT NULL,
    gpus     integer     NOT NULL,
    wasted_s float8      NOT NULL,
    PRIMARY KEY (cluster, job_id, bucket)
) PARTITION BY RANGE (bucket);
CREATE INDEX job_bucket_rollup_time ON jobpulse.job_bucket_rollup (cluster, bucket);

-- A partition for every day gpu_rollup has one (ingest writes only days every table has).
DO $$
DECLARE day date; t text;
BEGIN
    FOR day IN SELECT to_date(substring(c.relname from '_p(\d{8})$'), 'YYYYMMDD')
                 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'jobpulse.gpu_rollup'::regclass AND c.relname ~ '_p\d{8}$' LOOP
        FOREACH t IN ARRAY ARRAY['node_job_rollup', 'job_bucket_rollup'] LOOP
            EXECUTE format('CREATE TABLE jobpulse.%I PARTITION OF jobpulse.%I FOR VALUES FROM (%L) TO (%L)',
                           t || '_p' || to_char(day, 'YYYYMMDD'), t, day || ' 00:00:00+00', (day + 1) || ' 00:00:00+00');
        END LOOP;
    END LOOP;
END
$$;

-- How far the pyramid is built (one row; the leader's, like leader_tasks: local on Citus).
CREATE TABLE jobpulse.pyramid_progress (
    one      boolean     PRIMARY KEY DEFAULT true CHECK (one),
    built_to timestamptz NOT NULL
);
