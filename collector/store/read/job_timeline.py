"""Store: a job's timeline as goodput reads it -- its GPUs' time bucket by bucket (how many reported, how
much of each was idle), its phases, its steps by the minute and whether it sent events at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from jobpulse.collector.store.tiers import rollup

_BUCKETS = """
SELECT bucket, max(width_s), count(*), sum(n_idle::float8 / nullif(n, 0))
  FROM jobpulse.{table}
 WHERE cluster = %(c)s AND job_id = %(j)s AND width_s = %(w)s AND bucket >= %(start)s - make_interval(secs => %(w)s)
   AND bucket <= %(end)s AND n > 0
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


def read(conn: psycopg.Connection[Any], cluster: str, job_id: str, start: datetime, end: datetime) -> Parts:
    """The job's buckets between ``start`` and ``end``: its 10 s buckets while they are kept, else its
    5-minute roll-ups (they outlive raw retention)."""
    since = conn.execute("SELECT extract(epoch FROM jobpulse.gpu_rollup_10s_since())::float8").fetchone()
    fine = since is not None and since[0] is not None and since[0] <= start.timestamp()  # infinity: none kept
    table, width = (rollup.FINE_TABLE, rollup.FINE_WIDTH_S) if fine else ("gpu_rollup", rollup.WIDTH_S)
    params = {"c": cluster, "j": job_id, "w": width, "start": start, "end": end}
    buckets = [Bucket(b, int(w), int(k), float(i or 0.0))
               for b, w, k, i in conn.execute(_BUCKETS.format(table=table), params).fetchall()]
    phases = conn.execute("SELECT phase, started_at, ended_at FROM jobpulse.job_phases WHERE cluster = %(c)s"
                          " AND job_id = %(j)s AND started_at IS NOT NULL ORDER BY started_at", params).fetchall()
    first_step, events = conn.execute(
        "SELECT min(ts) FILTER (WHERE kind = 'step'), count(*) > 0 FROM jobpulse.events"
        " WHERE cluster = %(c)s AND job_id = %(j)s", params).fetchone() or (None, False)
    minutes = [m for (m,) in conn.execute(
        "SELECT DISTINCT bucket FROM jobpulse.step_rollup WHERE width_s = 60 AND cluster = %(c)s AND job_id = %(j)s"
        " AND n > 0 ORDER BY bucket", params).fetchall()] if first_step is not None else []
    return Parts(buckets, [(p, s, e) for p, s, e in phases], first_step, bool(events), minutes)
