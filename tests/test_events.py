"""Application events: real processes -> the real client -> the agent's socket (kernel
credentials) -> collector -> PostgreSQL, with phases and steps queryable per rank."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg

from .agents import RunningAgent, Scenario, start_agent
from .conftest import RunningCollector

JOB = "7001"

RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from jobpulse.agent import client as jp
    rank = int(os.environ.get("SLURM_PROCID", "-1"))
    before = time.time()
    jp.event(f"hello from rank {rank}", level="warning", job_id="9999", rank=99)  # claims are ignored
    after = time.time()
    with jp.phase("data_loading"):
        time.sleep(0.05)
    with jp.phase("epoch", epoch=0):
        for i in range(3):
            time.sleep(0.02)
            jp.step(i, samples=32, loss=1.0 / (i + 1))
    child = None
    if rank == 0:  # a DataLoader-style worker: forked after the client was used
        child = os.fork()
        if child == 0:
            jp.event("from the forked worker")
            jp.flush()
            jp.sync()  # os._exit skips atexit: wait for the agent to take it by hand
            os._exit(0 if jp.dropped() == 0 else 3)
        os.waitpid(child, 0)
    print(json.dumps({"pid": os.getpid(), "before": before, "after": after, "child": child,
                      "dropped": jp.dropped(), "sent": jp.sent()}))
""")


def run_rank(agent: RunningAgent, rank: int | None) -> dict[str, object]:
    """Run the script as task ``rank`` of the job, or (None) as a process outside any job."""
    slurm = {} if rank is None else {"SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
                                     "SLURM_LOCALID": str(rank % 2)}
    env = {**os.environ, "JOBPULSE_EVENTS_SOCKET": str(agent.events_socket), **slurm}
    out = subprocess.run([sys.executable, "-c", RANK_SCRIPT], env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    return json.loads(out.stdout)


def query(dsn: str, sql: str, *params: object) -> list[tuple]:  # type: ignore[type-arg]
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()


def wait_rows(dsn: str, sql: str, n: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while query(dsn, sql)[0][0] < n:
        assert time.monotonic() < deadline, f"timed out: {sql}"
        time.sleep(0.2)


def agent_for(fake_nvml: Path, tmp_path: Path, collector: RunningCollector, *extra: str) -> RunningAgent:
    scn = Scenario().gpu(0, "GPU-e", "00000000:17:00.0", sm=50, mem=1).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", *extra, collector=collector.url, token=collector.token)
    assert agent.control("register", JOB, "--uid", str(os.getuid()), "--gpus", "0")["ok"]
    return agent


def test_events_from_four_ranks(fake_nvml: Path, collector: RunningCollector, dsn: str, tmp_path: Path) -> None:
    agent = agent_for(fake_nvml, tmp_path, collector)
    try:
        ranks = [run_rank(agent, r) for r in range(4)]
        outsider = run_rank(agent, None)
        wait_rows(dsn, "SELECT count(*) FROM jobpulse.events", 5 * 8 + 1)  # 8 per process + the forked worker
    finally:
        agent.stop()
    for r in ranks + [outsider]:
        assert r["dropped"] == 0 and r["sent"] == 8

    rows = query(dsn, "SELECT pid, job_id, step, rank, local_rank, level, ts, uid, attrs FROM jobpulse.events"
                      " WHERE message LIKE 'hello from rank %%' ORDER BY rank NULLS LAST")
    assert len(rows) == 5, rows
    for rank, (r, row) in enumerate(zip(ranks, rows)):
        pid, job, step, rnk, local, level, ts, uid, attrs = row
        assert (pid, job, step, rnk, local, level, uid) == (r["pid"], JOB, "0", rank, rank % 2, "warning", os.getuid())
        assert r["before"] <= ts.timestamp() <= r["after"]  # the sender's own clock
        assert attrs == {"job_id": "9999", "rank": 99}  # what it claimed stays a claim
    assert rows[4][0] == outsider["pid"] and rows[4][1:4] == (None, None, None)  # node-level

    # The forked worker is reported as itself, in its parent's job and rank.
    forked = query(dsn, "SELECT pid, job_id, rank FROM jobpulse.events WHERE message = 'from the forked worker'"
                        " AND job_id IS NOT NULL")
    assert forked == [(ranks[0]["child"], JOB, 0)]

    phases = query(dsn, "SELECT rank, phase, status, extract(epoch from ended_at - started_at) FROM jobpulse.job_phases"
                        " WHERE job_id = %s ORDER BY rank, started_at", JOB)
    assert [(p[0], p[1], p[2]) for p in phases] == [(r, name, "ok") for r in range(4)
                                                   for name in ("data_loading", "epoch")]
    assert all(0.04 < p[3] < 2 for p in phases)
    steps = query(dsn, "SELECT rank, step_number, samples, samples_per_s, metrics->>'loss' FROM jobpulse.job_steps"
                       " WHERE job_id = %s ORDER BY rank, ts", JOB)
    assert [(s[0], s[1], s[2]) for s in steps] == [(r, i, 32.0) for r in range(4) for i in range(3)]
    rates = [s[3] for s in steps if s[1] > 0]
    assert rates and all(200 < rate < 3200 for rate in rates)  # 32 samples per ~20 ms


def test_flood_is_rate_limited_and_counted(fake_nvml: Path, collector: RunningCollector, dsn: str,
                                           tmp_path: Path) -> None:
    agent = agent_for(fake_nvml, tmp_path, collector, "--event-rate", "100", "--event-burst", "200")
    script = ("from jobpulse.agent import client as jp\n"
              "for i in range(5000): jp.event('flood', i=i)\n"
              "jp.flush()\n"
              "import json; print(json.dumps({'dropped': jp.dropped(), 'sent': jp.sent()}))")
    env = {**os.environ, "JOBPULSE_EVENTS_SOCKET": str(agent.events_socket), "SLURM_JOB_ID": JOB,
           "SLURM_PROCID": "0"}
    try:
        out = json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                        check=True, timeout=60).stdout)
        time.sleep(2)
    finally:
        agent.stop()
    stored = query(dsn, "SELECT count(*) FROM jobpulse.events WHERE message = 'flood'")[0][0]
    reported = query(dsn, "SELECT coalesce(sum((dropped->>'events')::int), 0) FROM jobpulse.ingest_batches")[0][0]
    assert 200 <= stored < 1000
    assert stored + reported + out["dropped"] == 5000  # every event stored or counted


