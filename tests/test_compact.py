"""The compact tier: a compacted range reads back exactly what the raw rows held (every value, through
the views, `gpu_series`, `rank_series` and the report), late data is merged into its chunk, a
compaction killed with SIGKILL loses and duplicates nothing, a backtest over a compacted range
raises the flags it raised over the raw rows and long ranges read the coarse buckets compaction
made, retention and `db stats` by tier."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobpulse.collector.store.read import reports
from jobpulse.collector.store.tiers import coarse, compact, partitions
from jobpulse.schema.fields import GPU_BY_NAME

from .conftest import RunningCollector
from .scenario_replay import backtest, seed
from .scenarios import library
from .test_schema_db import jobpulse_cli

GPU_ORDER = "ORDER BY cluster, node, gpu_uuid, ts, sm_util, mem_util"
PROCESS_ORDER = "ORDER BY cluster, node, pid, ts, gpu_uuid NULLS FIRST"
SM_ACTIVE = GPU_BY_NAME["gpm_sm_active"]


def straddling_start() -> datetime:
    """An hour before a chunk boundary three days ago: past the 48 h hot window, and samples of
    more than an hour from it fall into two chunks."""
    chunk_s = int(compact.CHUNK.total_seconds())
    boundary = int((datetime.now(UTC) - timedelta(days=3)).timestamp()) // chunk_s * chunk_s
    return datetime.fromtimestamp(boundary, UTC) - timedelta(hours=1)


def _write(conn: psycopg.Connection, t0: datetime, seconds: int, rng: random.Random, nodes: int = 1) -> None:
    """GPU and process samples with NULLs, extremes, exact and inexact reals, jittered and repeated
    timestamps, a GPU without a job, processes with changing text and a constant with NULLs."""
    partitions.ensure(conn, sorted({(t0 + timedelta(seconds=s)).date() for s in (0, seconds)}))
    gpu_cols = ("cluster, node, ts, gpu_uuid, gpu_index, job_id, sm_util, mem_util, power_w, energy_mj, gpu_temp_c,"
                " fb_used_mib, clock_event_reasons, remap_pending, gpm_sm_active, gpm_fp64_active, nvlink_rx_kbs")
    with conn.cursor() as cur:
        with cur.copy(f"COPY jobpulse.gpu_samples ({gpu_cols}) FROM STDIN") as cp:
            for node in range(nodes):
                for g in range(3):
                    for s in range(seconds):
                        ts = t0 + timedelta(seconds=s, microseconds=rng.randrange(1500) if s % 50 else 0)
                        cp.write_row((
                            "c", f"n{node}", ts, f"GPU-{g}", g, None if g == 2 else "42",
                            rng.randrange(101), None if s % 7 == 0 else rng.randrange(101),
                            rng.randrange(80_000, 700_000) / 1000 if g else rng.choice([1e-40, 3.4e38, 0.1, None]),
                            2**63 - 1 if (g, s) == (0, 5) else 10**12 + s * 412_345 + rng.randrange(1000),
                            rng.choice([-273, 1000, 60]) if g == 1 else 60 + s // 600,
                            72_000, rng.choice([0, 1, 2**62]) if g == 0 else 0,
                            None if g == 2 else s % 100 == 0,
                            SM_ACTIVE.quantize(rng.random() * 100) if g == 1 else rng.random() * 100 if g else None,
                            -0.0 if s % 3 == 0 else 0.0, rng.randrange(10**9) if g == 1 else None))
                        if s == 17:  # a second sample at the same time
                            cp.write_row(("c", f"n{node}", ts, f"GPU-{g}", g, None if g == 2 else "42", 1, 2, 3.5,
                                          0, 0, 0, 0, False, 1.25, 0.0, 0))
        with cur.copy("COPY jobpulse.process_samples (cluster, node, ts, pid, gpu_uuid, job_id, step, rank,"
                      " local_rank, gpu_mem_mib, sm_util, cpu_percent, rss_mib, command, cpu) FROM STDIN") as cp:
            for node in range(nodes):
                for s in range(0, seconds, 2):
                    for p in range(3):
                        cp.write_row(("c", f"n{node}", t0 + timedelta(seconds=s, microseconds=rng.randrange(900)),
                                      100 + p, None if p == 2 else f"GPU-{p}", None if p == 2 else "42",
                                      "0" if s < seconds // 2 else "1", p if p < 2 else None, p, None if s % 10 == 0 else 40_000 + p,
                                      rng.randrange(101), rng.random() * 300, 1000 + s // 100,
                                      ["python", "pt_data_worker", "näive \u2603"][(s // 2 + p) % 3],
                                      rng.randrange(64)))


def _reads(conn: psycopg.Connection, t0: datetime) -> dict[str, Any]:
    """Everything the readers return for the range: rows, series, the report's ranks."""
    q = "SELECT * FROM jobpulse.{}_all WHERE ts >= %s AND ts < %s " + "{}"
    hi = t0 + timedelta(hours=3)
    return {
        "gpu": conn.execute(q.format("gpu_samples", GPU_ORDER), (t0, hi)).fetchall(),
        "process": conn.execute(q.format("process_samples", PROCESS_ORDER), (t0, hi)).fetchall(),
        **{f"gpu_series {step}": conn.execute(
            "SELECT * FROM jobpulse.gpu_series('c', '42', %s, %s, %s) ORDER BY 1, 2, 3",
            (t0 + timedelta(minutes=30), t0 + timedelta(minutes=90), step)).fetchall() for step in (0, 10)},
        "rank_series": conn.execute("SELECT * FROM jobpulse.rank_series('c', '42', %s, %s, 10) ORDER BY 1, 2",
                                    (t0 + timedelta(minutes=30), t0 + timedelta(minutes=90))).fetchall(),
        "report ranks": reports.job(conn, "42", "c")["ranks"],
        "a quarter hour": conn.execute(f"SELECT * FROM jobpulse.gpu_samples_between(%s, %s) {GPU_ORDER}",
                                       (t0 + timedelta(minutes=77, microseconds=700),
                                        t0 + timedelta(minutes=92, microseconds=300))).fetchall(),
        # bounds on samples' own timestamps: both ends are in the range (tested on the time codes)
        "a quarter hour of processes": conn.execute(
            f"SELECT * FROM jobpulse.process_samples_between("
            f"(SELECT min(ts) FROM jobpulse.process_samples_all WHERE ts >= %(lo)s),"
            f" (SELECT max(ts) FROM jobpulse.process_samples_all WHERE ts <= %(hi)s)) {PROCESS_ORDER}",
            {"lo": t0 + timedelta(minutes=77), "hi": t0 + timedelta(minutes=92)}).fetchall(),
    }


