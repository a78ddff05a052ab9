-- What the idle-GPU policy did to a job, with its evidence: a warning, a cancellation (or, dry-run,
-- the one it would have made), an exemption, or holding back because the idleness is a hardware
-- flag's (the node's fault). One row per job and action: the audit the report and dashboard show.
CREATE TABLE jobpulse.policy_actions (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    cluster  text        NOT NULL,
    job_id   text        NOT NULL,
    action   text        NOT NULL CHECK (action IN ('warned', 'cancelled', 'would_cancel', 'exempt', 'held_hardware',
                                                    'failed')),
    flag_id  bigint,
    reason   text        NOT NULL,
    evidence jsonb       NOT NULL DEFAULT '{}',
    at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (cluster, job_id, action)
);
