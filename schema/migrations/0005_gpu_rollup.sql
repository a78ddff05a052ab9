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

-- One job's GPU metrics over [from, to] in steps of step_s seconds, read from the finest source
-- that stays fast: raw samples up to 1 h, 10 s roll-ups up to 12 h, 300 s roll-ups beyond.
-- What Grafana panels and `jobpulse report` call; `source` says which table answered. A plain SQL
-- function, so the planner inlines it: the range test is a constant that prunes two branches, and
-- a caller's WHERE (node, GPU) is pushed into the scan.
CREATE FUNCTION jobpulse.gpu_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
                                    p_step_s integer DEFAULT 0)
RETURNS TABLE ("time" timestamptz, node text, gpu_uuid text, gpu_index smallint, sm_util float8,
               sm_active float8, tensor_active float8, mem_util float8, fb_used_mib float8,
               fb_total_mib integer, power_w float8, power_limit_w real, gpu_temp_c float8,
               sm_clock_mhz float8, pcie_rx_kbs float8, pcie_tx_kbs float8, nvlink_rx_kbs float8,
               nvlink_tx_kbs float8, source text)
LANGUAGE sql STABLE AS $$
SELECT to_timestamp(floor(extract(epoch FROM s.ts) / greatest(p_step_s, 1)) * greatest(p_step_s, 1)), s.node,
       s.gpu_uuid, min(s.gpu_index), avg(s.sm_util)::float8, avg(s.gpm_sm_active)::float8,
       avg(s.gpm_tensor_active)::float8, avg(s.mem_util)::float8, avg(s.fb_used_mib)::float8, max(s.fb_total_mib),
       avg(s.power_w)::float8, max(s.power_limit_w), avg(s.gpu_temp_c)::float8, avg(s.sm_clock_mhz)::float8,
       avg(s.pcie_rx_kbs)::float8, avg(s.pcie_tx_kbs)::float8, avg(s.nvlink_rx_kbs)::float8,
       avg(s.nvlink_tx_kbs)::float8, 'gpu_samples'::text
  FROM jobpulse.gpu_samples s
 WHERE p_to - p_from <= interval '1 hour'
   AND s.job_id = p_job AND s.cluster = p_cluster AND s.ts BETWEEN p_from AND p_to
 GROUP BY 1, 2, 3
UNION ALL
SELECT to_timestamp(floor(extract(epoch FROM r.bucket) / greatest(p_step_s, r.width_s))
                    * greatest(p_step_s, r.width_s)), r.node, r.gpu_uuid,
       min(r.gpu_index), sum(r.sum_sm_util) / sum(r.n), sum(r.sum_sm_active) / nullif(sum(r.n_gpm), 0),
       sum(r.sum_tensor_active) / nullif(sum(r.n_gpm), 0), sum(r.sum_mem_util) / sum(r.n),
       sum(r.sum_fb_used_mib) / sum(r.n), max(r.fb_total_mib), sum(r.sum_power_w) / sum(r.n),
       max(r.power_limit_w), sum(r.sum_gpu_temp_c) / sum(r.n), sum(r.sum_sm_clock_mhz) / sum(r.n),
       sum(r.sum_pcie_rx_kbs) / sum(r.n), sum(r.sum_pcie_tx_kbs) / sum(r.n),
       sum(r.sum_nvlink_rx_kbs) / sum(r.n), sum(r.sum_nvlink_tx_kbs) / sum(r.n),
       'gpu_rollup ' || min(r.width_s) || ' s'
  FROM jobpulse.gpu_rollup r
 WHERE p_to - p_from > interval '1 hour'
   AND r.width_s = CASE WHEN p_to - p_from <= interval '12 hours' THEN 10 ELSE 300 END
   AND r.cluster = p_cluster AND r.job_id = p_job
   AND r.bucket BETWEEN p_from - make_interval(secs => r.width_s) AND p_to
 GROUP BY 1, 2, 3
 ORDER BY 1, 2, 4
$$;
GRANT EXECUTE ON FUNCTION jobpulse.gpu_series TO PUBLIC;

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
