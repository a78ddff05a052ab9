-- Hardware flags of GPUs no job holds (an XID, ECC errors or a lost GPU on an idle node): admins
-- must hear of them before a job lands there. Same lifecycle as job_flags: a flag that stops
-- holding gets ended_at.
CREATE TABLE jobpulse.node_flags (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    cluster    text        NOT NULL,
    node       text        NOT NULL,
    rule_id    text        NOT NULL,
    severity   text        NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
    category   text        NOT NULL DEFAULT 'hardware' CHECK (category IN ('code', 'hardware')),
    scope_key  text        NOT NULL DEFAULT '',
    started_at timestamptz NOT NULL,
    opened_at  timestamptz NOT NULL DEFAULT now(),
    last_seen  timestamptz NOT NULL,
    ended_at   timestamptz,
    evidence   jsonb       NOT NULL DEFAULT '{}',
    advice     text        NOT NULL DEFAULT ''
);
CREATE INDEX node_flags_node ON jobpulse.node_flags (cluster, node, opened_at);
CREATE UNIQUE INDEX node_flags_open ON jobpulse.node_flags (cluster, node, rule_id, scope_key) WHERE ended_at IS NULL;

