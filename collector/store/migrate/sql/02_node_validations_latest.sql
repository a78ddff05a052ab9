-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE VIEW jobpulse.node_validations_latest AS
SELECT v.* FROM jobpulse.node_validations v
  JOIN (SELECT cluster, node, max(ts) AS ts FROM jobpulse.node_validations GROUP BY 1, 2) last
    USING (cluster, node, ts);
