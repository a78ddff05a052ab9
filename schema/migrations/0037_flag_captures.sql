-- Evidence asked of the job for a flag: the Python stacks of the flagged rank's processes, sampled
-- on its node for a few seconds (agent/capture.py). One capture per flag at most (the unique key);
-- the rule cycle asks (pending), the collector hands it to the node's agent with its answer to a
-- batch (sent), and the agent's next batch carries the result (done, or failed with the reason).
-- A coordinator table on Citus, like the notifications outbox.
CREATE TABLE jobpulse.flag_captures (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    flag_id      bigint      NOT NULL UNIQUE,
    cluster      text        NOT NULL,
    job_id       text        NOT NULL,
    node         text        NOT NULL,
    rule_id      text        NOT NULL,
    pids         integer[]   NOT NULL,
    seconds      real        NOT NULL,
    state        text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'done', 'failed')),
    requested_at timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz,
    done_at      timestamptz,
    result       jsonb,
    reason       text
);
CREATE INDEX flag_captures_pending ON jobpulse.flag_captures (cluster, node) WHERE state = 'pending';
CREATE INDEX flag_captures_job ON jobpulse.flag_captures (cluster, job_id);
