-- The pyramid's coarse levels: per (job, node) and per job, hour rows summed from the 300 s rows and
-- six-hour rows summed from the hours (collector/store/pyramid.py). A cluster panel over a day or a
-- week of 8,000 GPUs read one 300 s row per job and node, about 2,750 every five minutes: 800,000
-- rows a day, 5.5 million a week (0.4-0.7 s and 2.5-5.7 s a panel). width_s tells the levels apart,
-- as in gpu_rollup; rows written before it are the 300 s level.
ALTER TABLE jobpulse.node_job_rollup ADD COLUMN width_s smallint NOT NULL DEFAULT 300;
ALTER TABLE jobpulse.job_bucket_rollup ADD COLUMN width_s smallint NOT NULL DEFAULT 300;
ALTER TABLE jobpulse.node_job_rollup DROP CONSTRAINT node_job_rollup_pkey;
ALTER TABLE jobpulse.node_job_rollup ADD PRIMARY KEY (cluster, job_id, node, width_s, bucket);
ALTER TABLE jobpulse.job_bucket_rollup DROP CONSTRAINT job_bucket_rollup_pkey;
ALTER TABLE jobpulse.job_bucket_rollup ADD PRIMARY KEY (cluster, job_id, width_s, bucket);
DROP INDEX jobpulse.node_job_rollup_time;
CREATE INDEX node_job_rollup_time ON jobpulse.node_job_rollup (cluster, width_s, bucket);
DROP INDEX jobpulse.job_bucket_rollup_time;
CREATE INDEX job_bucket_rollup_time ON jobpulse.job_bucket_rollup (cluster, width_s, bucket);

-- The level a cluster panel reads for a range: 300 s rows up to 6 hours (at most 72 buckets), hours
-- up to 36, six hours beyond (a week: 28 buckets). One place, so that every panel and its time
-- groups agree.
CREATE FUNCTION jobpulse.pyramid_width(range_from timestamptz, range_to timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (CASE WHEN range_to - range_from <= interval '6 hours' THEN 300
                     WHEN range_to - range_from <= interval '36 hours' THEN 3600 ELSE 21600 END)::smallint $$;
