"""Store: the cluster dashboards' pyramid, the 300 s GPU roll-ups summed per (job, node, bucket),
per (job, bucket) and per (node, bucket).

A cluster panel over 8,000 GPUs aggregating gpu_rollup reads 8,000 rows per 5 minutes (0.5-3 s a
query); ``jobpulse.node_job_rollup`` holds one row per job and node (~2,750 per 5 minutes there),
with the columns those panels read, summed, the GPU-seconds wasted (worked out per GPU as the
wasted GPU-hours panel did) and the increase of the counters the node-health panels draw;
``jobpulse.job_bucket_rollup`` those summed per job (~900), ``jobpulse.node_rollup`` per node
(1,250), for the panels that draw a series per node. The leader's ``pyramid`` task runs `build` every minute: it
(re)aggregates every bucket from ``built_to`` minus `RELOOK` up to now, the open bucket included,
by an idempotent upsert, an hour per transaction, and moves ``built_to`` on after each, so a run
stopped anywhere (budget spent, leader gone) goes on from there. The panels thus trail ingest by
up to one run. GPU samples older than `LATE` when stored (an agent's spool replayed after an
outage, an import) may fall before the next run's relook: the ingest marks their hours
(``jobpulse.pyramid_late``, `MARK`) and the run rebuilds each marked hour after the recent ones.
Compaction also rebuilds the hours it compacted (`rebuild`), as it does its coarse buckets.

Three levels (``width_s``, `LEVELS`): the 300 s rows, hour rows summed from them, six-hour rows
summed from the hours, each coarse row rebuilt whenever a run touches a row it sums. Panels read
300 s rows up to a 6-hour range, hours up to 36 hours, six hours beyond (``jobpulse.pyramid_width``):
a week of 8,000 GPUs is 5.5 million 300 s rows, 460,000 hour rows, 77,000 six-hour rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import psycopg

from jobpulse.collector.store.read.mig_shares import slice_shares_sql
from jobpulse.collector.store.tiers import partitions
from jobpulse.schema import wire
from jobpulse.schema.fields import GPU_FIELDS
from jobpulse.schema.semantics import activity_bucket_sql

WIDTH_S = 300  # the gpu_rollup buckets summed: the pyramid's fine level
HOUR_S = 3600
LEVELS = (WIDTH_S, HOUR_S, 6 * HOUR_S)  # each coarse level summed from the one before it
RELOOK = timedelta(minutes=15)  # buckets before built_to rebuilt each run: batches an agent sent late
CHUNK = timedelta(hours=1)  # one transaction
# A sample this old when stored may lie before the next run's start. That start is RELOOK before the
# run before it ended (the end of its open bucket: at most WIDTH_S after it began), which began before
# the sample's transaction committed: RELOOK less two buckets leaves a bucket for that transaction.
LATE = RELOOK - timedelta(seconds=2 * WIDTH_S)
TABLES = ("node_job_rollup", "job_bucket_rollup", "node_rollup")
_LOCK_KEY = 0x6A6F6279  # serializes builders: concurrent upserts of the same rows could deadlock

# Per GPU row: allocated share minus busy share, times its samples (a MIG slice holds its compute
# share of the GPU, an MPS job its share; a slice's activity is of the slice, an MPS job's of the GPU).
_WASTED = (f"r.n * greatest(coalesce(g.share, s.share, 1) - coalesce(s.share, 1) * {activity_bucket_sql('r.')} / 100,"
           " 0)")
_SUMS = ("n", "n_gpm", "sum_sm_util", "sum_sm_active", "n_hw_throttle", "n_loaded", "n_pcie_low")
COUNTERS = tuple(f.name for f in GPU_FIELDS if f.panel and {f"min_{f.name}", f"max_{f.name}"} <= f.rollup.keys())
"""Counters the node-health panels draw (NVLink errors): their increase per bucket, ``inc_<name>``."""
# A GPU's increase in a bucket: its largest value less its largest in the bucket before (its first
# bucket: within it); a counter that went back (a reset) counts from its smallest value.
_INCREASES = "".join(
    f", CASE WHEN max_{c} >= lag(max_{c}) OVER gpu THEN max_{c} - lag(max_{c}) OVER gpu"
    f" ELSE max_{c} - min_{c} END AS inc_{c}" for c in COUNTERS)

_UPDATE = ", ".join(f"{c} = EXCLUDED.{c}" for c in ("gpus", *_SUMS, "wasted_s", *(f"inc_{c}" for c in COUNTERS)))
_BUILD = f"""
INSERT INTO jobpulse.node_job_rollup AS p (width_s, cluster, job_id, node, bucket, gpus, {", ".join(_SUMS)}, wasted_s
    {"".join(f", inc_{c}" for c in COUNTERS)})
