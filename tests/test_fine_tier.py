"""The 10 s GPU buckets live in their own table for a few days only: before them, the rules read the
same blocks binned from the samples and the dashboards the 300 s buckets; retention drops their
days while the 300 s buckets stay, and a batch days late makes none (a real collector over HTTP, real
PostgreSQL)."""

from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta

import psycopg
import pytest

from jobpulse.collector.rules.inputs import _read_blocks
from jobpulse.collector.store.read import rule_reads
from jobpulse.collector.store.tiers import partitions
from jobpulse.schema import wire

from .batches import AGENT, now
from .conftest import RunningCollector
from .test_ingest_http import post


def _same(a: list[tuple[object, ...]], b: list[tuple[object, ...]]) -> bool:
    """The same rows, floats within a millionth (real columns sum in float4, in another order from
    the samples than from the buckets' sums)."""
    return len(a) == len(b) and all(
        x == (pytest.approx(y, rel=1e-6) if isinstance(y, float) else y)
        for ra, rb in zip(sorted(a, key=str), sorted(b, key=str), strict=True) for x, y in zip(ra, rb, strict=True))


def _post_minutes(collector: RunningCollector, t0: datetime, seq0: int, rng: random.Random) -> None:
    """8 minutes of 2 GPUs a second from ``t0``, a batch a minute, some samples without GPM."""
    for seq in range(8):
        samples = [wire.GpuSample(ts=t0 + timedelta(seconds=60 * seq + k), gpu_uuid=f"GPU-{i}", gpu_index=i,
                                  job_id="55", sm_util=rng.choice([0, 30, 95]), fb_used_mib=rng.randrange(80_000),
                                  power_w=200.0 + k, gpm_sm_active=None if k % 7 == 0 else rng.random() * 100)
                   for k in range(60) for i in range(2)]
        batch = wire.Batch(version=1, agent=AGENT, seq=seq0 + seq, created_at=t0 + timedelta(seconds=60 * seq + 59),
                           gpu_samples=samples)
        r = post(collector, wire.encode(batch))
        assert r.status_code == 200, r.text


def _blocks(conn: psycopg.Connection, query: str, t0: datetime) -> list[tuple[object, ...]]:
    return conn.execute(query, {"block": 60, "now": t0 + timedelta(minutes=8), "c": ["testcluster"], "j": ["55"],
                                "since": [t0], "from": t0}).fetchall()


def test_days_before_the_10s_buckets_read_the_same_blocks_and_the_300s_buckets(collector: RunningCollector,
                                                                                dsn: str) -> None:
    rng = random.Random(3)
    t0 = (now() - timedelta(days=1)).replace(second=0, microsecond=0)  # late: ingest folds it itself
    _post_minutes(collector, t0, 0, rng)

    with psycopg.connect(dsn, autocommit=True) as conn:
        since = conn.execute("SELECT jobpulse.gpu_rollup_10s_since()").fetchone()[0]
        assert since <= t0 and since.date() == (now() - timedelta(days=1)).date()

        # The rules' blocks binned from the samples are the blocks of the 10 s buckets, column for column.
        fine, binned = _blocks(conn, rule_reads.BLOCKS, t0), _blocks(conn, rule_reads.BLOCKS_FROM_SAMPLES, t0)
        assert len(fine) == 2 * 8 and _same(fine, binned)
        assert sorted(_read_blocks(conn, 60, t0 + timedelta(minutes=8), [("testcluster", "55")], [t0])
                      [("testcluster", "55")][("n1", "GPU-0")], key=lambda b: b.block.start)[0].block.n == 60

        # Four days on, retention takes the 10 s buckets' day and leaves the 300 s ones; the
        # dashboards at 10 s steps read those there, the rules the samples.
        dropped = partitions.drop_expired(conn, 30, today=t0.date() + timedelta(days=4))
        day = f"{t0:%Y%m%d}"
        assert f"gpu_rollup_10s_p{day}" in dropped and f"gpu_rollup_p{day}" not in dropped
        assert conn.execute("SELECT sum(n) FROM jobpulse.gpu_rollup WHERE job_id = '55'").fetchone() == (2 * 480,)
        assert _same(_blocks(conn, rule_reads.BLOCKS_FROM_SAMPLES, t0), binned)
        series = conn.execute("SELECT DISTINCT source FROM jobpulse.gpu_series('testcluster', '55', %s, %s, 20)",
                              (t0, t0 + timedelta(minutes=8))).fetchall()
        assert series == [("gpu_rollup 300 s",)]


def test_a_batch_days_late_gets_no_10s_buckets_while_retention_runs(collector: RunningCollector, dsn: str) -> None:
    """Days older than the 10 s buckets' run are read from the samples: a late batch of one makes no
    10 s partition that retention would drop again, maybe while the next batch writes to it (a 503
    the agent then retries). Retention runs all the while, as the leader's maintenance would."""
    t0 = (now() - timedelta(days=4)).replace(second=0, microsecond=0)
    stop = threading.Event()
    drops: list[str] = []

    def retention() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                drops.extend(partitions.drop_expired(conn, 30))
                stop.wait(0.005)

    thread = threading.Thread(target=retention)
    thread.start()
    try:
        _post_minutes(collector, t0, 100, random.Random(4))
    finally:
        stop.set()
        thread.join()
    assert drops == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert t0.date() not in partitions.existing(conn)["gpu_rollup_10s"]
        assert t0.date() in partitions.common_days(conn)
        assert conn.execute("SELECT sum(n) FROM jobpulse.gpu_rollup WHERE job_id = '55'").fetchone() == (2 * 480,)
        assert len(_blocks(conn, rule_reads.BLOCKS_FROM_SAMPLES, t0)) == 2 * 8
        series = conn.execute("SELECT DISTINCT source FROM jobpulse.gpu_series('testcluster', '55', %s, %s, 20)",
                              (t0, t0 + timedelta(minutes=8))).fetchall()
        assert series == [("gpu_rollup 300 s",)]
