-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
-- What waits in each partition now: its latest reading of the last 10 minutes (slurm-sync polls every
-- 30 s by default). A partition without one has no reading to trust: the sync stopped, or it never
-- saw a job there.
CREATE OR REPLACE VIEW jobpulse.partition_queue_now AS
    SELECT DISTINCT ON (cluster, partition) cluster, partition, ts, jobs_pending, gpu_jobs_pending, gpus_pending,
           source
      FROM jobpulse.partition_queue
     WHERE ts > now() - interval '10 minutes'
     ORDER BY cluster, partition, ts DESC;