@pytest.fixture
def conn(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("INSERT INTO jobpulse.jobs (cluster, job_id) VALUES ('c', '42')")
        yield c


def test_compacted_range_reads_back_every_value(conn: psycopg.Connection, dsn: str) -> None:
    t0 = straddling_start()
    _write(conn, t0, 2 * 3600 + 600, random.Random(3))  # two chunks, the second one partial
    raw = {"gpu": conn.execute(f"SELECT * FROM jobpulse.gpu_samples {GPU_ORDER}").fetchall(),
           "process": conn.execute(f"SELECT * FROM jobpulse.process_samples {PROCESS_ORDER}").fetchall()}
    before = _reads(conn, t0)
    assert before["gpu"] == raw["gpu"] and before["process"] == raw["process"]
    assert len(before["gpu_series 0"]) > 3000 and before["report ranks"]

    r = jobpulse_cli("db", "compact", "--dsn", dsn, "--duty", "1")
    assert r.returncode == 0, r.stderr
    assert "compacted 4 chunks" in r.stdout, r.stdout
    assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM jobpulse.process_samples").fetchone() == (0,)
    after = _reads(conn, t0)
    for what, rows in before.items():
        assert after[what] == rows, what
    assert {r[-1] for r in after["rank_series"]} == {"process_samples 10 s bins"}
    # a chunk compacted before the rank bins existed: rank_series bins its samples itself
    conn.execute("DELETE FROM jobpulse.rank_bins_compact WHERE chunk_start = %s",
                 (conn.execute("SELECT min(chunk_start) FROM jobpulse.rank_bins_compact").fetchone()[0],))
    assert conn.execute("SELECT jobpulse.rank_bins_missing('c', '42', %s, %s)",
                        (t0 + timedelta(minutes=30), t0 + timedelta(minutes=90))).fetchone() == (True,)
    assert _reads(conn, t0)["rank_series"] == before["rank_series"]
    # one row per (GPU, job, chunk): the GPU without a job has its own
    assert conn.execute("SELECT count(*), sum(n) FROM jobpulse.gpu_samples_compact").fetchone() == (6, len(raw["gpu"]))
    # reals at their declared resolution are stored as its multiples (GPU-1's GPM, GPU-0's NULLs and
    # 1.25), others (GPU-2's GPM, GPU-0's powers) by their bits: either way they read back exactly
    assert conn.execute("SELECT gpu_uuid, min(gpm_sm_active_scale), min(power_w_scale) FROM jobpulse.gpu_samples_compact"
                        " GROUP BY 1 ORDER BY 1").fetchall() == [("GPU-0", 100, 0), ("GPU-1", 100, 1000),
                                                                 ("GPU-2", 0, 1000)]
    # a highest byte plane of at most 4 bits (temperatures, the timestamps' jitter) is packed 2 or 4 to a byte
    assert conn.execute("SELECT bool_or(gpu_temp_c_m = 2 AND gpu_temp_c_top IS NOT NULL), bool_or(ts_m > 1),"
                        " bool_or(remap_pending_m = 4) FROM jobpulse.gpu_samples_compact").fetchone() == (True,) * 3
    assert compact.lz4_supported(conn)
    assert conn.execute("SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'sm_util'",
                        (f"jobpulse.gpu_samples_compact_p{t0:%Y%m%d}",)).fetchone() == ("l",)

    conn.execute("VACUUM ANALYZE")
    r = jobpulse_cli("db", "stats", "--dsn", dsn)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[1]: line.split() for line in r.stdout.splitlines()[1:]}
    assert lines["gpu_samples"][2:4] == ["0", "0"]
    assert lines["gpu_samples_compact"][2:4] == ["6", f"{len(raw['gpu']):,}"]
    assert float(lines["process_samples_compact"][5]) > 0


