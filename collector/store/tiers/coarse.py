"""Store: half-hour roll-up buckets for ranges of days, made from the 300 s buckets by compaction.

A 7-day panel of a 64-GPU job asks for a point every 1,936 s per GPU (Grafana's interval, raised so
that GPUs x steps stay within the points a panel shows): from 300 s buckets that is 129,000 rows to
aggregate, from 1,800 s ones 21,500. Ingest does not keep them (a third width would cost every
batch); `compact` makes them for every hour it moved to the compact tier: `build` merges the 300 s
buckets of one hour, every node at once, into ``width_s = 1800`` rows of the same tables, by the
merge each column's ingest fold uses (sums add, maxima take the largest, the newest value wins).
An hour is rebuilt whole when late data for it is compacted; until then its coarse rows lack the
late samples (the 300 s buckets have them).

Readers: ``jobpulse.gpu_rollup_between(cluster, job, from, to, width, coarse)`` and
``process_rollup_between`` return a job's buckets of ``width`` over [from, to], and with
``coarse`` the 1,800 s rows instead wherever they exist, as rows of the roll-up table, so a caller
aggregates them as before. GPU buckets of 10 s come from their own table (`gpu_rollup_10s`, kept
while samples are raw), and from the 300 s buckets before it. `gpu_series` and `rank_series` ask for
them at steps of 1,800 s or more; `ensure` (run by `jobpulse db upgrade`) creates them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg

from jobpulse.collector.store.migrate import objects
from jobpulse.collector.store.tiers import rollup

HOUR = timedelta(hours=1)
HOUR_S = int(HOUR.total_seconds())
COARSE_S = 1800
SOURCE_WIDTH_S = 300  # the buckets coarse ones are made of (both tables keep them)


def _build_sql(table: str) -> str:
    """INSERT (or replace) the coarse rows of every job, node and GPU (PID) of one hour."""
    keys, columns = rollup.COLUMNS[table]
    names = [*keys, *columns]
    aggregates = [rollup.COARSEN[merge].format(c=c) for c, (_, merge) in columns.items()]
    return f"""
INSERT INTO jobpulse.{table} (width_s, bucket, {", ".join(names)})
SELECT {COARSE_S}, date_bin(interval '{COARSE_S} seconds', bucket, timestamptz 'epoch'), {", ".join(keys)},
       {", ".join(aggregates)}
  FROM jobpulse.{table}
 WHERE width_s = {SOURCE_WIDTH_S} AND bucket >= %(hour)s AND bucket < %(hour)s + interval '{HOUR_S} seconds'
 GROUP BY 2, {", ".join(keys)}
ON CONFLICT (width_s, {", ".join(keys)}, bucket) DO UPDATE SET
 {", ".join(f"{c} = EXCLUDED.{c}" for c in columns)}
"""


_BUILD = {table: _build_sql(table) for table in rollup.COLUMNS}


def build(conn: psycopg.Connection, hour: datetime) -> int:
    """Make (or remake) the coarse rows of ``hour`` (aligned to the epoch) in both tables, in one
    transaction; returns the rows written."""
    if hour.timestamp() % HOUR_S:
        raise ValueError(f"an hour starts on the hour, got {hour.isoformat()}")
    with conn.transaction():
        return sum(conn.execute(statement, {"hour": hour}).rowcount for statement in _BUILD.values())


_JOB_ROW = ("SELECT coalesce(start_time, first_seen) AS started, end_time FROM jobpulse.jobs"
            " WHERE cluster = p_cluster AND job_id = p_job")


def _job(alias: str) -> str:
    return f"{alias}.cluster = p_cluster AND {alias}.job_id = p_job"


def _fine_arms(table: str) -> str:
    """For `gpu_rollup` read at 10 s: its own table's buckets while they exist, the 300 s buckets
    before that (`jobpulse.gpu_rollup_10s_since`)."""
    if table != "gpu_rollup":
        return ""
    since = "jobpulse.gpu_rollup_10s_since()"
    return f"""
UNION ALL
SELECT t.* FROM jobpulse.{rollup.FINE_TABLE} t
 WHERE p_width = {rollup.FINE_WIDTH_S} AND {_job("t")}
   AND t.bucket BETWEEN greatest(p_from - interval '{rollup.FINE_WIDTH_S} seconds', {since}) AND p_to
UNION ALL
SELECT o.* FROM jobpulse.gpu_rollup o
 WHERE p_width = {rollup.FINE_WIDTH_S} AND o.width_s = {SOURCE_WIDTH_S} AND {_job("o")}
   AND o.bucket BETWEEN p_from - interval '{SOURCE_WIDTH_S} seconds' AND least(p_to, {since} - interval '1 second')"""


def _reader_sql(table: str) -> str:
    """A job's buckets of one width over a range, coarse rows in place of the fine ones they merge.
    The fine buckets before the first time within the job's run that has no coarse row are skipped
    by the index, later ones that have one by an anti-join. The coarse times are counted by an
    integer series so that the planner knows how many there are: plans it estimates costly are
    JIT-compiled, which took longer than running them."""
    coarse = "p_coarse AND isfinite(p_from) AND isfinite(p_to)"
    width = f"interval '{COARSE_S} seconds'"
    first = f"date_bin({width}, p_from - make_interval(secs => p_width), timestamptz 'epoch')"
    return f"""
