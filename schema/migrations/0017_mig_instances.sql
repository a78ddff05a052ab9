-- MIG instances are GPUs of their own (keyed by their MIG- UUID in samples, roll-ups and job
-- allocation); the topology says which GPU each is a slice of, with its profile and instance ids
-- (dcgm-exporter's GPU_I_PROFILE and GPU_I_ID). Declared in schema/wire.py (TopologyGpu).
ALTER TABLE jobpulse.topology
    ADD COLUMN parent_uuid         text,
    ADD COLUMN mig_profile         text,
    ADD COLUMN gpu_instance_id     integer,
    ADD COLUMN compute_instance_id integer;
-- The view's `*` was expanded when it was made: make it again to carry the new columns.
CREATE OR REPLACE VIEW jobpulse.topology_current AS
    SELECT DISTINCT ON (cluster, node, gpu_uuid) *
    FROM jobpulse.topology
    ORDER BY cluster, node, gpu_uuid, ts DESC;
