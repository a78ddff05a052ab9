-- A job's runs and the scheduler's states within them. Slurm requeues a job under the same id (after a
-- node failure, a preemption, `scontrol requeue`) and counts its runs (SLURM_RESTART_COUNT,
-- squeue's restart_cnt): `jobs.run` is the run the job row describes now, `job_runs` keeps every
-- run's own start, end, end state and nodes, so an earlier run's NODE_FAIL or PREEMPTED stays
-- named. `job_states` is the state's history while the job runs (RUNNING, SUSPENDED, RUNNING ...):
-- suspended time is the scheduler's, neither the job's waste nor its work. `until` NULL: the state
-- holds now.
ALTER TABLE jobpulse.jobs ADD COLUMN run integer;

CREATE TABLE jobpulse.job_runs (
    cluster    text        NOT NULL,
    job_id     text        NOT NULL,
    run        integer     NOT NULL,
    start_time timestamptz,
    end_time   timestamptz,
    state      text,
    exit_code  integer,
    nodes      text[],
    PRIMARY KEY (cluster, job_id, run)
);

CREATE TABLE jobpulse.job_states (
    cluster text        NOT NULL,
    job_id  text        NOT NULL,
    run     integer     NOT NULL DEFAULT 0,
    state   text        NOT NULL,
    since   timestamptz NOT NULL,
    until   timestamptz,
    PRIMARY KEY (cluster, job_id, since)
);
