-- Hours of the pyramid that batches later than its relook wrote to (an agent's spool replayed after
-- a collector outage, `jobpulse import`): the ingest marks them, the leader's next pyramid run
-- rebuilds them and deletes the marks, instead of leaving the cluster panels short until compaction
-- reaches the hour two days later. One row per hour and database session, so two collectors'
-- groups never wait on each other's mark (local on Citus, like pyramid_progress).
CREATE TABLE jobpulse.pyramid_late (
    hour      timestamptz NOT NULL,
    backend   integer     NOT NULL,
    marked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (hour, backend)
);