def test_shell_emit_marks_a_phase(fake_nvml: Path, collector: RunningCollector, dsn: str, tmp_path: Path) -> None:
    agent = agent_for(fake_nvml, tmp_path, collector)
    env = {**os.environ, "JOBPULSE_EVENTS_SOCKET": str(agent.events_socket), "SLURM_JOB_ID": JOB,
           "SLURM_PROCID": "0"}
    emit = [sys.executable, "-m", "jobpulse.agent.cli", "emit"]
    try:
        subprocess.run([*emit, "staging data", "--phase-start", "stage_in"], env=env, check=True, timeout=30)
        time.sleep(0.3)
        subprocess.run([*emit, "done", "--phase-end", "stage_in", "--attr", "files=12"], env=env, check=True, timeout=30)
        subprocess.run([*emit, "checkpoint written", "--level", "warning"], env=env, check=True, timeout=30)
        # An agent slower than the script (a loaded node): emit stays until its event is taken, since the
        # agent learns its job from /proc/PID, gone once emit has exited.
        os.kill(agent.proc.pid, signal.SIGSTOP)
        try:
            late = subprocess.Popen([*emit, "while the agent was busy"], env=env)
            time.sleep(1.0)
        finally:
            os.kill(agent.proc.pid, signal.SIGCONT)
        assert late.wait(30) == 0
        wait_rows(dsn, "SELECT count(*) FROM jobpulse.events", 4)
    finally:
        agent.stop()
    assert query(dsn, "SELECT job_id, rank FROM jobpulse.events WHERE message = 'while the agent was busy'") == [
        (JOB, 0)]
    phase = query(dsn, "SELECT phase, rank, extract(epoch from ended_at - started_at), attrs->>'files'"
                       " FROM jobpulse.job_phases")
    assert len(phase) == 1 and phase[0][0] == "stage_in" and phase[0][1] == 0 and 0.2 < phase[0][2] < 10
    assert phase[0][3] == "12"
    r = subprocess.run([*emit, "nobody listens"], env={**env, "JOBPULSE_EVENTS_SOCKET": str(tmp_path / "none")},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "dropped" in r.stderr


def test_events_sent_before_their_job_registered_are_filed_under_it(fake_nvml: Path, collector: RunningCollector,
                                                                  dsn: str, tmp_path: Path) -> None:
    """A prolog that gave up waiting leaves the registration queued for the agent, and the job's first
    events may come first, from a process gone by the time it registers: held, then filed under the job
    (to the user it names only)."""
    scn = (Scenario().gpu(0, "GPU-e0", "00000000:17:00.0", sm=50, mem=1)
           .gpu(1, "GPU-e1", "00000000:18:00.0", sm=50, mem=1).write(tmp_path / "s.scn"))
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", collector=collector.url, token=collector.token)
    emit = [sys.executable, "-m", "jobpulse.agent.cli", "emit"]
    base = {**os.environ, "JOBPULSE_EVENTS_SOCKET": str(agent.events_socket), "SLURM_PROCID": "1"}
    try:
        subprocess.run([*emit, "before my job"], env={**base, "SLURM_JOB_ID": "7002"}, check=True, timeout=30)
        subprocess.run([*emit, "claims another's job"], env={**base, "SLURM_JOB_ID": "7003"}, check=True, timeout=30)
        # A sync is answered to an abstract address only: never to a path a sender could point elsewhere.
        for address in ("\0jobpulse-test-sync", str(tmp_path / "sync.sock")):
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.bind(address)
                s.settimeout(2)
                s.sendto(b"", str(agent.events_socket))
                try:
                    answer = s.recv(256)
                except TimeoutError:
                    answer = None
            assert answer == (b'{"op":"synced"}' if address.startswith("\0") else None), address
        assert agent.control("register", "7002", "--uid", str(os.getuid()), "--gpus", "0")["ok"]
        assert agent.control("register", "7003", "--uid", str(os.getuid() + 4242), "--gpus", "1")["ok"]
        wait_rows(dsn, "SELECT count(*) FROM jobpulse.events WHERE message = 'before my job'", 1)
    finally:
        agent.stop()  # what still waits goes node-level, never dropped
    got = dict(query(dsn, "SELECT message, (job_id, rank)::text FROM jobpulse.events"))
    assert got == {"before my job": "(7002,1)", "claims another's job": "(,)"}
