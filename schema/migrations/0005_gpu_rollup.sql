-- Roll-ups of gpu_samples, kept by the collector as each batch is stored (same transaction), so
-- rules over 20-minute windows and Grafana panels over days read a few rows per GPU instead of
-- one per second. Two widths: 10 s (rules, ranges of hours) and 300 s (ranges of days).
-- "act" is the activity the rules judge: GPM SM activity when measured, else the duty cycle.
-- Sums divide by n (gpm sums by n_gpm) for means; a GPU is idle at act <= 2 %, busy at >= 50 %.
CREATE TABLE jobpulse.gpu_rollup (
    width_s           smallint    NOT NULL,
    bucket            timestamptz NOT NULL,
    cluster           text        NOT NULL,
    job_id            text        NOT NULL,  -- '' = no job
    node              text        NOT NULL,
    gpu_uuid          text        NOT NULL,
    gpu_index         smallint    NOT NULL,
    n                 integer     NOT NULL,
    first_ts          timestamptz NOT NULL,
    last_ts           timestamptz NOT NULL,
    last_act          real,
    last_fb_used_mib  integer,
    last_busy_ts      timestamptz,           -- last sample with act > 2 %
    n_idle            integer     NOT NULL,
    n_busy            integer     NOT NULL,
    sum_sm_util       float8,
    max_sm_util       smallint,
    sum_mem_util      float8,
    n_gpm             integer     NOT NULL,
    sum_sm_active     float8,
    sum_sm_occupancy  float8,
    sum_tensor_active float8,
    max_tensor_active real,
    sum_dram_bw       float8,
    sum_fb_used_mib   float8,
    max_fb_used_mib   integer,
    fb_total_mib      integer,
    sum_power_w       float8,
    max_power_w       real,
    power_limit_w     real,
    sum_gpu_temp_c    float8,
    max_gpu_temp_c    smallint,
    max_mem_temp_c    smallint,
    sum_sm_clock_mhz  float8,
    sm_clock_max_mhz  smallint,
    sum_pcie_rx_kbs   float8,
    sum_pcie_tx_kbs   float8,
    sum_nvlink_rx_kbs float8,
    sum_nvlink_tx_kbs float8,
    n_hw_throttle     integer     NOT NULL,  -- HW slowdown, HW thermal, HW power brake
    n_loaded          integer     NOT NULL,  -- sm_util >= 50 with a known max PCIe link
    n_pcie_low        integer     NOT NULL,  -- of those, link below max gen or width
    pcie_link_low     text,                  -- e.g. 3x8/4x16 (current / max)
    PRIMARY KEY (width_s, cluster, job_id, node, gpu_uuid, bucket)
) PARTITION BY RANGE (bucket);
CREATE INDEX gpu_rollup_time ON jobpulse.gpu_rollup (width_s, bucket);

-- gpu_series(cluster, job, from, to, step_s) is generated from the field table and (re)created by
-- `jobpulse db upgrade` after the migrations (collector/store/series.py).

-- The CPU each process last ran on (/proc/PID/stat "processor"): is a rank near its GPU?
ALTER TABLE jobpulse.process_samples ADD COLUMN cpu integer;

-- Per-process roll-up (60 s): CPU and GPU share of each rank over long ranges (Grafana, reports).
CREATE TABLE jobpulse.process_rollup (
    width_s         smallint    NOT NULL,
    bucket          timestamptz NOT NULL,
    cluster         text        NOT NULL,
    job_id          text        NOT NULL,
    node            text        NOT NULL,
    pid             integer     NOT NULL,
    rank            integer,
    local_rank      integer,
    gpu_uuid        text,
    command         text,
    n               integer     NOT NULL,
    n_cpu           integer     NOT NULL,
    sum_cpu_percent float8,
    max_cpu_percent real,
    n_sm            integer     NOT NULL,
    sum_sm_util     float8,
    max_gpu_mem_mib integer,
    max_rss_mib     integer,
    PRIMARY KEY (width_s, cluster, job_id, node, pid, bucket)
) PARTITION BY RANGE (bucket);
