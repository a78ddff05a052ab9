-- A flag's evidence is of two kinds: the rank's Python stacks (sampled by the node's agent), and a short
-- profiler trace the job's own in-job client takes when the job allowed it. One of each per flag. The trace
-- itself (gzip, at most max_bytes) has a retention of its own and is dropped first; its summary (result)
-- stays with the flag.
ALTER TABLE jobpulse.flag_captures
    ADD COLUMN kind text NOT NULL DEFAULT 'stacks' CHECK (kind IN ('stacks', 'trace')),
    ADD COLUMN steps integer NOT NULL DEFAULT 0,
    ADD COLUMN max_bytes integer NOT NULL DEFAULT 0,
    ADD COLUMN trace bytea,
    ADD COLUMN trace_bytes integer;
ALTER TABLE jobpulse.flag_captures DROP CONSTRAINT flag_captures_flag_id_key;
ALTER TABLE jobpulse.flag_captures ADD CONSTRAINT flag_captures_flag_kind UNIQUE (flag_id, kind);
