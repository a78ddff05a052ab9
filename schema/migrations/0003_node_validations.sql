-- Results of `jobpulse-agent validate`: one row per check (per GPU where gpu_uuid is set) per
-- run. Small and rare, so a plain table; `jobpulse validate report` and a Grafana panel read the
-- latest run of every node.
CREATE TABLE jobpulse.node_validations (
    cluster  text        NOT NULL,
    node     text        NOT NULL,
    ts       timestamptz NOT NULL,
    "check"  text        NOT NULL,
    status   text        NOT NULL CHECK (status IN ('pass', 'warn', 'fail')),
    observed text        NOT NULL,
    expected text        NOT NULL,
    message  text        NOT NULL DEFAULT '',
    gpu_uuid text
);
CREATE INDEX node_validations_node ON jobpulse.node_validations (cluster, node, ts DESC);

-- The latest run of each node.
CREATE VIEW jobpulse.node_validations_latest AS
SELECT v.* FROM jobpulse.node_validations v
  JOIN (SELECT cluster, node, max(ts) AS ts FROM jobpulse.node_validations GROUP BY 1, 2) last
    USING (cluster, node, ts);

DO $$
BEGIN
    GRANT SELECT ON jobpulse.node_validations, jobpulse.node_validations_latest TO jobpulse_reader;
EXCEPTION WHEN undefined_object THEN
    RAISE NOTICE 'role jobpulse_reader does not exist: grant SELECT on the new tables yourself';
END
$$;
