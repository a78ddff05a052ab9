"""Three collector processes on one PostgreSQL: agents write through all of them, exactly one runs
the rules, and when it is killed (-9) another takes over within two rule intervals — no batch
lost or stored twice, no rule cycle run twice, no flag duplicated."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg

from jobpulse.collector.store.state.leader import Leader, Task
from jobpulse.schema import wire

from .batches import gpu_batch
from .conftest import TOKEN, RunningCollector, start_collector, stop_collector

INTERVAL_S = 1.0
AGENTS = 6


def _sick_node(now: datetime) -> bytes:
    """A GPU no job holds with an XID: the leader's rule cycles keep one node flag open for it."""
    agent = wire.AgentInfo(instance="sick-1", node="spare1", cluster="lc", version="0.1.0", started_at=now)
    samples = [wire.GpuSample(ts=now - timedelta(seconds=s), gpu_uuid="GPU-sick", gpu_index=0, sm_util=0,
                              fb_used_mib=0, fb_total_mib=81_559) for s in range(120)]
    xid = wire.HealthEvent(ts=now - timedelta(seconds=5), kind="xid", gpu_uuid="GPU-sick", code=79, message="XID 79")
    return wire.encode(wire.Batch(version=1, agent=agent, seq=0, created_at=now, gpu_samples=samples,
                                  health_events=[xid]))


class Agent(threading.Thread):
    """Sends one batch after another, each to the next collector (a balancer's round robin); a
    batch whose answer did not come is sent again to the next one, as the real agent replays."""

    def __init__(self, n: int, urls: list[str], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.info = wire.AgentInfo(instance=f"agent-{n}", node=f"node{n}", cluster="lc", version="0.1.0",
                                   started_at=datetime.now(UTC))
        self.urls = itertools.cycle(urls[n % len(urls):] + urls[:n % len(urls)])
        self.stop = stop
        self.acked = 0

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        with httpx.Client(timeout=10) as http:
            while not self.stop.is_set():
                body = wire.encode(gpu_batch(self.acked, datetime.now(UTC), n_gpus=2, agent=self.info))
                while True:
                    try:
                        if http.post(f"{next(self.urls)}/v1/batches", content=body, headers=headers).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.05)
                self.acked += 1
                time.sleep(0.02)


def _leader(collectors: list[RunningCollector]) -> RunningCollector:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        leading = [c for c in collectors if c.proc.poll() is None
                   and httpx.get(f"{c.url}/healthz", timeout=5).json()["leader"]]
        if len(leading) == 1:
            return leading[0]
        time.sleep(0.1)
    raise AssertionError("no single leader")


def test_the_leader_killed_another_takes_over(dsn: str, tmp_path: Path) -> None:
    collectors = [start_collector(dsn, tmp_path, "--rules-interval", str(INTERVAL_S)) for _ in range(3)]
    stop = threading.Event()
    cycles: list[datetime] = []  # every rule cycle's start, as the leaders recorded it

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute("SELECT ran_at FROM jobpulse.leader_tasks WHERE task = 'rules'").fetchone()
                if row and (not cycles or row[0] != cycles[-1]):
                    cycles.append(row[0])
                time.sleep(0.02)

    try:
        with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            assert http.post(f"{collectors[0].url}/v1/batches", content=_sick_node(datetime.now(UTC)),
                             headers={"Content-Type": "application/json"}).status_code == 200
        first = _leader(collectors)
        agents = [Agent(n, [c.url for c in collectors], stop) for n in range(AGENTS)]
        watcher = threading.Thread(target=watch, daemon=True)
        for t in (*agents, watcher):
            t.start()
        time.sleep(3 * INTERVAL_S)
        killed_at = datetime.now(UTC)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        second = _leader([c for c in collectors if c is not first])
        time.sleep(3 * INTERVAL_S)
        stop.set()
        for t in (*agents, watcher):
            t.join(30)
        alive = [c.proc.poll() is None for c in collectors if c is not first]
    finally:
        stop.set()
        for c in collectors:
            if c.proc.poll() is None:
                stop_collector(c)
    assert all(alive), "the other collectors kept running"
    assert not any("Traceback" in c.log.read_text() for c in collectors), "no collector failed"

    before = [t for t in cycles if t <= killed_at]
    after = [t for t in cycles if t > killed_at]
    assert before and after, cycles
    print(f"\nleader killed: rules resumed after {(after[0] - killed_at).total_seconds():.2f} s "
          f"(interval {INTERVAL_S} s), {len(cycles)} cycles")
    assert (after[0] - killed_at).total_seconds() <= 2 * INTERVAL_S, "rules resume within two intervals"
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(cycles)]
    assert min(gaps) >= INTERVAL_S, f"a cycle ran twice: {gaps}"
    sent = sum(a.acked for a in agents)
    with psycopg.connect(dsn) as conn:
        holder = conn.execute("SELECT holder FROM jobpulse.leader_tasks WHERE task = 'rules'").fetchone()[0]
        ledger = conn.execute("SELECT count(*), count(DISTINCT (agent_instance, seq)) FROM jobpulse.ingest_batches"
                              " WHERE agent_instance LIKE 'agent-%'").fetchone()
        samples = conn.execute("SELECT count(*), count(DISTINCT (node, gpu_uuid, ts)) FROM jobpulse.gpu_samples"
                               " WHERE node LIKE 'node%'").fetchone()
        flags = conn.execute("SELECT rule_id, count(*), bool_and(ended_at IS NULL) FROM jobpulse.node_flags"
                             " GROUP BY rule_id").fetchall()
    survivors = [c for c in collectors if c is not first]
    assert any(holder.endswith(f":{c.proc.pid}") for c in survivors), (holder, second.proc.pid, [
        line for c in collectors for line in c.log.read_text().splitlines() if "lead" in line])
    assert ledger == (sent, sent), "every acknowledged batch stored once"
    assert samples == (2 * sent, 2 * sent), "0 samples lost, 0 duplicated"
    assert flags and all(n == 1 and still_open for _, n, still_open in flags), flags


def test_the_leader_asks_the_database_only_when_a_task_is_due(dsn: str, tmp_path: Path) -> None:
    """Claiming a task is a write (the row's lock, a commit): between due times a leader that is
    woken (by its poll, or by another task) says nothing to the database about the others."""
    runs: list[str] = []
    leader = Leader(dsn, [Task("often", 0.5, lambda conn: runs.append("often")),
                          Task("rarely", 3600, lambda conn: runs.append("rarely"))], poll_s=5)
    try:
        wait = leader.step()
        assert runs == ["often", "rarely"] and 0.3 < wait <= 0.5
        conn = leader._conn
        assert conn is not None
        trace = tmp_path / "libpq.trace"
        with trace.open("w") as out:
            conn.pgconn.trace(out.fileno())
            try:
                again = leader.step()  # woken early: nothing is due
                assert runs == ["often", "rarely"] and 0 < again <= wait
                quiet = trace.read_text()
                time.sleep(again)
                leader.step()  # "often" is due, "rarely" is not
            finally:
                conn.pgconn.untrace()
        assert quiet == "", "no statement while nothing is due"
        assert runs == ["often", "rarely", "often"]
        claims = trace.read_text().count("INSERT INTO jobpulse.leader_tasks")
        assert claims == 1, f"only the due task was claimed ({claims} claims)"
    finally:
        leader.close()
