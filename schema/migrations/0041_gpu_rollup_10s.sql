-- The 10 s GPU buckets get a table of their own, kept while the samples are raw (48 h) and a day
-- more, then dropped by whole days: they were two thirds of what jobpulse kept per GPU sample (a
-- 400-byte row per 10 samples, kept two years beside the compact tier that holds every sample). The
-- rules and the fine dashboard ranges read them while they exist; older ranges are read from the
-- 300 s buckets (dashboards) or binned from the samples (a backtest of last week). Same columns as
-- gpu_rollup, so that a reader returns either's rows.
CREATE TABLE jobpulse.gpu_rollup_10s (LIKE jobpulse.gpu_rollup INCLUDING DEFAULTS)
    PARTITION BY RANGE (bucket);
ALTER TABLE jobpulse.gpu_rollup_10s
    ADD CONSTRAINT gpu_rollup_10s_width CHECK (width_s = 10),
    ADD PRIMARY KEY (width_s, cluster, job_id, node, gpu_uuid, bucket);
CREATE INDEX gpu_rollup_10s_job_time ON jobpulse.gpu_rollup_10s (cluster, job_id, bucket);
CREATE INDEX gpu_rollup_10s_time ON jobpulse.gpu_rollup_10s (bucket);

-- The 10 s buckets of the last three days move over (their days' partitions made here); older ones go.
DO $$
DECLARE d date;
BEGIN
    FOR d IN SELECT DISTINCT (bucket AT TIME ZONE 'UTC')::date FROM jobpulse.gpu_rollup
              WHERE width_s = 10 AND bucket >= date_trunc('day', now(), 'UTC') - interval '3 days' LOOP
        EXECUTE format('CREATE TABLE jobpulse.%I PARTITION OF jobpulse.gpu_rollup_10s FOR VALUES FROM (%L) TO (%L)',
                       'gpu_rollup_10s_p' || to_char(d, 'YYYYMMDD'), d::text || ' 00:00:00+00',
                       (d + 1)::text || ' 00:00:00+00');
    END LOOP;
END $$;
INSERT INTO jobpulse.gpu_rollup_10s SELECT * FROM jobpulse.gpu_rollup
 WHERE width_s = 10 AND bucket >= date_trunc('day', now(), 'UTC') - interval '3 days';
DELETE FROM jobpulse.gpu_rollup WHERE width_s = 10;