SELECT {WIDTH_S}, r.cluster, r.job_id, r.node, r.bucket, count(*), {", ".join(f"sum(r.{c})" for c in _SUMS)}, sum({_WASTED})
       {"".join(f", sum(r.inc_{c})" for c in COUNTERS)}
  FROM (SELECT *{_INCREASES} FROM jobpulse.gpu_rollup  -- from one bucket earlier: the first one's increase
         WHERE width_s = {WIDTH_S} AND cluster = %(cluster)s AND bucket >= %(start)s - interval '{WIDTH_S} seconds'
           AND bucket < %(end)s
        WINDOW gpu AS (PARTITION BY job_id, node, gpu_uuid ORDER BY bucket)) r
  LEFT JOIN ({slice_shares_sql("%(cluster)s")}) s ON s.node = r.node AND s.gpu_uuid = r.gpu_uuid
  LEFT JOIN jobpulse.job_gpus g ON g.cluster = r.cluster AND g.job_id = r.job_id AND g.node = r.node
       AND g.gpu_uuid = r.gpu_uuid
 WHERE r.bucket >= %(start)s
 GROUP BY r.cluster, r.job_id, r.node, r.bucket
ON CONFLICT (cluster, job_id, node, width_s, bucket) DO UPDATE SET {_UPDATE}"""
# A coarse bucket of a (job, node): the rows of the level below it summed; gpus, the most any had.
_BUILD_COARSE = f"""
INSERT INTO jobpulse.node_job_rollup AS p (width_s, cluster, job_id, node, bucket, gpus, {", ".join(_SUMS)}, wasted_s
    {"".join(f", inc_{c}" for c in COUNTERS)})
SELECT %(width)s, cluster, job_id, node, date_bin(make_interval(secs => %(width)s), bucket, timestamptz 'epoch') AS b,
       max(gpus), {", ".join(f"sum({c})" for c in (*_SUMS, "wasted_s", *(f"inc_{c}" for c in COUNTERS)))}
  FROM jobpulse.node_job_rollup
 WHERE width_s = %(below)s AND cluster = %(cluster)s AND bucket >= %(start)s AND bucket < %(end)s
 GROUP BY cluster, job_id, node, b
ON CONFLICT (cluster, job_id, node, width_s, bucket) DO UPDATE SET {_UPDATE}"""
_BUILD_JOBS = """
INSERT INTO jobpulse.job_bucket_rollup (width_s, cluster, job_id, bucket, gpus, wasted_s)
SELECT width_s, cluster, job_id, bucket, sum(gpus), sum(wasted_s) FROM jobpulse.node_job_rollup
 WHERE width_s = %(width)s AND cluster = %(cluster)s AND bucket >= %(start)s AND bucket < %(end)s
 GROUP BY width_s, cluster, job_id, bucket
