-- When the rules engine first raised a flag (started_at is when the condition began).
ALTER TABLE jobpulse.job_flags ADD COLUMN opened_at timestamptz NOT NULL DEFAULT now();

-- When the rules engine made its last evaluation of an ended job (its flags then close at the
-- job's end time and are not raised again).
ALTER TABLE jobpulse.jobs ADD COLUMN rules_final_at timestamptz;
CREATE INDEX jobs_rules_pending ON jobpulse.jobs (cluster, job_id) WHERE end_time IS NOT NULL AND rules_final_at IS NULL;
