-- Time the GPU's clocks were held down to stay within its power limit, since driver load (NVML's
-- NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP, nanoseconds; dcgm-exporter's
-- DCGM_FI_DEV_POWER_VIOLATION): a job whose GPUs spend their time power-capped runs slower than its
-- utilization says. Roll-ups keep the counter's min and max per bucket (its increase is max - min);
-- the compact tier and the pyramid's inc_ column follow from the field table (`db upgrade`).
ALTER TABLE jobpulse.gpu_samples ADD COLUMN power_cap_throttle_ns bigint;

ALTER TABLE jobpulse.gpu_rollup
    ADD COLUMN min_power_cap_throttle_ns bigint,
    ADD COLUMN max_power_cap_throttle_ns bigint;