ON CONFLICT (cluster, job_id, width_s, bucket) DO UPDATE SET gpus = EXCLUDED.gpus, wasted_s = EXCLUDED.wasted_s"""
# ... and per node, the jobs summed (what per-node panels read: a busy node runs many jobs in a bucket).
_NODE_COLUMNS = ("gpus", *_SUMS, *(f"inc_{c}" for c in COUNTERS))
_BUILD_NODES = f"""
INSERT INTO jobpulse.node_rollup (width_s, cluster, node, bucket, {", ".join(_NODE_COLUMNS)})
SELECT width_s, cluster, node, bucket, {", ".join(f"sum({c})" for c in _NODE_COLUMNS)} FROM jobpulse.node_job_rollup
 WHERE width_s = %(width)s AND cluster = %(cluster)s AND bucket >= %(start)s AND bucket < %(end)s
 GROUP BY width_s, cluster, node, bucket
ON CONFLICT (cluster, node, width_s, bucket) DO UPDATE SET {", ".join(f"{c} = EXCLUDED.{c}" for c in _NODE_COLUMNS)}"""
_CLUSTERS = (f"SELECT DISTINCT cluster FROM jobpulse.gpu_rollup WHERE width_s = {WIDTH_S}"
             " AND bucket >= %(start)s AND bucket < %(end)s")
_PROGRESS = "SELECT built_to FROM jobpulse.pyramid_progress"
_ADVANCE = ("INSERT INTO jobpulse.pyramid_progress (built_to) VALUES (%(to)s)"
            " ON CONFLICT (one) DO UPDATE SET built_to = EXCLUDED.built_to")
# A mark updates its own row when it is there: a run deleting that hour's marks then waits for the
# marking transaction and reads its samples, or the mark is made again after the run's delete.
MARK = ("INSERT INTO jobpulse.pyramid_late (hour, backend) SELECT h, pg_backend_pid() FROM unnest(%b::timestamptz[]) h"
        " ON CONFLICT (hour, backend) DO UPDATE SET marked_at = now()")
_MARKED = "SELECT DISTINCT hour FROM jobpulse.pyramid_late ORDER BY hour"
_UNMARK = "DELETE FROM jobpulse.pyramid_late WHERE hour = %s"
_FIRST = f"SELECT min(bucket) FROM jobpulse.gpu_rollup WHERE width_s = {WIDTH_S}"
_PYRAMID_CLUSTERS = (f"SELECT DISTINCT cluster FROM jobpulse.node_job_rollup WHERE width_s = {WIDTH_S}"
                     " AND bucket >= %(start)s AND bucket < %(end)s")


@dataclass
class Built:
    """What one `build` did."""

    rows: int = 0
    hours: int = 0
    late_hours: int = 0  # of them, hours marked by late samples
    seconds: float = 0.0
    finished: bool = True  # False: the budget ran out before now; the next run goes on


def ensure(conn: psycopg.Connection) -> bool:
    """Add the ``inc_<counter>`` columns of counters new to the field table to every pyramid level
    (`db upgrade` calls it, as it does the compact tier's); True if any was added."""
    have = {name for (name,) in conn.execute(
        "SELECT table_name || '.' || column_name FROM information_schema.columns"
        " WHERE table_schema = 'jobpulse' AND table_name = ANY(%s)", (list(TABLES),))}
    missing = [(t, c) for t in TABLES for c in COUNTERS if f"{t}.inc_{c}" not in have]
    for table, counter in missing:
        conn.execute(f"ALTER TABLE jobpulse.{table} ADD COLUMN inc_{counter} bigint".encode())
    return bool(missing)


def rebuild(conn: psycopg.Connection, start: datetime, end: datetime) -> int:
    """(Re)make the pyramid rows of the buckets in [start, end) of every cluster, and the coarse rows
    they fall in, in the caller's transaction; returns the rows written."""
    if start.timestamp() % WIDTH_S or end.timestamp() % WIDTH_S:
        raise ValueError(f"pyramid ranges start and end on {WIDTH_S} s buckets, got {start} to {end}")
    span = {"start": start, "end": end}
    _lock(conn, start, end)
    clusters = [r[0] for r in conn.execute(_CLUSTERS, span)]
    return sum(conn.execute(statement, {**span, "cluster": c, "width": WIDTH_S}).rowcount for c in clusters
               for statement in (_BUILD, _BUILD_JOBS, _BUILD_NODES)) + rebuild_coarse(conn, start, end, clusters)


def rebuild_coarse(conn: psycopg.Connection, start: datetime, end: datetime,
                   clusters: list[str] | None = None) -> int:
    """(Re)make the rows of every coarse level (`LEVELS`) whose buckets [start, end) touches, each
    from the level below (of ``clusters``, default every one with 300 s rows then), in the caller's
    transaction; returns the rows written."""
    if clusters is None:
        clusters = [r[0] for r in conn.execute(_PYRAMID_CLUSTERS, {"start": start, "end": end})]
    written = 0
    for below, width in pairwise(LEVELS):
        start = _floor(start, width)
        end = _floor(end - timedelta(microseconds=1), width) + timedelta(seconds=width)
        span = {"start": start, "end": end, "width": width, "below": below}
        _lock(conn, start, end)
        written += sum(conn.execute(statement, {**span, "cluster": c}).rowcount for c in clusters
                       for statement in (_BUILD_COARSE, _BUILD_JOBS, _BUILD_NODES))
    return written


def _lock(conn: psycopg.Connection, start: datetime, end: datetime) -> None:
    """The day partitions of [start, end), and the builders' lock (the leader and `jobpulse db pyramid`)."""
    partitions.ensure(conn, partitions.days_spanning(start, end - timedelta(microseconds=1)), list(TABLES))
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))


