-- jobpulse schema version 1: the public SQL interface (see DESIGN.md).
-- Time-series tables are range-partitioned by day on their time column; the collector creates
-- partitions ahead and drops expired ones (retention), never deleting rows one by one.
-- Column names of gpu_samples, process_samples, gpu_health_events, events and topology are the
-- field names of the wire format records (schema/wire.py), in order after cluster and node.

CREATE SCHEMA IF NOT EXISTS jobpulse;

-- One row per job. Multi-node jobs are one row; array tasks (123_4) and het components (123+1)
-- keep their own ids. end_time IS NULL means the job is running (or its end was never seen).
CREATE TABLE jobpulse.jobs (
    cluster      text        NOT NULL,
    job_id       text        NOT NULL,
    user_name    text,
    uid          integer,
    account      text,
    partition    text,
    job_name     text,
    nodes        text[],
    gpus_total   integer,
    time_limit_s bigint,
    submit_time  timestamptz,
    start_time   timestamptz,
    end_time     timestamptz,
    state        text,
    exit_code    integer,
    tags         jsonb       NOT NULL DEFAULT '{}',
    first_seen   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, job_id)
);
CREATE INDEX jobs_running ON jobpulse.jobs (cluster, start_time) WHERE end_time IS NULL;
CREATE INDEX jobs_user ON jobpulse.jobs (user_name, start_time DESC);
CREATE INDEX jobs_start ON jobpulse.jobs (start_time DESC);

-- Which GPU (NVML UUID) of which node served which job. gpu_index and pci_bus_id are attributes.
CREATE TABLE jobpulse.job_gpus (
    cluster    text        NOT NULL,
    job_id     text        NOT NULL,
    node       text        NOT NULL,
    gpu_uuid   text        NOT NULL,
    gpu_index  smallint,
    pci_bus_id text,
    first_seen timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, job_id, node, gpu_uuid),
    FOREIGN KEY (cluster, job_id) REFERENCES jobpulse.jobs ON DELETE CASCADE
);
CREATE INDEX job_gpus_gpu ON jobpulse.job_gpus (node, gpu_uuid);

