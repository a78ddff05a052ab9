"""The ingest ledger's old days folded into runs of seqs: replays still found, gaps still open,
counts kept, the day's space given back (a real collector over HTTP, real PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import psycopg

from jobpulse.collector.store.tiers import ledger, partitions
from jobpulse.schema import wire

from .batches import gpu_batch, now
from .conftest import RunningCollector
from .test_ingest_http import post

AGENT = wire.AgentInfo(instance="fold-1", node="n7", cluster="testcluster", version="0.9", started_at=now())


def _send(c: RunningCollector, seq: int, days_ago: int = 3, **changes: object) -> str:
    batch = gpu_batch(seq, now() - timedelta(days=days_ago, seconds=-seq), agent=AGENT)
    batch = msgspec.structs.replace(batch, **changes)
    r = post(c, wire.encode(batch))
    assert r.status_code in (200, 409), r.text
    return str(r.json()["status"]) if r.status_code == 200 else "refused"


def _fold(dsn: str, retention_days: int = 30) -> ledger.Folded:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return ledger.fold(conn, partitions.utc_today() - timedelta(days=1), retention_days)


def _runs(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT first_seq, last_seq, batches, rows, dropped, node FROM jobpulse.ingest_ranges"
                            " ORDER BY first_seq").fetchall()


def test_folded_days_keep_replays_out_and_gaps_open(collector: RunningCollector, dsn: str) -> None:
    for seq in (0, 1, 2, 3, 4, 6):
        extra = {"dropped": wire.Dropped(gpu_samples=7)} if seq == 3 else {}
        assert _send(collector, seq, **extra) == "stored"
    # today's rows are not folded (another instance: only the runs remember this one)
    assert _send(collector, 9, days_ago=0, agent=msgspec.structs.replace(AGENT, instance="fold-2")) == "stored"

    # The collector's leader folds the ledger too, on its own schedule (its first pass may land between
    # two of the batches above): whichever folds come first, the ledger must read the same after them
    # all (a fold counts only what it found still unfolded, and merges runs that meet).
    done = _fold(dsn)
    old_day = partitions.utc_today() - timedelta(days=3)
    assert 0 <= done.batches <= 6
    assert _runs(dsn) == [(0, 4, 5, {"gpu_samples": 10}, {"gpu_samples": 7}, "n7"),
                          (6, 6, 1, {"gpu_samples": 2}, {}, "n7")]
    with psycopg.connect(dsn) as conn:
        assert old_day not in partitions.existing(conn)["ingest_batches"]  # the day's space is given back
        assert conn.execute("SELECT seq FROM jobpulse.ingest_batches").fetchall() == [(9,)]

    # A replay inside a run is a duplicate, whatever day it now claims; the gap's batch is new.
    assert _send(collector, 2) == "duplicate"
    assert _send(collector, 4, days_ago=0) == "duplicate"
    assert _send(collector, 5) == "stored"  # into its day, made again
    # The instance stays bound to its node once only its runs remember it.
    assert _send(collector, 7, agent=msgspec.structs.replace(AGENT, node="n8")) == "refused"
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone() == (16,)  # 8 batches x 2 GPUs

    # The next fold merges the late batch with the runs around it.
    again = _fold(dsn)
    assert again.batches in (0, 1) and again.dropped in ([], [old_day])
    with psycopg.connect(dsn) as conn:
        assert old_day not in partitions.existing(conn)["ingest_batches"]
    assert _runs(dsn) == [(0, 6, 7, {"gpu_samples": 14}, {"gpu_samples": 7}, "n7")]
    assert _send(collector, 5) == "duplicate"

    # Runs whose newest batch is past retention go (such a replay is refused at the door anyway).
    assert _fold(dsn, retention_days=2).expired == 1
    assert _runs(dsn) == []
