-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE FUNCTION jobpulse.gpu_name(p_cluster text, p_node text, p_gpu_uuid text, p_gpu_index integer)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT p_node || '/GPU' || p_gpu_index
           || CASE WHEN p_gpu_uuid LIKE 'MIG-%' THEN jobpulse.mig_slice_name(p_cluster, p_node, p_gpu_uuid) ELSE '' END
$$;
