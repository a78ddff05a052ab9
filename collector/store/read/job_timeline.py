"""Store: a job's timeline as goodput reads it -- its GPUs' time bucket by bucket (how many reported, how
much of each was idle), its phases, its steps by the minute, whether it sent events at all, the
stretches Slurm held it suspended, and its earlier runs (a requeued job's)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from jobpulse.collector.store.tiers import rollup

# A job's 10 s buckets as the stored rows make them, whatever the leader has folded yet: the 10 s
# roll-ups hold the samples before the fold mark, the raw samples from it are binned here the way the
# fold will bin them, and a GPU's bucket split across the mark is one bucket again.
_FINE = """
WITH g AS (
  SELECT bucket, node, gpu_uuid, sum(n)::float8 AS n, sum(n_idle)::float8 AS n_idle FROM (
    SELECT r.bucket, r.node, r.gpu_uuid, r.n, r.n_idle FROM jobpulse.{fine} r
     WHERE r.cluster = %(c)s AND r.job_id = %(j)s AND r.width_s = %(w)s
       AND r.bucket >= %(from)s - make_interval(secs => %(w)s) AND r.bucket <= %(end)s
    UNION ALL
    SELECT b.bucket, b.node, b.gpu_uuid, b.n, b.n_idle FROM ({raw}) b
  ) x GROUP BY 1, 2, 3)
SELECT bucket, %(w)s, count(*), sum(n_idle / n) FROM g WHERE n > 0 GROUP BY bucket ORDER BY bucket
"""
_RAW = """(SELECT * FROM jobpulse.gpu_samples s WHERE s.cluster = %(c)s AND s.job_id = %(j)s
   AND s.ts >= coalesce((SELECT folded_before FROM jobpulse.fold_mark), 'infinity')
   AND s.ts >= %(from)s - make_interval(secs => %(w)s) AND s.ts < %(end)s + make_interval(secs => %(w)s))"""
# Before the 10 s roll-ups' first bucket (retention took them), the 5-minute roll-ups wholly before it.
_COARSE = """
SELECT bucket, max(width_s), count(*), sum(n_idle::float8 / nullif(n, 0))
  FROM jobpulse.gpu_rollup
 WHERE cluster = %(c)s AND job_id = %(j)s AND width_s = %(cw)s AND bucket >= %(start)s - make_interval(secs => %(cw)s)
   AND bucket <= %(end)s AND bucket + make_interval(secs => %(cw)s) <= %(from)s AND n > 0
 GROUP BY bucket ORDER BY bucket
"""


@dataclass(frozen=True)
class Bucket:
    """One bucket of the job's GPUs: when, how long, how many GPUs reported, and the sum over them of
    the share of samples idle (the GPU-buckets it was idle)."""

    start: datetime
    width_s: int
    gpus: int
    idle: float


@dataclass(frozen=True)
class Parts:
    """What goodput reads of one job."""

    buckets: list[Bucket]
    phases: list[tuple[str, datetime, datetime | None]]  # name, start, end (None: still running)
    first_step: datetime | None
    events: bool  # the job sent application events of any kind
    step_minutes: list[datetime] = field(default_factory=list)  # minutes with a step of any rank, in order
    suspended: list[tuple[datetime, datetime]] = field(default_factory=list)  # Slurm held the job suspended


@dataclass(frozen=True)
class Run:
    """An earlier run of a job Slurm requeued (`job_runs`): the job row is the run under way or last."""

    run: int
    start: datetime | None
    end: datetime | None  # None: never said (its node failed); the next run's start bounds it
    state: str | None
    exit_code: int | None
    nodes: list[str]
    gpus_total: int | None


def runs(conn: psycopg.Connection[Any], cluster: str, job_id: str) -> list[Run]:
    """The job's earlier runs, oldest first."""
    return [Run(*r) for r in conn.execute(
        "SELECT run, start_time, end_time, state, exit_code, coalesce(nodes, '{}'), gpus_total FROM jobpulse.job_runs"
        " WHERE cluster = %s AND job_id = %s ORDER BY run", (cluster, job_id)).fetchall()]


def read(conn: psycopg.Connection[Any], cluster: str, job_id: str, start: datetime, end: datetime) -> Parts:
    """The job's buckets between ``start`` and ``end``, the same for the same stored rows whenever it
    is asked (before or after the leader folds them): its 10 s buckets where they are kept, the
    5-minute roll-ups before that (they outlive raw retention)."""
    row = conn.execute("SELECT extract(epoch FROM jobpulse.gpu_rollup_10s_since())::float8").fetchone()
    since = row[0] if row and row[0] is not None else math.inf  # infinity: none kept
    fine_from = start if since <= start.timestamp() else datetime.fromtimestamp(since, UTC) if math.isfinite(since) \
        else end
    params = {"c": cluster, "j": job_id, "w": rollup.FINE_WIDTH_S, "cw": rollup.WIDTH_S, "start": start,
              "end": end, "from": fine_from}
    query = _FINE.format(fine=rollup.FINE_TABLE, raw=rollup.gpu_buckets(_RAW, rollup.FINE_WIDTH_S))
    coarse = conn.execute(_COARSE, params).fetchall() if fine_from > start else []
    buckets = [Bucket(b, int(w), int(k), float(i or 0.0))
               for b, w, k, i in [*coarse, *conn.execute(query, params).fetchall()]]
    phases = conn.execute("SELECT phase, started_at, ended_at FROM jobpulse.job_phases WHERE cluster = %(c)s"
                          " AND job_id = %(j)s AND started_at IS NOT NULL ORDER BY started_at", params).fetchall()
    first_step, events = conn.execute(
        "SELECT min(ts) FILTER (WHERE kind = 'step'), count(*) > 0 FROM jobpulse.events"
        " WHERE cluster = %(c)s AND job_id = %(j)s", params).fetchone() or (None, False)
    minutes = [m for (m,) in conn.execute(
        "SELECT DISTINCT bucket FROM jobpulse.step_rollup WHERE width_s = 60 AND cluster = %(c)s AND job_id = %(j)s"
        " AND n > 0 ORDER BY bucket", params).fetchall()] if first_step is not None else []
    held = conn.execute(
        "SELECT greatest(since, %(start)s), least(coalesce(until, %(end)s), %(end)s) FROM jobpulse.job_states"
        " WHERE cluster = %(c)s AND job_id = %(j)s AND state = 'SUSPENDED' AND since < %(end)s"
        " AND coalesce(until, %(end)s) > %(start)s ORDER BY since", params).fetchall()
    return Parts(buckets, [(p, s, e) for p, s, e in phases], first_step, bool(events), minutes,
                 [(a, b) for a, b in held])
