-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
--
-- Since when the 10 s GPU buckets are whole: the start of the oldest day in the unbroken run of
-- gpu_rollup_10s partitions that holds today (retention drops whole days from the old end; ingest
-- makes none before yesterday, and a day made by hand apart from the run does not count). Earlier
-- ranges are read from the 300 s buckets or the samples. 'infinity' when today has no partition.
CREATE OR REPLACE FUNCTION jobpulse.gpu_rollup_10s_since() RETURNS timestamptz LANGUAGE sql STABLE AS $$
WITH days AS (
    SELECT to_date(substring(c.relname FROM '_p([0-9]{8})$'), 'YYYYMMDD') AS d
      FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'jobpulse.gpu_rollup_10s'::regclass),
runs AS (SELECT d, d - (row_number() OVER (ORDER BY d))::int AS run FROM days)
SELECT coalesce((SELECT min(d) FROM runs
                  WHERE run = (SELECT run FROM runs WHERE d = (now() AT TIME ZONE 'UTC')::date))::timestamp
                AT TIME ZONE 'UTC', 'infinity')
$$;
