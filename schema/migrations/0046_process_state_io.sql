-- What a job's process is doing when sampled, read by the agent from /proc each tick: the kernel's
-- state letter (R, S, D, T stopped: a suspended job's tasks, Z, ...) and its read and write rates
-- through system calls (rchar/wchar deltas of /proc/PID/io, so a rank writing a checkpoint to a
-- network file system counts), NULL where unreadable; the most per roll-up bucket. Declared in
-- schema/fields.py.
ALTER TABLE jobpulse.process_samples ADD COLUMN state text, ADD COLUMN io_read_bps bigint,
    ADD COLUMN io_write_bps bigint;
ALTER TABLE jobpulse.process_rollup ADD COLUMN max_io_read_bps bigint, ADD COLUMN max_io_write_bps bigint;
