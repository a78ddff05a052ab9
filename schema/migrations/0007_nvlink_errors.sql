-- NVLink error counters per GPU, summed over its links (NVML's *_COUNT_TOTAL field values), as
-- dcgm-exporter exposes them. Roll-ups keep each counter's min and max per bucket: the increase
-- over a range is max - min. Declared in schema/fields.py.
ALTER TABLE jobpulse.gpu_samples
    ADD COLUMN nvlink_crc_flit_errors bigint,
    ADD COLUMN nvlink_crc_data_errors bigint,
    ADD COLUMN nvlink_replay_errors   bigint,
    ADD COLUMN nvlink_recovery_errors bigint;

ALTER TABLE jobpulse.gpu_rollup
    ADD COLUMN min_nvlink_crc_flit_errors bigint,
    ADD COLUMN max_nvlink_crc_flit_errors bigint,
    ADD COLUMN min_nvlink_crc_data_errors bigint,
    ADD COLUMN max_nvlink_crc_data_errors bigint,
    ADD COLUMN min_nvlink_replay_errors   bigint,
    ADD COLUMN max_nvlink_replay_errors   bigint,
    ADD COLUMN min_nvlink_recovery_errors bigint,
    ADD COLUMN max_nvlink_recovery_errors bigint;
