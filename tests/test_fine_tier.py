"""The 10 s GPU buckets live in their own table for a few days only: before them, the rules read the
same blocks binned from the samples and the dashboards the 300 s buckets; retention drops their
days while the 300 s buckets stay (a real collector over HTTP, real PostgreSQL)."""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest

from jobpulse.collector.rules.inputs import _read_blocks
from jobpulse.collector.store import partitions, rule_reads
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


def test_days_before_the_10s_buckets_read_the_same_blocks_and_the_300s_buckets(collector: RunningCollector,
                                                                                dsn: str) -> None:
    rng = random.Random(3)
    t0 = (now() - timedelta(days=4)).replace(second=0, microsecond=0)
    for seq in range(8):  # 8 minutes of 2 GPUs a second, a batch a minute, some samples without GPM
        samples = [wire.GpuSample(ts=t0 + timedelta(seconds=60 * seq + k), gpu_uuid=f"GPU-{i}", gpu_index=i,
                                  job_id="55", sm_util=rng.choice([0, 30, 95]), fb_used_mib=rng.randrange(80_000),
                                  power_w=200.0 + k, gpm_sm_active=None if k % 7 == 0 else rng.random() * 100)
                   for k in range(60) for i in range(2)]
        batch = wire.Batch(version=1, agent=AGENT, seq=seq, created_at=t0 + timedelta(seconds=60 * seq + 59),
                           gpu_samples=samples)
        assert post(collector, wire.encode(batch)).status_code == 200
    end = t0 + timedelta(minutes=8)

    with psycopg.connect(dsn, autocommit=True) as conn:
        since = conn.execute("SELECT jobpulse.gpu_rollup_10s_since()").fetchone()[0]
        assert t0 < since <= now(), "a day apart from today's run of partitions is not counted"

        # The rules' blocks binned from the samples are the blocks of the 10 s buckets, column for column.
        fine = conn.execute(rule_reads.BLOCKS, {"block": 60, "now": end, "c": ["testcluster"], "j": ["55"],
                                                "since": [t0], "from": t0}).fetchall()
        binned = conn.execute(rule_reads.BLOCKS_FROM_SAMPLES, {"block": 60, "now": end, "c": ["testcluster"],
                                                               "j": ["55"], "since": [t0], "from": t0}).fetchall()
        assert len(fine) == 2 * 8 and _same(fine, binned)
        assert sorted(_read_blocks(conn, 60, end, [("testcluster", "55")], [t0])[("testcluster", "55")]
                      [("n1", "GPU-0")], key=lambda b: b.block.start)[0].block.n == 60

        # Dashboards at 10 s steps read the 300 s buckets there.
        series = conn.execute("SELECT DISTINCT source FROM jobpulse.gpu_series('testcluster', '55', %s, %s, 20)",
                              (t0, end)).fetchall()
        assert series == [("gpu_rollup 300 s",)]

        # Retention takes the 10 s buckets' old day and leaves the 300 s ones.
        dropped = partitions.drop_expired(conn, 30)
        assert f"gpu_rollup_10s_p{t0:%Y%m%d}" in dropped and f"gpu_rollup_p{t0:%Y%m%d}" not in dropped
        assert conn.execute("SELECT sum(n) FROM jobpulse.gpu_rollup WHERE job_id = '55'").fetchone() == (2 * 480,)
        assert _same(conn.execute(rule_reads.BLOCKS_FROM_SAMPLES, {
            "block": 60, "now": end, "c": ["testcluster"], "j": ["55"], "since": [t0], "from": t0}).fetchall(), binned)