def _floor(t: datetime, width_s: int = WIDTH_S) -> datetime:
    return datetime.fromtimestamp(t.timestamp() // width_s * width_s, UTC)


def late_hours(batches: Iterable[wire.Batch], before: datetime) -> list[datetime]:
    """The hours of the batches' GPU samples older than ``before`` (what `MARK` marks)."""
    cut = before.timestamp()
    samples: list[Any] = [s for b in batches for s in b.gpu_samples]  # a wire record (defined at run time)
    return [datetime.fromtimestamp(h, UTC)
            for h in sorted({t // HOUR_S * HOUR_S for t in (s.ts.timestamp() for s in samples) if t < cut})]


def build(conn: psycopg.Connection, *, max_seconds: float | None = None, now: datetime | None = None) -> Built:
    """The leader's task: every bucket from the last run's ``built_to`` less `RELOOK` (the first
    run: the oldest 300 s bucket) through the open one, and the hours they are in, an hour per
    transaction, ``built_to`` moved on with each; then every hour late samples marked, its marks
    deleted in its transaction. ``max_seconds`` ends the run after the hour that passes it."""
    began = time.monotonic()
    done = Built()

    def spent() -> bool:
        return max_seconds is not None and time.monotonic() - began > max_seconds

    end = _floor(now or datetime.now(UTC)) + timedelta(seconds=WIDTH_S)  # the open bucket included
    row = conn.execute(_PROGRESS).fetchone()
    if row is not None:
        start = _floor(row[0] - RELOOK)
    else:
        first = conn.execute(_FIRST).fetchone()
        start = _floor(first[0]) if first and first[0] else end
    conn.commit()
    while start < end:
        if spent():
            done.finished = False
            break
        stop = min(_floor(start, HOUR_S) + CHUNK, end)  # whole hours after the first: each hour row made once
        with conn.transaction():
            done.rows += rebuild(conn, start, stop)
            conn.execute(_ADVANCE, {"to": stop})
        done.hours += 1
        start = stop
    marked = [hour for (hour,) in conn.execute(_MARKED)] if done.finished else []
    conn.commit()
    for hour in marked:
        if spent():
            done.finished = False
            break
        with conn.transaction():
            conn.execute(_UNMARK, (hour,))  # first: a mark being made now is waited for (see MARK)
            done.rows += rebuild(conn, hour, hour + CHUNK)
        done.hours += 1
        done.late_hours += 1
    done.seconds = time.monotonic() - began
    return done
