"""Store: fold the samples ingest left raw into their roll-ups, a few seconds behind it.

Folded as it is stored, every GPU sample would update two bucket rows (10 s and 300 s) and every
process sample two more (60 s and 300 s): a node's second of samples would cost more in those
upserts than in storing it (bench/ingest.py). Folded behind ingest, the ten samples of a 10 s bucket make one upsert,
and the upserts of all nodes' seconds one statement.

Which samples a fold takes is set by one time, ``jobpulse.fold_mark.folded_before`` (the mark):

- the ingest statement folds the rows it stores whose time is before the mark (late batches, spool
  replays: their buckets are behind the leader's) and leaves the others raw (`pending`);
- the leader (`run`) folds the raw rows from the mark to a little before now and moves the mark there.

Each sample is folded exactly once because a group's transaction holds the mark's lock shared and
the leader's holds it alone (`LOCK_SHARED`, `run`): the leader moves the mark only once every group
that read the old mark has committed, and reads the rows under the new one. A database no leader has
marked yet (NULL) folds every sample at ingest; the first run sets the mark after every stored
sample. The leader folds whole 10 s buckets (``ALIGN``), so a bucket appears within the lag plus
the fold's interval after it ends (2-7 s). A rule cycle folds up to its start (`engine.evaluate`:
nothing pending when the rules read) and so does compaction (no raw row is packed unfolded).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from jobpulse.collector.store.connect import connect
from jobpulse.collector.store.tiers import rollup

LOCK_KEY = 0x666F6C64  # "fold"
LOCK_SHARED = f"SELECT pg_advisory_xact_lock_shared({LOCK_KEY})"
DEFERRED = ("gpu_samples", "process_samples")  # the tables whose samples the leader folds
# Samples sent as they are taken arrive within a second or two: left to the leader, not to ingest.
LAG = timedelta(seconds=2)
# The leader folds whole 10 s buckets: each of them is then written once, not updated by the next
# fold (as a fold every 5 s up to any time did), and the 300 s buckets are updated half as often.
ALIGN = timedelta(seconds=rollup.FINE_WIDTH_S)
_MARK = "(SELECT coalesce(folded_before, 'infinity') FROM jobpulse.fold_mark)"
READ_MARK = "SELECT folded_before FROM jobpulse.fold_mark"  # in a group, under LOCK_SHARED: it cannot move


def folds_at_ingest(table: str, oldest: datetime, mark: datetime | None) -> bool:
    """Whether rows of ``table`` whose oldest time is ``oldest``, stored while the mark is ``mark``,
    hold any that ingest folds (`pending`). Live batches hold none: their fold statements, wide
    ones whose start-up alone costs a group more than the move of its rows, are then not sent."""
    return table not in DEFERRED or mark is None or oldest < mark


def pending(table: str, source: str) -> str:
    """The rows of ``source`` (rows of ``table`` being stored) that ingest folds itself: all of them
    for a table the leader does not fold, else those before the mark."""
    return f"(SELECT * FROM {source} WHERE ts < {_MARK})" if table in DEFERRED else source


@dataclass(frozen=True)
class Folded:
    start: datetime | None
    """The mark before the run (None: unset, nothing folded)."""
    end: datetime | None
    """The mark after it."""


def run(conn: psycopg.Connection[Any], lag: timedelta = LAG, now: datetime | None = None, *,
        begin: bool = True, align: timedelta | None = None) -> Folded:
    """Fold the raw samples from the mark to ``lag`` before ``now`` (the database's), rounded down to
    a multiple of ``align`` when given (the leader's whole buckets), and move the mark there; when
    unset, set it after every stored sample (``begin``: the leader's first fold) or leave it (a
    one-off writer: nothing is left raw without a leader); commits."""
    with conn.transaction():
        conn.execute(f"SELECT pg_advisory_xact_lock({LOCK_KEY})")  # waits for the groups that read the mark
        start = conn.execute("SELECT folded_before FROM jobpulse.fold_mark").fetchone()
        if start is None:
            raise psycopg.errors.UndefinedObject("jobpulse.fold_mark has no row: run `jobpulse db upgrade`")
        if start[0] is None and not begin:
            return Folded(None, None)
        if start[0] is None:  # every sample stored so far was folded at ingest, future times included
            end = conn.execute(
                "SELECT greatest(now(), (SELECT max(ts) FROM jobpulse.gpu_samples WHERE ts >= now()),"
                " (SELECT max(ts) FROM jobpulse.process_samples WHERE ts >= now())) + interval '1 microsecond'"
            ).fetchone()
            assert end is not None
            conn.execute("UPDATE jobpulse.fold_mark SET folded_before = %s", (end[0],))
            return Folded(None, end[0])
        row = conn.execute("SELECT greatest(%(start)s, date_bin(coalesce(%(align)s, interval '1 microsecond'),"
                           " coalesce(%(now)s::timestamptz, now()) - %(lag)s, timestamptz 'epoch'))",
                           {"start": start[0], "align": align, "now": now, "lag": lag}).fetchone()
        assert row is not None
        end = row[0]
        if end > start[0]:
            for table in DEFERRED:
                source = f"(SELECT * FROM jobpulse.{table} WHERE ts >= %(lo)s AND ts < %(hi)s)"
                for statement in rollup.fold_behind(table, source):
                    conn.execute(statement, {"lo": start[0], "hi": end})
            conn.execute("UPDATE jobpulse.fold_mark SET folded_before = %s", (end,))
        return Folded(start[0], end)


def catch_up(dsn: str, wait: timedelta = timedelta(seconds=5)) -> Folded:
    """What a one-off writer runs when it is done (a stopping collector, an import): `run` up to now
    on a connection of its own, waiting at most ``wait`` for the mark's lock; an unset mark stays."""
    with connect(dsn, connect_timeout=5) as conn:
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{wait.total_seconds() * 1000:.0f}ms",))
        return run(conn, timedelta(0), begin=False)
