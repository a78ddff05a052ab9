-- A job's summary, written once when its rules are final (its end judged): the figures and advice a
-- researcher reads at the job's end (mail, `jobpulse summary`), kept when raw samples and the job's
-- own rows have gone: no foreign key, and no time partitions for retention to drop.
CREATE TABLE jobpulse.job_summaries (
    cluster       text        NOT NULL,
    job_id        text        NOT NULL,
    user_name     text,
    account       text,
    partition     text,
    job_name      text,
    state         text,
    start_time    timestamptz,
    end_time      timestamptz,
    gpus          integer     NOT NULL DEFAULT 0,
    gpu_hours     real        NOT NULL DEFAULT 0,  -- held (allocated)
    gpu_hours_used real       NOT NULL DEFAULT 0,
    wasted        jsonb       NOT NULL DEFAULT '{}',  -- GPU-hours wasted, by cause
    summary       jsonb       NOT NULL,  -- the whole summary (what `jobpulse summary --format json` prints)
    text          text        NOT NULL,  -- at most 25 lines
    written_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, job_id)
);
CREATE INDEX job_summaries_user ON jobpulse.job_summaries (user_name, end_time);
