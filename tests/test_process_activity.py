"""What a job's process is doing, read by the real agent from /proc and stored: a rank stopped with
SIGSTOP (as Slurm suspends a job) reads state T, a rank writing a file has a write rate, both
queryable in `process_samples` and the roll-ups (issue 67's evidence of a working rank)."""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import msgspec
import psycopg

from jobpulse.schema import wire
from jobpulse.schema.fields import HOLD_BIN_S

from .agents import Scenario, spawn_rank, start_agent
from .batches import AGENT, full_batch
from .conftest import RunningCollector

JOB = "6701"
_WRITER = """
import sys, time
with open(sys.argv[1], "wb") as f:
    while True:  # about 1 MiB/s, as a rank writing a checkpoint would (if slowly)
        f.write(b"x" * 65536); f.flush(); f.seek(0); time.sleep(0.0625)
"""


def query(dsn: str, sql: str, *params: object) -> list[tuple]:  # type: ignore[type-arg]
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()


def wait_for(predicate, timeout: float = 40, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_a_stopped_rank_reads_T_and_a_writing_rank_its_write_rate(fake_nvml: Path, collector: RunningCollector,
                                                                   dsn: str, tmp_path: Path) -> None:
    stopped = spawn_rank(JOB, 0, 0)
    writer = spawn_rank(JOB, 1, 1, command=[sys.executable, "-c", _WRITER, str(tmp_path / "ckpt.bin")])
    idle = spawn_rank(JOB, 2, 0)
    scn = (Scenario().gpu(0, "GPU-a0", "00000000:17:00.0", sm=50, mem=1, fb_total_mib=1000, fb_used_mib=10)
           .add(f"proc 0 0 {stopped.pid} 10 1 1").write(tmp_path / "s.scn"))
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", collector=collector.url, token=collector.token)
    try:
        assert agent.control("register", JOB, "--uid", str(os.getuid()), "--gpus", "0")["ok"]
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_for(lambda: query(dsn, "SELECT count(*) FROM jobpulse.process_samples"
                                    " WHERE job_id = %s AND pid = %s AND state = 'T'", JOB, stopped.pid)[0][0] > 0, what="the stopped rank's state T")
        wait_for(lambda: query(dsn, "SELECT count(*) FROM jobpulse.process_samples WHERE pid = %s"
                                    " AND io_write_bps > 0", writer.pid)[0][0] >= 2, what="the writer's rate")
        os.kill(stopped.pid, signal.SIGCONT)
        wait_for(lambda: query(dsn, "SELECT count(*) FROM jobpulse.process_samples"
                                    " WHERE job_id = %s AND pid = %s AND state = 'S'", JOB, stopped.pid)[0][0] > 0, what="the resumed rank sleeping again")
    finally:
        agent.stop()
        for p in (stopped, writer, idle):
            p.kill()
            p.wait()
    states = dict(query(dsn, "SELECT pid, string_agg(DISTINCT state, '' ORDER BY state) FROM jobpulse.process_samples"
                             " WHERE job_id = %s GROUP BY pid", JOB))
    assert states[stopped.pid] == "ST" and states[idle.pid] == "S"
    # Every byte counted once: rows weighed by 1 + held, the writer wrote ~1 MiB/s, the sleeper nothing.
    rates = dict(query(dsn, "SELECT pid, sum(io_write_bps * (1 + coalesce(held, 0)))::float"
                            " / sum(1 + coalesce(held, 0)) FROM jobpulse.process_samples"
                            " WHERE job_id = %s AND io_write_bps IS NOT NULL GROUP BY pid", JOB))
    assert 0.3 * 2**20 < rates[writer.pid] < 1.5 * 2**20, rates
    assert rates[idle.pid] == 0
    wait_for(lambda: query(dsn, "SELECT coalesce(max(max_io_write_bps), 0) FROM jobpulse.process_rollup"
                                " WHERE pid = %s", writer.pid)[0][0] > 0, what="the write rate in the roll-ups")


def _post(collector: RunningCollector, batch: wire.Batch) -> httpx.Response:
    return httpx.post(f"{collector.url}/v1/batches", timeout=30, content=wire.encode(batch),
                      headers={"Authorization": f"Bearer {collector.token}", "Content-Type": "application/json"})


def _bin_start() -> datetime:
    """The start of a ten-second bin that ended a little while ago (the held rows' times lie in it)."""
    t = datetime.now(UTC) - timedelta(seconds=30)
    return t.replace(second=t.second // HOLD_BIN_S * HOLD_BIN_S, microsecond=0)


def test_a_row_standing_for_more_than_its_bin_is_refused(collector: RunningCollector, dsn: str) -> None:
    """Issue 64: one row per rank with held = 3600 (within the old bound) outweighed a 60-s job's
    every other process row and moved its CPU and SM shares; a row now stands for at most ten ticks,
    and only for ticks that fit in its bin: held 9 at 9.2 s into a bin is the agent's, at 3.5 s it is not."""
    b0 = _bin_start()
    b = full_batch(job_id="6402", t0=b0)
    row = b.process_samples[0]
    for seq, (held, at, status) in enumerate(((3600, 9.2, 422), (9, 3.5, 422), (9, 9.2, 200))):
        ts = b0 + timedelta(seconds=at)
        r = _post(collector, msgspec.structs.replace(
            b, seq=seq, process_samples=[msgspec.structs.replace(row, ts=ts, held=held)]))
        assert r.status_code == status, r.text
        if status == 422:
            assert "held" in r.text, r.text
    assert query(dsn, "SELECT held FROM jobpulse.process_samples WHERE job_id = '6402'") == [(9,)]


def test_a_row_stands_only_for_the_seconds_since_its_process_was_last_sent(collector: RunningCollector,
                                                                           dsn: str) -> None:
    """Issue 64: a row per second, each claiming the nine ticks before it, would weigh a process ten
    times over: within a batch and across batches a row may stand for no more ticks than fit since
    that process's previous row. The agent's own pattern (a sent tick, then a held run to the bin's
    end) is stored as it is."""
    b0 = _bin_start()
    agent = msgspec.structs.replace(AGENT, instance="held-across-batches")
    row = full_batch(job_id="6403", t0=b0).process_samples[0]
    b = wire.Batch(version=1, agent=agent, seq=0, created_at=b0)  # process rows only: posted four times
    at = [msgspec.structs.replace(row, ts=b0 + timedelta(seconds=s), held=h) for s, h in ((0, 0), (1, 9), (5, 3))]
    # Within one batch: 1 s after the row at 0 s there is no room for 9 held ticks.
    r = _post(collector, msgspec.structs.replace(b, seq=0, process_samples=at[:2]))
    assert r.status_code == 422 and "previous row" in r.text, r.text
    # The agent's pattern, across two batches: the tick at 0 s sent, the run of 1-5 s sent at 5 s (held 4 fits).
    assert _post(collector, msgspec.structs.replace(b, seq=1, process_samples=at[:1])).status_code == 200
    ok = msgspec.structs.replace(at[2], held=4)
    r = _post(collector, msgspec.structs.replace(b, seq=2, process_samples=[ok]))
    assert r.status_code == 200, r.text
    # Then a row at 6 s claiming 3 ticks: only 0 fit since the row at 5 s (in an earlier batch).
    late = msgspec.structs.replace(at[2], ts=b0 + timedelta(seconds=6), held=3)
    r = _post(collector, msgspec.structs.replace(b, seq=3, process_samples=[late]))
    assert r.status_code == 422 and "previous row" in r.text, r.text
    assert query(dsn, "SELECT coalesce(held, 0) FROM jobpulse.process_samples WHERE job_id = '6403' ORDER BY ts") == [
        (0,), (4,)]
