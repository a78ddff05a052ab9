"""What a job's process is doing, read by the real agent from /proc and stored: a rank stopped with
SIGSTOP (as Slurm suspends a job) reads state T, a rank writing a file has a write rate, both
queryable in `process_samples` and the roll-ups (issue 67's evidence of a working rank)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import msgspec
import psycopg

from jobpulse.schema import wire

from .agents import Scenario, spawn_rank, start_agent
from .batches import full_batch
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


def test_a_row_standing_for_more_than_its_bin_is_refused(collector: RunningCollector, dsn: str) -> None:
    """Issue 64: one row per rank with held = 3600 (within the old bound) outweighed a 60-s job's
    every other process row and moved its CPU and SM shares; a row now stands for at most ten ticks."""
    b = full_batch(job_id="6402")
    forged = [msgspec.structs.replace(s, held=held) for s, held in zip(b.process_samples * 2, (9, 3600), strict=True)]
    for rows, status in ((forged[1:], 422), (forged[:1], 200)):
        r = httpx.post(f"{collector.url}/v1/batches", timeout=30,
                       content=wire.encode(msgspec.structs.replace(b, seq=status, process_samples=rows)),
                       headers={"Authorization": f"Bearer {collector.token}", "Content-Type": "application/json"})
        assert r.status_code == status, r.text
        if status == 422:
            assert "held" in r.text, r.text
    assert query(dsn, "SELECT held FROM jobpulse.process_samples WHERE job_id = '6402'") == [(9,)]
