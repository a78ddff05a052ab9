"""Roll-ups kept at ingest: every stored sample (and step event) is in its buckets exactly once,
the buckets agree with the raw rows, and the series functions (`gpu_series`, `rank_series`,
`step_series`) give the same means from each source."""

from __future__ import annotations

import random
from datetime import timedelta

import psycopg
import pytest

from jobpulse.schema import wire
from jobpulse.schema.semantics import IDLE_PERCENT

from .batches import AGENT, now
from .conftest import RunningCollector
from .test_ingest_http import post

RAW = """
SELECT width_s, count(*), sum(n), sum(sum_sm_util), sum(sum_sm_active), max(max_fb_used_mib), sum(n_idle),
       sum(n_busy), max(last_busy_ts), sum(n_gpm), sum(sum_power_w)
  FROM (SELECT * FROM jobpulse.gpu_rollup UNION ALL SELECT * FROM jobpulse.gpu_rollup_10s) r GROUP BY width_s ORDER BY width_s
"""


def test_rollup_matches_raw_samples_and_ignores_replays(collector: RunningCollector, dsn: str) -> None:
    rng = random.Random(7)
    t0 = now().replace(second=0) - timedelta(minutes=12)
    batches = []
    for seq in range(60):  # 6 min of 2 GPUs every 6 s, some samples without GPM or power
        ts = t0 + timedelta(seconds=6 * seq)
        batches.append(wire.Batch(version=1, agent=AGENT, seq=seq, created_at=ts, gpu_samples=[
            wire.GpuSample(ts=ts, gpu_uuid=f"GPU-{i}", gpu_index=i, job_id="77", sm_util=rng.choice([0, 1, 40, 90]),
                           fb_used_mib=rng.randrange(100_000), power_w=None if seq % 7 == 0 else 100.0 + seq,
                           gpm_sm_active=None if seq % 5 == 0 else rng.random() * 100) for i in range(2)],
            process_samples=[wire.ProcessSample(ts=ts, pid=100 + r, job_id="77", rank=r, gpu_uuid=f"GPU-{r}",
                                                cpu_percent=rng.random() * 200, sm_util=rng.randrange(100))
                             for r in range(2)],
            events=[wire.AppEvent(ts=ts, pid=100 + r, kind="step", job_id="77", rank=r,
                                  attrs={"step": seq, **({} if seq % 4 == 0 else {"samples_per_s": 50.0 * r + seq})})
                    for r in range(2)] + [wire.AppEvent(ts=ts, pid=100, job_id="77", rank=0, message="not a step")]))
    for b in batches:
        assert post(collector, wire.encode(b)).status_code == 200
    for b in batches[::9]:  # replays after an outage: acknowledged, not counted again
        assert post(collector, wire.encode(b)).json()["status"] == "duplicate"

    with psycopg.connect(dsn) as conn:
        raw = conn.execute("""
            SELECT count(*), sum(sm_util), sum(gpm_sm_active), max(fb_used_mib),
                   count(*) FILTER (WHERE coalesce(gpm_sm_active, sm_util) <= %(idle)s),
                   count(*) FILTER (WHERE coalesce(gpm_sm_active, sm_util) >= 50),
                   max(ts) FILTER (WHERE coalesce(gpm_sm_active, sm_util) > %(idle)s), count(gpm_sm_active),
                   sum(power_w)
              FROM jobpulse.gpu_samples""", {"idle": IDLE_PERCENT}).fetchone()
        rolled = conn.execute(RAW).fetchall()
        assert [r[0] for r in rolled] == [10, 300]
        assert rolled[0][1] == 2 * 36  # 6 min in 10 s buckets, per GPU (6 s steps leave no bucket empty)
        for width, _, *sums in rolled:
            assert sums[0] == raw[0] == 120
            assert [float(x) for x in sums[:6] + sums[7:]] == pytest.approx(
                [float(x) for x in raw[:6] + raw[7:]], rel=1e-6), width  # raw sums of real columns are float4
            assert sums[6] == raw[6]  # the last busy time

        procs = conn.execute("SELECT count(*), sum(cpu_percent), max(sm_util) FROM jobpulse.process_samples").fetchone()
        for width in (60, 300):
            rolled_procs = conn.execute("SELECT sum(n), sum(sum_cpu_percent), count(DISTINCT rank) FROM"
                                        " jobpulse.process_rollup WHERE width_s = %s", (width,)).fetchone()
            assert rolled_procs[0] == procs[0] == 120 and rolled_procs[2] == 2
            assert rolled_procs[1] == pytest.approx(procs[1], rel=1e-6)

        steps = conn.execute("SELECT count(*), count(samples_per_s), sum(samples_per_s), max(step_number)"
                             " FROM jobpulse.job_steps").fetchone()
        assert steps[:2] == (120, 90)
        for width in (60, 300):
            assert conn.execute("SELECT sum(n), sum(n_rate), sum(sum_samples_per_s), max(max_step_number)"
                                " FROM jobpulse.step_rollup WHERE width_s = %s", (width,)).fetchone() == steps

        # gpu_series: each source (samples for steps under 5 s, 10 s roll-ups below 150 s, 300 s ones
        # beyond or over 12 h) gives the raw samples' means over the same bins.
        def series(start: object, end: object, step: int) -> list[tuple]:
            return conn.execute("SELECT gpu_uuid, avg(sm_util), avg(sm_active), max(source) FROM"
                                " jobpulse.gpu_series('testcluster', '77', %s, %s, %s) GROUP BY 1 ORDER BY 1",
                                (start, end, step)).fetchall()

        def raw_bins(step: int) -> list[tuple]:
            return conn.execute("SELECT gpu_uuid, avg(u), avg(a) FROM (SELECT gpu_uuid, avg(sm_util::float8) AS u,"
                                " avg(gpm_sm_active::float8) AS a FROM jobpulse.gpu_samples GROUP BY gpu_uuid,"
                                " date_bin(make_interval(secs => %s), ts, timestamptz 'epoch')) b GROUP BY 1 ORDER BY 1",
                                (step,)).fetchall()
        cases = {"gpu_samples": (t0, t0 + timedelta(minutes=30), 2),
                 "gpu_rollup 10 s": (t0 - timedelta(hours=2), t0 + timedelta(minutes=60), 60),
                 "gpu_rollup 300 s": (t0 - timedelta(hours=23), t0 + timedelta(hours=2), 300),
                 "gpu_rollup 300 s ": (t0, t0 + timedelta(minutes=30), 300)}  # a short range at a long step
        for source, (start, end, step) in cases.items():
            got, want = series(start, end, step), raw_bins(step)
            assert {r[3] for r in got} == {source.strip()}, (start, end, step)
            assert [r[0] for r in got] == [r[0] for r in want] == ["GPU-0", "GPU-1"]
            for a, b in zip(got, want):
                assert a[1] == pytest.approx(b[1]) and a[2] == pytest.approx(b[2]), source
        binned = conn.execute("SELECT time FROM jobpulse.gpu_series('testcluster', '77', %s, %s, 3)",
                              (t0, t0 + timedelta(minutes=30))).fetchall()
        assert len(binned) == 2 * 60 and all(r[0].second % 3 == 0 for r in binned)  # 3 s bins of 60 samples a GPU
        # the finest step returns the samples as stored: their own times and values
        finest = conn.execute("SELECT time, gpu_uuid, sm_util FROM jobpulse.gpu_series('testcluster', '77', %s, %s, 1)"
                              " ORDER BY time, node, gpu_index", (t0, t0 + timedelta(minutes=30))).fetchall()
        assert finest == conn.execute("SELECT ts, gpu_uuid, sm_util::float8 FROM jobpulse.gpu_samples"
                                      " ORDER BY ts, node, gpu_index").fetchall()

        # ranks and steps: one mean per rank from raw rows, 60 s and 300 s roll-ups
        # rank_series: samples below 5 s steps, 10 s bins of them below 20 s, 60 s roll-ups below
        # 150 s, 300 s ones beyond; each gives the raw samples' means over the same bins
        def ranks(start: object, end: object, step: int) -> list[tuple]:
            return conn.execute("SELECT rank, avg(cpu_percent), avg(sm_util), max(source) FROM jobpulse.rank_series("
                                "'testcluster', '77', %s, %s, %s) GROUP BY 1 ORDER BY 1", (start, end, step)).fetchall()

        def raw_rank_bins(step: int) -> list[tuple]:
            return conn.execute("SELECT rank, avg(c), avg(u) FROM (SELECT rank, avg(cpu_percent::float8) AS c,"
                                " avg(sm_util::float8) AS u FROM jobpulse.process_samples GROUP BY rank,"
                                " date_bin(make_interval(secs => %s), ts, timestamptz 'epoch')) b GROUP BY 1 ORDER BY 1",
                                (step,)).fetchall()
        for source, (start, end, step) in {"process_samples": (t0, t0 + timedelta(minutes=30), 3),
                                           "process_samples 10 s bins": (t0, t0 + timedelta(minutes=30), 10),
                                           "process_rollup 60 s": (t0 - timedelta(hours=2), t0 + timedelta(hours=1), 60),
                                           "process_rollup 300 s": (t0, t0 + timedelta(minutes=30), 600)}.items():
            got, want = ranks(start, end, step), raw_rank_bins(step)
            assert {r[-1] for r in got} == {source} and [r[0] for r in got] == [r[0] for r in want] == [0, 1], source
            for a, b in zip(got, want):
                assert a[1] == pytest.approx(b[1]) and a[2] == pytest.approx(b[2]), source
        # step_series reads by range: step events up to 1 h, 60 s roll-ups up to 12 h, 300 s beyond
        def means(start: object, end: object) -> list[tuple]:
            return conn.execute("SELECT rank, avg(samples_per_s), max(step_number), max(source) FROM"
                                " jobpulse.step_series('testcluster', '77', %s, %s, 600) GROUP BY 1 ORDER BY 1",
                                (start, end)).fetchall()
        raw_rows = means(t0, t0 + timedelta(minutes=30))
        rolled_60 = means(t0 - timedelta(hours=2), t0 + timedelta(hours=1))
        rolled_300 = means(t0 - timedelta(hours=23), t0 + timedelta(hours=2))
        assert [r[0] for r in raw_rows] == [0, 1]
        assert {r[-1] for r in rolled_60} == {"step_rollup 60 s"} and {r[-1] for r in rolled_300} == {"step_rollup 300 s"}
        for a, b, c in zip(raw_rows, rolled_60, rolled_300):
            assert a[0] == b[0] == c[0] and a[1] == pytest.approx(b[1]) == pytest.approx(c[1])
            assert a[2] == pytest.approx(b[2]) == pytest.approx(c[2])
