-- How reports, dashboards and rules name a GPU to people: node/GPU<NVML index>, and a MIG instance
-- by its slice of that GPU, e.g. n1/GPU0 MIG 1g.10gb (GI 7): two slices of one GPU share its index.
CREATE FUNCTION jobpulse.gpu_name(p_cluster text, p_node text, p_gpu_uuid text, p_gpu_index integer)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT p_node || '/GPU' || p_gpu_index || coalesce((
        SELECT ' MIG ' || coalesce(t.mig_profile, '?') || ' (GI ' || coalesce(t.gpu_instance_id::text, '?') || ')'
          FROM jobpulse.topology_current t
         WHERE t.cluster = p_cluster AND t.node = p_node AND t.gpu_uuid = p_gpu_uuid AND t.parent_uuid IS NOT NULL), '')
$$;  -- EXECUTE is PUBLIC's, as for every new function: Grafana's reader role may call it
