-- The node-health counter panels (NVLink errors) over many nodes read the pyramid, not a row per
-- GPU (8,000 GPUs: 0.4-2.3 s a query): per (job, node, 300 s bucket) the increase of each counter,
-- summed over the GPUs. A GPU's increase in a bucket is its largest value there less its largest in
-- its bucket before (within the bucket, for its first), so that bucket after bucket they add up to
-- what the counter rose, increments between buckets included (collector/store/pyramid.py).
ALTER TABLE jobpulse.node_job_rollup
    ADD COLUMN inc_nvlink_crc_flit_errors bigint,
    ADD COLUMN inc_nvlink_crc_data_errors bigint,
    ADD COLUMN inc_nvlink_replay_errors bigint,
    ADD COLUMN inc_nvlink_recovery_errors bigint;
