"""Roll-ups folded behind ingest (collector/store/tiers/fold.py): samples after the mark wait raw for the
leader's fold, late ones are folded as they are stored, and every sample lands in its buckets exactly
once while groups and folds run at the same time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from jobpulse.collector.store.database import Storage, ValidBatch
from jobpulse.collector.store.tiers import compact, fold, rollup
from jobpulse.schema import wire

from .batches import full_batch, gpu_batch


def _agent(node: str) -> wire.AgentInfo:
    return wire.AgentInfo(instance=f"inst-{node}", node=node, cluster="fold", version="0.1.0",
                          started_at=datetime(2026, 1, 1, tzinfo=UTC))


def _valid(seq: int, t0: datetime, node: str = "n1") -> ValidBatch:
    batch = full_batch(seq, t0, agent=_agent(node))
    return ValidBatch.spanning(batch, t0, t0 + timedelta(seconds=1))


def _store(dsn: str, groups: Iterable[list[ValidBatch]]) -> None:
    async def go() -> None:
        storage = Storage(dsn)
        await storage.open()
        try:
            for group in groups:
                await storage.store(group)
        finally:
            await storage.close()
    asyncio.run(go())


def _folded(conn: psycopg.Connection) -> tuple[int, int, int, int]:
    """Samples counted in the 10 s, 300 s GPU buckets and the 60 s, 300 s process buckets."""
    row = conn.execute(
        "SELECT (SELECT coalesce(sum(n), 0) FROM jobpulse.gpu_rollup_10s),"
        " (SELECT coalesce(sum(n), 0) FROM jobpulse.gpu_rollup WHERE width_s = 300),"
        " (SELECT coalesce(sum(n), 0) FROM jobpulse.process_rollup WHERE width_s = 60),"
        " (SELECT coalesce(sum(n), 0) FROM jobpulse.process_rollup WHERE width_s = 300)").fetchone()
    assert row is not None
    return tuple(int(v) for v in row)  # type: ignore[return-value]


def _buckets_match_samples(conn: psycopg.Connection) -> None:
    """Every bucket holds what binning all stored samples gives: each sample folded once, every
    column (the leader's 300 s buckets are made of its 10 s ones) but the link first seen, which
    keeps the first folded."""
    columns = [c for c in rollup.COLUMNS["gpu_rollup"][1] if c != "pcie_link_low"]
    for table, width in ((rollup.FINE_TABLE, rollup.FINE_WIDTH_S), ("gpu_rollup", rollup.WIDTH_S)):
        diff = conn.execute(f"""
            SELECT coalesce(a.bucket, b.bucket), a.n, b.n
              FROM (SELECT * FROM jobpulse.{table} WHERE width_s = {width}) a
              FULL JOIN ({rollup.gpu_buckets("jobpulse.gpu_samples", width)}) b
                USING (cluster, job_id, node, gpu_uuid, bucket)
             WHERE {" OR ".join(f"a.{c} IS DISTINCT FROM b.{c}" for c in columns)}""").fetchall()
        assert diff == [], (table, diff[:5])
    keys, process = rollup.COLUMNS["process_rollup"]
    diff = conn.execute(f"""
        SELECT width_s, bucket, node, pid, r.n, s.n
          FROM (SELECT * FROM jobpulse.process_rollup WHERE width_s IN (60, 300)) r
          FULL JOIN (SELECT w.width_s, date_bin(make_interval(secs => w.width_s), p.ts, timestamptz 'epoch') AS bucket,
                            {", ".join(f"p.{k}" for k in keys)}, {", ".join(f"{agg} AS {c}" for c, (agg, _) in process.items())}
                       FROM jobpulse.process_samples p, (VALUES (60::smallint), (300::smallint)) AS w(width_s)
                      GROUP BY 1, 2, {", ".join(f"p.{k}" for k in keys)}) s
          USING (width_s, bucket, {", ".join(keys)})
         WHERE {" OR ".join(f"r.{c} IS DISTINCT FROM s.{c}" for c in process)}""").fetchall()
    assert diff == [], diff[:5]


def test_samples_after_the_mark_wait_for_the_leader_and_late_ones_fold_as_stored(dsn: str) -> None:
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    _store(dsn, [[_valid(0, t0)]])  # no mark yet: folded as stored
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _folded(conn) == (2, 2, 1, 1)
        first = fold.run(conn)
        assert first.start is None and first.end > t0, "the first run only sets the mark after every sample"
        assert _folded(conn) == (2, 2, 1, 1), "nothing folded twice"
    recent, late = datetime.now(UTC), t0 - timedelta(hours=1)
    _store(dsn, [[_valid(1, recent), _valid(2, late)]])
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _folded(conn) == (4, 4, 2, 2), "the late batch folded as stored, the recent one left raw"
        fold.run(conn, timedelta(0))
        assert _folded(conn) == (6, 6, 3, 3)
        _buckets_match_samples(conn)
        _store(dsn, [[_valid(1, recent)]])  # a replay: a duplicate, neither stored nor folded again
        fold.run(conn, timedelta(0))
        assert _folded(conn) == (6, 6, 3, 3)


def test_the_leader_folds_whole_buckets_and_writes_each_10s_bucket_once(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        mark = fold.run(conn).end
        assert mark is not None
        width = fold.ALIGN.total_seconds()
        edge = datetime.fromtimestamp((mark.timestamp() // width + 2) * width, UTC)  # a bucket's end after the mark
        before = _folded(conn)
        _store(dsn, [[_valid(1, edge - timedelta(seconds=5)), _valid(2, edge + timedelta(seconds=1))]])
        done = fold.run(conn, timedelta(0), now=edge + timedelta(seconds=3), align=fold.ALIGN)
        assert done.end == edge, "the mark stops at the last whole bucket"
        gpu, _, process, _ = _folded(conn)
        assert (gpu - before[0], process - before[2]) == (2, 1), "the sample after it waits for the next fold"

        def version() -> tuple[str, ...]:
            row = conn.execute(f"SELECT ctid::text, xmin::text FROM jobpulse.{rollup.FINE_TABLE}"
                               " WHERE bucket = %s", (edge - fold.ALIGN,)).fetchone()
            assert row is not None
            return tuple(row)

        written = version()
        fold.run(conn, timedelta(0), now=edge + timedelta(seconds=13), align=fold.ALIGN)
        assert version() == written, "a whole bucket is not updated by the next fold"
        assert _folded(conn)[0] - before[0] == 4
        _buckets_match_samples(conn)


def test_groups_and_folds_at_the_same_time_fold_every_sample_once(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        fold.run(conn)
    stop = threading.Event()
    runs = []

    def leader() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                runs.append(fold.run(conn, timedelta(milliseconds=300)))

    folding = threading.Thread(target=leader)
    folding.start()
    try:
        def groups() -> Iterator[list[ValidBatch]]:
            for s in range(40):  # 4 nodes, sampled as they are stored; every tenth group an hour-old batch too
                time.sleep(0.05)
                t = datetime.now(UTC) - timedelta(milliseconds=200)
                group = [_valid(s, t, f"n{k}") for k in range(4)]
                if s % 10 == 0:
                    group.append(_valid(1000 + s, t - timedelta(hours=1), "late"))
                yield group

        _store(dsn, groups())
    finally:
        stop.set()
        folding.join()
    with psycopg.connect(dsn, autocommit=True) as conn:
        fold.run(conn, timedelta(0))
        samples = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]
        assert samples == 2 * (40 * 4 + 4)
        assert _folded(conn)[:2] == (samples, samples)
        _buckets_match_samples(conn)
    assert len([r for r in runs if r.end > r.start]) > 1, "the leader folded while groups were stored"


@pytest.mark.parametrize("make", [full_batch, gpu_batch], ids=["with job records", "samples only"])
def test_a_group_waits_while_the_leader_moves_the_mark(dsn: str, make: Callable[..., wire.Batch]) -> None:
    """Without the shared lock a group could read the old mark, and the leader fold past its rows
    before they commit: they would never be folded."""
    t = datetime.now(UTC)
    batch = ValidBatch.spanning(make(0, t, agent=_agent("n1")), t, t)
    with psycopg.connect(dsn) as leader:
        leader.execute(f"SELECT pg_advisory_xact_lock({fold.LOCK_KEY})")
        storing = threading.Thread(target=_store, args=(dsn, [[batch]]))
        storing.start()
        storing.join(1.0)
        assert storing.is_alive(), "the group waited for the leader's fold"
        leader.commit()
    storing.join(30)
    assert not storing.is_alive()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0] == len(batch.batch.gpu_samples)


def test_compaction_folds_what_the_leader_left_before_packing_it(dsn: str) -> None:
    """A sample packed into the compact tier before its fold would never reach its buckets."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        fold.run(conn)
    time.sleep(1.0)
    t = datetime.now(UTC) - timedelta(milliseconds=500)  # after the mark the first fold set
    _store(dsn, [[_valid(0, t)]])
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _folded(conn) == (0, 0, 0, 0), "left to the leader"
        done = compact.compact(conn, hot_hours=0, duty=1.0, now=datetime.now(UTC) + compact.CHUNK)
        assert done.samples["gpu_samples"] == 2
        assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0] == 0, "packed"
        assert _folded(conn) == (2, 2, 1, 1)
