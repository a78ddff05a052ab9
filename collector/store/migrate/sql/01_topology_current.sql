-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE VIEW jobpulse.topology_current AS
    SELECT DISTINCT ON (cluster, node, gpu_uuid) *
    FROM jobpulse.topology
    ORDER BY cluster, node, gpu_uuid, ts DESC;
