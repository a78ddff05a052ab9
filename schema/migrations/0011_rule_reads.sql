-- The rules read each judged job's last minutes of 10 s roll-ups every cycle (and Grafana one job
-- over a range): lead with the job, then time, so such a read touches only that job's rows in the
-- range instead of every GPU's (the primary key puts node and GPU before time).
CREATE INDEX gpu_rollup_job_time ON jobpulse.gpu_rollup (width_s, cluster, job_id, bucket);