def test_late_data_is_merged_into_its_chunk(conn: psycopg.Connection) -> None:
    t0 = straddling_start()
    _write(conn, t0, 1800, random.Random(4))
    compact.compact(conn, duty=1)
    _write(conn, t0 + timedelta(minutes=10), 300, random.Random(5))  # late: the same chunk, after compaction
    expected = sorted(conn.execute(f"SELECT * FROM jobpulse.gpu_samples_all {GPU_ORDER}").fetchall(), key=repr)
    processes = conn.execute(f"SELECT * FROM jobpulse.process_samples_all {PROCESS_ORDER}").fetchall()
    # 10 s bins of ranks over the late minutes: each bin partly raw (late), partly compacted
    ranks = "SELECT * FROM jobpulse.rank_series('c', '42', %s, %s, 10) ORDER BY 1, 2"
    window = (t0 + timedelta(minutes=5), t0 + timedelta(minutes=20))
    binned = conn.execute(ranks, window).fetchall()
    assert {r[-1] for r in binned} == {"process_samples 10 s bins"}
    done = compact.compact(conn, duty=1)
    assert done.chunks == 2 and done.samples == {"gpu_samples": len(expected), "process_samples": len(processes)}
    assert sorted(conn.execute(f"SELECT * FROM jobpulse.gpu_samples_all {GPU_ORDER}").fetchall(), key=repr) == expected
    assert conn.execute(f"SELECT * FROM jobpulse.process_samples_all {PROCESS_ORDER}").fetchall() == processes
    assert conn.execute(ranks, window).fetchall() == binned  # one bin row each now, the same sums
    assert_binned_once(conn)
    assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples_compact").fetchone() == (3,)
    assert compact.compact(conn, duty=1).chunks == 0  # nothing left to do


def assert_binned_once(conn: psycopg.Connection) -> None:
    """Every process sample of a job's rank, all compacted, is in the compact tier's rank bins once."""
    assert conn.execute("SELECT count(*) FROM jobpulse.process_samples").fetchone() == (0,)
    assert conn.execute("SELECT coalesce(sum(n), 0) FROM jobpulse.rank_bins_compact").fetchone() == conn.execute(
        "SELECT count(*) FROM jobpulse.process_samples_all WHERE job_id IS NOT NULL AND rank IS NOT NULL").fetchone()


