-- When a job entered the state its row holds (squeue's suspend_time: the moment Slurm suspended or
-- resumed it), so that job_states' intervals start when the scheduler acted, not when slurm-sync
-- next polled. job_states.source says who told: 'slurm' (the controller's state, slurm-sync) or
-- 'processes' (no controller said; every process of the job was stopped, state T, in its samples).
ALTER TABLE jobpulse.jobs ADD COLUMN state_since timestamptz;
ALTER TABLE jobpulse.job_states ADD COLUMN source text NOT NULL DEFAULT 'slurm';
-- A run's GPUs over all its nodes, as its job row held them (what its GPU-hours are counted on).
ALTER TABLE jobpulse.job_runs ADD COLUMN gpus_total integer;