-- One row per GPU per sample time: nvidia-smi dmon fields + GPM (NULL where unsupported).
-- Units are in the column names: _util/_active percent, _w watts, _mj millijoules, _c Celsius,
-- _mhz MHz, _mib MiB, _kbs KB/s.
CREATE TABLE jobpulse.gpu_samples (
    cluster                text        NOT NULL,
    node                   text        NOT NULL,
    ts                     timestamptz NOT NULL,
    gpu_uuid               text        NOT NULL,
    gpu_index              smallint    NOT NULL,
    job_id                 text,
    sm_util                smallint,
    mem_util               smallint,
    enc_util               smallint,
    dec_util               smallint,
    jpg_util               smallint,
    ofa_util               smallint,
    power_w                real,
    power_limit_w          real,
    energy_mj              bigint,
    gpu_temp_c             smallint,
    mem_temp_c             smallint,
    sm_clock_mhz           smallint,
    mem_clock_mhz          smallint,
    sm_clock_max_mhz       smallint,
    mem_clock_max_mhz      smallint,
    fb_used_mib            integer,
    fb_total_mib           integer,
    pcie_rx_kbs            integer,
    pcie_tx_kbs            integer,
    pcie_gen               smallint,
    pcie_width             smallint,
    pcie_gen_max           smallint,
    pcie_width_max         smallint,
    pcie_replay            bigint,
    nvlink_rx_kbs          bigint,
    nvlink_tx_kbs          bigint,
    clock_event_reasons    bigint,
    ecc_sbe_total          bigint,
    ecc_dbe_total          bigint,
    remapped_correctable   integer,
    remapped_uncorrectable integer,
    remap_pending          boolean,
    remap_failure          boolean,
    gpm_sm_active          real,
    gpm_sm_occupancy       real,
    gpm_tensor_active      real,
    gpm_dram_bw            real,
    gpm_fp16_active        real,
    gpm_fp32_active        real,
    gpm_fp64_active        real
) PARTITION BY RANGE (ts);
-- "one GPU over time" (each time-series table's "one job over its lifetime" index follows them)
CREATE INDEX gpu_samples_gpu ON jobpulse.gpu_samples (node, gpu_uuid, ts);

-- Per process per sample: attributed by the agent from /proc (cgroup + Slurm environment).
CREATE TABLE jobpulse.process_samples (
    cluster     text        NOT NULL,
    node        text        NOT NULL,
    ts          timestamptz NOT NULL,
    pid         integer     NOT NULL,
    gpu_uuid    text,
    job_id      text,
    step        text,
    rank        integer,
    local_rank  integer,
    gpu_mem_mib integer,
    sm_util     smallint,
    mem_util    smallint,
    cpu_percent real,
    rss_mib     integer,
    command     text
) PARTITION BY RANGE (ts);

-- Hardware events: XID, ECC, throttling, link changes, GPU lost.
CREATE TABLE jobpulse.gpu_health_events (
    cluster  text        NOT NULL,
    node     text        NOT NULL,
    ts       timestamptz NOT NULL,
    kind     text        NOT NULL,
    gpu_uuid text,
    job_id   text,
    code     bigint,
    message  text,
    attrs    jsonb       NOT NULL DEFAULT '{}'
) PARTITION BY RANGE (ts);
CREATE INDEX gpu_health_events_node ON jobpulse.gpu_health_events (node, ts);

-- Application events from inside jobs (logs, phases, steps). job_id NULL = node-level.
CREATE TABLE jobpulse.events (
    cluster    text        NOT NULL,
    node       text        NOT NULL,
    ts         timestamptz NOT NULL,
    pid        integer     NOT NULL,
    level      text        NOT NULL,
    kind       text        NOT NULL,
    uid        integer,
    job_id     text,
    step       text,
    rank       integer,
    local_rank integer,
    name       text,
    message    text        NOT NULL,
    attrs      jsonb       NOT NULL DEFAULT '{}'
) PARTITION BY RANGE (ts);

-- One job's rows over its lifetime, in every time-series table.
CREATE INDEX gpu_samples_job ON jobpulse.gpu_samples (job_id, ts) WHERE job_id IS NOT NULL;
CREATE INDEX process_samples_job ON jobpulse.process_samples (job_id, ts) WHERE job_id IS NOT NULL;
CREATE INDEX gpu_health_events_job ON jobpulse.gpu_health_events (job_id, ts) WHERE job_id IS NOT NULL;
CREATE INDEX events_job ON jobpulse.events (job_id, ts) WHERE job_id IS NOT NULL;

-- Topology snapshots (taken at agent start): one row per GPU per snapshot; links/p2p map
-- peer GPU UUID -> what `nvidia-smi topo -m` prints (NV#, PIX, PXB, PHB, NODE, SYS).
CREATE TABLE jobpulse.topology (
    cluster        text        NOT NULL,
    node           text        NOT NULL,
    ts             timestamptz NOT NULL,
    gpu_uuid       text        NOT NULL,
    gpu_index      smallint    NOT NULL,
    pci_bus_id     text,
    model          text,
    driver_version text,
    cuda_version   text,
    numa_node      smallint,
    cpu_affinity   text,
    pcie_gen_max   smallint,
    pcie_width_max smallint,
    nvlinks_up     smallint,
    mig_mode       boolean,
    links          jsonb       NOT NULL DEFAULT '{}',
    p2p            jsonb       NOT NULL DEFAULT '{}',
    PRIMARY KEY (cluster, node, gpu_uuid, ts)
);
CREATE VIEW jobpulse.topology_current AS
    SELECT DISTINCT ON (cluster, node, gpu_uuid) *
    FROM jobpulse.topology
    ORDER BY cluster, node, gpu_uuid, ts DESC;

-- Rule hits (written by the rules engine). A flag that stops holding gets ended_at.
CREATE TABLE jobpulse.job_flags (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    cluster    text        NOT NULL,
    job_id     text        NOT NULL,
    rule_id    text        NOT NULL,
    severity   text        NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
    category   text        NOT NULL DEFAULT 'code' CHECK (category IN ('code', 'hardware')),
    scope      text        NOT NULL CHECK (scope IN ('job', 'node', 'gpu', 'rank')),
    scope_key  text        NOT NULL DEFAULT '',
    started_at timestamptz NOT NULL,
    ended_at   timestamptz,
    last_seen  timestamptz NOT NULL,
    evidence   jsonb       NOT NULL DEFAULT '{}',
    advice     text        NOT NULL DEFAULT '',
    FOREIGN KEY (cluster, job_id) REFERENCES jobpulse.jobs ON DELETE CASCADE
);
CREATE INDEX job_flags_job ON jobpulse.job_flags (cluster, job_id);
CREATE UNIQUE INDEX job_flags_open ON jobpulse.job_flags (cluster, job_id, rule_id, scope, scope_key)
    WHERE ended_at IS NULL;

-- Ingest ledger: one row per stored batch; (agent_instance, seq) deduplicates replays. A
-- replayed batch keeps its created_at, so the partition key is part of the batch identity.
CREATE TABLE jobpulse.ingest_batches (
    agent_instance    text        NOT NULL,
    seq               bigint      NOT NULL,
    created_at        timestamptz NOT NULL,
    cluster           text        NOT NULL,
    node              text        NOT NULL,
    agent_version     text        NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    rows              jsonb       NOT NULL,
    dropped           jsonb       NOT NULL,
    PRIMARY KEY (agent_instance, seq, created_at)
) PARTITION BY RANGE (created_at);

-- Read-only role for Grafana and admins' own SQL. Needs CREATEROLE; without it, the
-- migration goes on and the role is left to the admin (see README).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobpulse_reader') THEN
        CREATE ROLE jobpulse_reader NOLOGIN;
    END IF;
    GRANT USAGE ON SCHEMA jobpulse TO jobpulse_reader;
    GRANT SELECT ON ALL TABLES IN SCHEMA jobpulse TO jobpulse_reader;
    ALTER DEFAULT PRIVILEGES IN SCHEMA jobpulse GRANT SELECT ON TABLES TO jobpulse_reader;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'jobpulse_reader not created (no CREATEROLE): grant SELECT on schema jobpulse yourself';
END
$$;
