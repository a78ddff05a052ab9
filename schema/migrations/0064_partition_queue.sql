-- What waits in each Slurm partition, as slurm-sync reads it from the controller once a poll
-- (agent/slurm/queue.py): the jobs waiting to start (pending, not held), of them those asking for
-- GPUs, and the GPUs they ask over all their nodes. source says what counted jobs_pending:
-- slurmctld's OpenMetrics (Slurm 25.11+) or squeue's JSON; the GPU figures are squeue's in both.
-- node is the sync's host. Written only with a controller's token (collector/ingest/authority.py).
-- Daily partitions, plain retention; the latest fresh reading per partition is the view
-- partition_queue_now.
CREATE TABLE jobpulse.partition_queue (
    cluster          text        NOT NULL,
    node             text        NOT NULL,
    ts               timestamptz NOT NULL,
    partition        text        NOT NULL,
    jobs_pending     integer     NOT NULL,
    gpu_jobs_pending integer     NOT NULL,
    gpus_pending     integer     NOT NULL,
    source           text        NOT NULL
) PARTITION BY RANGE (ts);
CREATE INDEX partition_queue_partition ON jobpulse.partition_queue (cluster, partition, ts);
