-- Work that must run once across several collectors on one database (rule cycles, partition
-- maintenance) runs on the leader, the collector holding an advisory lock. Each task's last start
-- is kept here: a collector that takes over continues the schedule instead of starting it again.
CREATE TABLE jobpulse.leader_tasks (
    task   text        PRIMARY KEY,
    ran_at timestamptz NOT NULL,
    holder text        NOT NULL  -- host:pid of the collector that ran it
);