CREATE OR REPLACE FUNCTION jobpulse.{table}_between(p_cluster text, p_job text, p_from timestamptz,
                                                     p_to timestamptz, p_width integer, p_coarse boolean)
RETURNS SETOF jobpulse.{table} LANGUAGE sql STABLE AS $$
SELECT h.* FROM jobpulse.{table} h
 WHERE {coarse} AND h.width_s = {COARSE_S} AND {_job("h")} AND h.bucket BETWEEN p_from - {width} AND p_to
UNION ALL
SELECT f.* FROM jobpulse.{table} f
 WHERE f.width_s = p_width AND {_job("f")} AND f.bucket BETWEEN p_from - make_interval(secs => p_width) AND p_to
   AND f.bucket >= CASE WHEN {coarse} AND EXISTS ({_JOB_ROW}) THEN (
           SELECT coalesce(min(x.t), 'infinity')
             FROM (SELECT {first} + k * {width} AS t
                     FROM generate_series(0, ceil(extract(epoch FROM p_to - {first}) / {COARSE_S})::int) k) x,
                  ({_JOB_ROW}) j
            WHERE x.t + {width} > j.started AND x.t <= coalesce(j.end_time, p_to)
              AND NOT EXISTS (SELECT 1 FROM jobpulse.{table} h WHERE h.width_s = {COARSE_S} AND {_job("h")}
                                 AND h.bucket = x.t))
       ELSE '-infinity' END
   AND NOT EXISTS (SELECT 1 FROM jobpulse.{table} h
                    WHERE {coarse} AND h.width_s = {COARSE_S} AND {_job("h")}
                      AND h.bucket = date_bin({width}, f.bucket, timestamptz 'epoch')){_fine_arms(table)}
$$;
GRANT EXECUTE ON FUNCTION jobpulse.{table}_between TO PUBLIC"""


def of_job_sql(table: str) -> str:
    """``{table}_of_job(cluster, job, width)``: a job's buckets of one width over its whole run, a
    bucket either side (agents' clocks are not the controller's), coarse ones where compaction made
    them: what the job dashboard's whole-run figures read (GPU-hours, the Ranks table, the rank
    variable). It reads the job's run first and then plans the bucket query with its times: joined
    in one SQL query, the planner knew neither job nor times and fetched a week's 86,000 coarse
    process rows of 64 ranks by index scans (bench/storage.py's week). On Citus the bucket query is
    then routed to the job's shard."""
    return f"""
CREATE OR REPLACE FUNCTION jobpulse.{table}_of_job(p_cluster text, p_job text, p_width integer)
RETURNS SETOF jobpulse.{table} LANGUAGE plpgsql STABLE AS $$
DECLARE run record;
BEGIN
  SELECT coalesce(start_time, first_seen) - make_interval(secs => p_width) AS s,
         coalesce(end_time, now()) + make_interval(secs => p_width) AS e INTO run
    FROM jobpulse.jobs WHERE cluster = p_cluster AND job_id = p_job;
  IF FOUND THEN
    RETURN QUERY SELECT * FROM jobpulse.{table}_between(p_cluster, p_job, run.s, run.e, p_width, true);
  END IF;
END
$$;
GRANT EXECUTE ON FUNCTION jobpulse.{table}_of_job TO PUBLIC"""


def fine_reader_sql(table: str) -> str:
    """The reader without coarse rows, for a Citus coordinator: Citus cannot plan the anti-join
    that picks the fine buckets no coarse one covers. The fine buckets alone draw the same series
    (compaction keeps them), only more slowly over days."""
    return f"""
CREATE OR REPLACE FUNCTION jobpulse.{table}_between(p_cluster text, p_job text, p_from timestamptz,
                                                     p_to timestamptz, p_width integer, p_coarse boolean)
RETURNS SETOF jobpulse.{table} LANGUAGE sql STABLE AS $$
SELECT f.* FROM jobpulse.{table} f
 WHERE f.width_s = p_width AND {_job("f")}
   AND f.bucket BETWEEN p_from - make_interval(secs => p_width) AND p_to{_fine_arms(table)}
$$"""


def ensure(conn: psycopg.Connection) -> bool:
    """(Re)create the readers when their text changed; True if it did."""
    body = definition()
    if objects.current(conn, "coarse_readers", body):
        return False
    conn.execute(body.encode())
    objects.record(conn, "coarse_readers", body)
    return True


def definition() -> str:
    """The readers' text, as `ensure` makes them (and the ledger of objects records them)."""
    return ";\n".join([*(_reader_sql(table) for table in rollup.COLUMNS), *map(of_job_sql, rollup.COLUMNS)])
