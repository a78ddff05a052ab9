-- The pyramid's per-node rows: node_job_rollup summed over the jobs on each node, at each of its
-- levels (width_s 300, 3600, 21600), what the cluster heatmap and the node-health panels read when
-- they draw a series per node (collector/store/pyramid.py). On a busy cluster a node runs many jobs
-- in a bucket: 8,000 GPUs with short jobs held ~10,000 (job, node) rows per six-hour bucket for
-- 1,250 nodes, and a week of per-node panels read 290,000 rows to draw 1,250 series (0.2-0.25 s).
-- Placed like node_flags on Citus (by node, with the samples).
CREATE TABLE jobpulse.node_rollup (
    bucket        timestamptz NOT NULL,
    cluster       text        NOT NULL,
    node          text        NOT NULL,
    width_s       smallint    NOT NULL,
    gpus          integer     NOT NULL,  -- the node_job_rollup rows' gpus, summed over the jobs
    n             integer     NOT NULL,
    n_gpm         integer     NOT NULL,
    sum_sm_util   float8,
    sum_sm_active float8,
    n_hw_throttle integer     NOT NULL,
    n_loaded      integer     NOT NULL,
    n_pcie_low    integer     NOT NULL,
    inc_nvlink_crc_flit_errors bigint,
    inc_nvlink_crc_data_errors bigint,
    inc_nvlink_replay_errors   bigint,
    inc_nvlink_recovery_errors bigint,
    PRIMARY KEY (cluster, node, width_s, bucket)
) PARTITION BY RANGE (bucket);
CREATE INDEX node_rollup_time ON jobpulse.node_rollup (cluster, width_s, bucket);

-- A partition for every day node_job_rollup has one, filled from its rows.
DO $$
DECLARE day date;
BEGIN
    FOR day IN SELECT to_date(substring(c.relname from '_p(\d{8})$'), 'YYYYMMDD')
                 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                WHERE i.inhparent = 'jobpulse.node_job_rollup'::regclass AND c.relname ~ '_p\d{8}$' LOOP
        EXECUTE format('CREATE TABLE jobpulse.%I PARTITION OF jobpulse.node_rollup FOR VALUES FROM (%L) TO (%L)',
                       'node_rollup_p' || to_char(day, 'YYYYMMDD'), day || ' 00:00:00+00', (day + 1) || ' 00:00:00+00');
    END LOOP;
END
$$;
INSERT INTO jobpulse.node_rollup (bucket, cluster, node, width_s, gpus, n, n_gpm, sum_sm_util, sum_sm_active,
                                  n_hw_throttle, n_loaded, n_pcie_low, inc_nvlink_crc_flit_errors,
                                  inc_nvlink_crc_data_errors, inc_nvlink_replay_errors, inc_nvlink_recovery_errors)
SELECT bucket, cluster, node, width_s, sum(gpus), sum(n), sum(n_gpm), sum(sum_sm_util), sum(sum_sm_active),
       sum(n_hw_throttle), sum(n_loaded), sum(n_pcie_low), sum(inc_nvlink_crc_flit_errors),
       sum(inc_nvlink_crc_data_errors), sum(inc_nvlink_replay_errors), sum(inc_nvlink_recovery_errors)
  FROM jobpulse.node_job_rollup GROUP BY bucket, cluster, node, width_s;