def test_late_data_merges_rows_of_hour_long_chunks(conn: psycopg.Connection,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A database compacted when a chunk was an hour: late data for one of those hours is merged
    with all of them into one six-hour row, nothing read twice or lost."""
    t0 = straddling_start() - timedelta(hours=3)  # three hours, all in the chunk before the boundary
    _write(conn, t0, 3 * 3600, random.Random(7))
    with monkeypatch.context() as old:
        old.setattr(compact, "CHUNK", timedelta(hours=1))
        assert compact.compact(conn, duty=1).chunks == 6
    assert conn.execute("SELECT count(DISTINCT chunk_start) FROM jobpulse.gpu_samples_compact").fetchone() == (3,)
    _write(conn, t0 + timedelta(minutes=70), 120, random.Random(8))  # late, in the second hour
    expected = sorted(conn.execute(f"SELECT * FROM jobpulse.gpu_samples_all {GPU_ORDER}").fetchall(), key=repr)
    processes = conn.execute(f"SELECT * FROM jobpulse.process_samples_all {PROCESS_ORDER}").fetchall()
    assert compact.compact(conn, duty=1).chunks == 2
    assert sorted(conn.execute(f"SELECT * FROM jobpulse.gpu_samples_all {GPU_ORDER}").fetchall(), key=repr) == expected
    assert conn.execute(f"SELECT * FROM jobpulse.process_samples_all {PROCESS_ORDER}").fetchall() == processes
    rows = conn.execute("SELECT count(DISTINCT chunk_start), count(*) FROM jobpulse.gpu_samples_compact").fetchone()
    assert rows == (1, 3)


def test_kill_9_in_the_middle_of_compaction_loses_and_duplicates_nothing(conn: psycopg.Connection, dsn: str) -> None:
    t0 = straddling_start()
    _write(conn, t0, 2 * 3600, random.Random(6), nodes=2)  # 8 chunks
    everything = "SELECT * FROM jobpulse.{}_all " + "{}"
    expected = {t: conn.execute(everything.format(t, o)).fetchall()
                for t, o in (("gpu_samples", GPU_ORDER), ("process_samples", PROCESS_ORDER))}
    killed_in_transaction = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "jobpulse.collector.cli", "db", "compact", "--dsn", dsn,
                                 "--duty", "0.5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:  # wait until a chunk is being written
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE xact_start IS NOT NULL"
                               " AND query LIKE '%%_compact%%' AND pid <> pg_backend_pid()").fetchone()
            if row and row[0]:
                proc.send_signal(signal.SIGKILL)
                killed_in_transaction += 1
                break
            time.sleep(0.005)
        proc.wait(timeout=10)
        time.sleep(0.3)  # the server notices the lost client and rolls its transaction back
        for table, order in (("gpu_samples", GPU_ORDER), ("process_samples", PROCESS_ORDER)):
            assert conn.execute(everything.format(table, order)).fetchall() == expected[table], table
    assert killed_in_transaction >= 1
    assert 0 < conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]  # it was cut short
    compact.compact(conn, duty=1)  # resumes where the killed runs stopped
    for table, order in (("gpu_samples", GPU_ORDER), ("process_samples", PROCESS_ORDER)):
        assert conn.execute(everything.format(table, order)).fetchall() == expected[table], table
        assert conn.execute(f"SELECT count(*) FROM jobpulse.{table}").fetchone() == (0,)
    assert_binned_once(conn)


# Jobs whose flags need process samples (which rank runs where, from which CPUs) besides roll-ups.
BACKTESTED = ("numa_far_rank1", "ib_workers0", "ib_too_few_workers", "idle_one_of_4", "trap_bursty_inference")


def _long_series(conn: psycopg.Connection, jobs: list[str], t0: datetime) -> dict[str, list[tuple[Any, ...]]]:
    """What panels over a range of hours read: half-hour and hourly steps of every series (without
    the column saying which source answered)."""
    lo, hi = t0 - timedelta(hours=6), t0 + timedelta(hours=7)  # > 12 h: the 300 s buckets
    return {f"{fn} {job} {step}": [tuple(r[:-1]) for r in conn.execute(
                f"SELECT * FROM jobpulse.{fn}('lib', %s, %s, %s, %s) ORDER BY 1, 2, 3", (job, lo, hi, step))]
            for fn in ("gpu_series", "rank_series") for job in jobs for step in (1800, 3600)}


@pytest.mark.timeout(600)
def test_compacted_range_backtests_and_draws_as_before(collector: RunningCollector, dsn: str) -> None:
    """A backtest over a compacted range raises the flags it raised over the raw rows (processes
    included), and long-range series read the coarse buckets compaction made, with the values the
    300 s buckets gave."""
    lib = [s for s in library() if s.name in BACKTESTED]
    assert len(lib) == len(BACKTESTED)
    longest = max(s.duration_s for s in lib)
    t0 = (datetime.now(UTC) - timedelta(seconds=longest + 300)).replace(second=0, microsecond=0)
    seed(collector, lib, t0)
    end = t0 + timedelta(seconds=longest + 120)
    before = backtest(dsn, t0, end)
    assert {"numa_far", "input_bound", "idle_gpu"} <= {f["rule_id"] for f in before}, before
    jobs = [s.job_id for s in lib]

    with psycopg.connect(dsn, autocommit=True) as c:  # every hour so far is past a hot window ending now
        drawn = _long_series(c, jobs, t0)
        assert all(drawn.values())
        assert c.execute("SELECT count(*) FROM jobpulse.gpu_rollup WHERE width_s = %s",
                         (coarse.COARSE_S,)).fetchone() == (0,)
        done = compact.compact(c, hot_hours=0, duty=1, now=datetime.now(UTC) + compact.CHUNK)
        assert done.samples["process_samples"] > 0 and done.samples["gpu_samples"] > 0 and done.hours >= 1
        assert c.execute("SELECT (SELECT count(*) FROM jobpulse.gpu_samples)"
                         " + (SELECT count(*) FROM jobpulse.process_samples)").fetchone() == (0,)
        # every fine bucket went into a coarse one, which the long-range series now read alone
        for table in ("gpu_rollup", "process_rollup"):
            fine, wide = c.execute(f"SELECT sum(n) FILTER (WHERE width_s = 300), sum(n) FILTER (WHERE width_s = %s)"
                                   f" FROM jobpulse.{table}", (coarse.COARSE_S,)).fetchone()
            assert fine and fine == wide, table
        sources = {r[0] for job in jobs for r in c.execute(
            "SELECT DISTINCT source FROM jobpulse.gpu_series('lib', %s, %s, %s, 1800)",
            (job, t0 - timedelta(hours=6), t0 + timedelta(hours=7)))}
        assert sources == {f"gpu_rollup {coarse.COARSE_S} s"}, sources
        after = _long_series(c, jobs, t0)
    for key, rows in drawn.items():
        assert len(after[key]) == len(rows), key
        for got, want in zip(after[key], rows, strict=True):  # sums added in another order: float rounding
            assert [pytest.approx(v, rel=1e-9) if isinstance(v, float) else v for v in want] == list(got), key
    assert backtest(dsn, t0, end) == before


def test_retention_by_tier(conn: psycopg.Connection, dsn: str) -> None:
    today = partitions.utc_today()
    partitions.ensure(conn, [today - timedelta(days=d) for d in (5, 40, 200, 800)])
    partitions.ensure(conn, [today - timedelta(days=d) for d in (5, 40, 200, 800)], tables=list(partitions.ON_DEMAND))
    dropped = partitions.drop_expired(conn, 30, tiers=partitions.Tiers(compact_days=100, rollup_days=365))
    kept = partitions.existing(conn)
    old = {d: today - timedelta(days=d) for d in (5, 40, 200, 800)}
    assert old[40] not in kept["events"] and old[5] in kept["events"]
    for table in ("gpu_samples", "gpu_samples_compact", "process_samples_compact", "rank_bins_compact"):
        assert old[40] in kept[table] and old[200] not in kept[table], table
    assert old[200] in kept["gpu_rollup"] and old[800] not in kept["gpu_rollup"]
    assert f"gpu_rollup_p{old[800]:%Y%m%d}" in dropped
    with pytest.raises(ValueError, match="compact_days"):
        partitions.Tiers(raw_hours=72, compact_days=2)
    r = jobpulse_cli("db", "compact", "--dsn", dsn, "--duty", "2")
    assert r.returncode == 1 and "duty must be in (0, 1], got 2.0" in r.stderr and "Traceback" not in r.stderr
