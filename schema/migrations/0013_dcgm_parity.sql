-- Two fields dcgm-exporter exposes by default: framebuffer the driver reserves (NVML's memory
-- info v2, as nvidia-smi shows it) and GPM's graphics/compute engine activity
-- (DCGM_FI_PROF_GR_ENGINE_ACTIVE). Declared in schema/fields.py; no roll-up keeps them.
ALTER TABLE jobpulse.gpu_samples
    ADD COLUMN fb_reserved_mib integer,
    ADD COLUMN gpm_gr_active   real;
