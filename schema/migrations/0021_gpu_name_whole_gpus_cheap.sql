-- gpu_name runs once per row of a panel (a 15-minute panel of 64 GPUs draws 57,600 rows), and as
-- 0018 made it, each call ran its own topology lookup (12 us a row). Now it is one expression that
-- PostgreSQL inlines into the calling query: a whole GPU is named from its arguments alone, and
-- only a MIG slice (its UUID starts with MIG-, in both forms NVML and CUDA_VISIBLE_DEVICES use)
-- calls mig_slice_name for its profile and GPU instance.
CREATE FUNCTION jobpulse.mig_slice_name(p_cluster text, p_node text, p_gpu_uuid text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce((
        SELECT ' MIG ' || coalesce(t.mig_profile, '?') || ' (GI ' || coalesce(t.gpu_instance_id::text, '?') || ')'
          FROM jobpulse.topology_current t
         WHERE t.cluster = p_cluster AND t.node = p_node AND t.gpu_uuid = p_gpu_uuid AND t.parent_uuid IS NOT NULL), '')
$$;

CREATE OR REPLACE FUNCTION jobpulse.gpu_name(p_cluster text, p_node text, p_gpu_uuid text, p_gpu_index integer)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT p_node || '/GPU' || p_gpu_index
           || CASE WHEN p_gpu_uuid LIKE 'MIG-%' THEN jobpulse.mig_slice_name(p_cluster, p_node, p_gpu_uuid) ELSE '' END
$$;
