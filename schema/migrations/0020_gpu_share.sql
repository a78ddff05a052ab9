-- The share of a GPU a job holds when it shares it (Slurm MPS: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
-- / 100); NULL: all of it, or all of its MIG slice. GPU-hours count a GPU as this share.
ALTER TABLE jobpulse.job_gpus ADD COLUMN share real CHECK (share > 0 AND share <= 1);
