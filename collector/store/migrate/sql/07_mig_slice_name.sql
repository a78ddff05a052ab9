-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE FUNCTION jobpulse.mig_slice_name(p_cluster text, p_node text, p_gpu_uuid text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT ' MIG ' || coalesce(t.mig_profile, '?') || ' (GI ' || coalesce(t.gpu_instance_id::text, '?') || ')'
          FROM jobpulse.topology_current t
         WHERE t.cluster = p_cluster AND t.node = p_node AND t.gpu_uuid = p_gpu_uuid AND t.parent_uuid IS NOT NULL), '')
$$;
