-- What a job was given besides GPUs (from the controller: CPUs and memory over all its nodes), and
-- the hash of its batch script without the #SBATCH lines: the right-sizing advice compares the first
-- with what the job used, and the hash tells the next run of the same work (whose #SBATCH lines may
-- have followed the advice) from other jobs of the same name.
ALTER TABLE jobpulse.jobs ADD COLUMN cpus integer, ADD COLUMN mem_mib bigint, ADD COLUMN script_hash text;
ALTER TABLE jobpulse.job_summaries ADD COLUMN script_hash text;
