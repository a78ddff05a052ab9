-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE FUNCTION jobpulse.rank_bins_missing(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN EXISTS (SELECT 1 FROM jobpulse.process_samples_compact c
                  WHERE c.cluster = p_cluster AND c.job_id = p_job
                    AND c.chunk_start > p_from - interval '6 hours' AND c.chunk_start <= p_to
                    AND NOT EXISTS (SELECT 1 FROM jobpulse.rank_bins_compact b
                                     WHERE b.cluster = c.cluster AND b.node = c.node
                                       AND b.chunk_start = c.chunk_start AND b.job_id = c.job_id));
END
$$;
