"""Authority follows origin (issue 64, hole 1), through the real collector: a token bound to node n2
cannot rewrite, extend or speak for jobs that run only on n1; a node that is not a job's first
writes only its own part of the job; the controller's token (slurm-sync) speaks for every job; real
agents of a two-node job under bound tokens keep every batch."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg

from jobpulse.schema import wire

from .agents import FULL_H100, Scenario, start_agent
from .batches import AGENT, now
from .conftest import TOKEN, RunningCollector

N1, N2, CTL = "n1-token-0123456789", "n2-token-0123456789", "ctl-token-0123456789"
N1_AGENT = AGENT
N2_AGENT = msgspec.structs.replace(AGENT, instance="inst-2", node="n2")


def bind_tokens(c: RunningCollector) -> None:
    tokens = c.log.parent / "tokens"
    tokens.write_text(f"{TOKEN}\n{N1} cluster=testcluster nodes=n1\n{N2} cluster=testcluster nodes=n2\n"
                      f"{CTL} cluster=testcluster nodes=ctl role=controller\n")
    os.utime(tokens, (time.time() + 5, time.time() + 5))  # a new mtime: the collector re-reads it


def batch(agent: wire.AgentInfo, seq: int, **records: Any) -> wire.Batch:
    return wire.Batch(version=1, agent=agent, seq=seq, created_at=now(), **records)


def post(c: RunningCollector, b: wire.Batch, token: str) -> httpx.Response:
    return httpx.post(f"{c.url}/v1/batches", content=wire.encode(b), timeout=30,
                      headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})


def state(dsn: str) -> tuple[list[tuple], ...]:  # type: ignore[type-arg]
    with psycopg.connect(dsn) as conn:
        return tuple(conn.execute(q).fetchall() for q in (
            "SELECT job_id, user_name, partition, tags, state, end_time, nodes FROM jobpulse.jobs ORDER BY job_id",
            "SELECT job_id, node, gpu_uuid FROM jobpulse.job_gpus ORDER BY 1, 2, 3",
            "SELECT job_id, node, kind FROM jobpulse.events ORDER BY 1, 2",
            "SELECT job_id, node, count(*) FROM jobpulse.gpu_samples GROUP BY 1, 2 ORDER BY 1, 2",
            "SELECT node, seq FROM jobpulse.ingest_batches ORDER BY 1, 2"))


def test_a_node_bound_token_cannot_write_for_another_nodes_jobs(collector: RunningCollector, dsn: str) -> None:
    bind_tokens(collector)
    t0 = now()
    gpu = wire.JobGpu(gpu_uuid="GPU-n1-0", gpu_index=0)
    own = batch(N1_AGENT, 0, jobs=[
        wire.JobRecord(job_id="9101", user_name="daemon", uid=1, partition="gpu", nodes=["n1"], start_time=t0),
        wire.JobRecord(job_id="9102", user_name="daemon", uid=1, partition="gpu", nodes=["n1"], gpus=[gpu]),
        wire.JobRecord(job_id="9103", user_name="daemon", uid=1, partition="gpu", nodes=["n1"]),
        wire.JobRecord(job_id="9104", user_name="alice", uid=2, partition="gpu", nodes=["n1", "n2"])])
    assert post(collector, own, N1).status_code == 200
    before = state(dsn)

    forged_end = wire.JobRecord(job_id="9101", user_name="mallory", partition="exempt", tags={"policy": "off"},
                                state="COMPLETED", end_time=t0 + timedelta(seconds=5), nodes=["n2"])
    x0 = wire.JobGpu(gpu_uuid="GPU-X0", gpu_index=0)
    steps = [wire.AppEvent(ts=t0 + timedelta(milliseconds=i), pid=77, kind="step", uid=1, job_id="9103", rank=0,
                           attrs={"step": i}) for i in range(40)]
    sample = wire.GpuSample(ts=t0, gpu_uuid="GPU-X0", gpu_index=0, job_id="9102", sm_util=99)
    forgeries = {
        "job-wide fields of A": ([forged_end], {}, "does not run on node 'n2'"),
        "A's user without a node list": ([wire.JobRecord(job_id="9101", user_name="mallory")], {},
                                         "does not run on node 'n2'"),
        "a GPU in B's list": ([wire.JobRecord(job_id="9102", gpus=[x0])], {}, "does not run on node 'n2'"),
        "steps stamped C": ([], {"events": steps}, "job 9103 does not run on node 'n2'"),
        "samples stamped B": ([], {"gpu_samples": [sample]}, "job 9102 does not run on node 'n2'"),
        "D's end from its second node": ([wire.JobRecord(job_id="9104", state="COMPLETED", end_time=t0)], {},
                                         "its first node 'n1'"),
    }
    for seq, (what, (jobs, rows, why)) in enumerate(forgeries.items()):
        r = post(collector, batch(N2_AGENT, seq, jobs=jobs, **rows), N2)
        assert r.status_code == 403 and why in r.json()["error"], (what, r.status_code, r.text)
        assert state(dsn) == before, f"{what}: refused, yet something was stored"

    # A second node's own part of a job on it: its GPUs and its samples; the job's list stays the job's.
    mine = batch(N2_AGENT, 10, jobs=[wire.JobRecord(job_id="9104", nodes=["n2"], gpus=[
        wire.JobGpu(gpu_uuid="GPU-n2-0", gpu_index=0)])],
        gpu_samples=[wire.GpuSample(ts=t0, gpu_uuid="GPU-n2-0", gpu_index=0, job_id="9104", sm_util=50)])
    r = post(collector, mine, N2)
    assert r.status_code == 200, r.text
    jobs, gpus, _, samples, _ = state(dsn)
    assert ("9104", "n2", "GPU-n2-0") in gpus and ("9104", "n2", 1) in samples
    assert [j[6] for j in jobs if j[0] == "9104"] == [["n1", "n2"]]
    # The controller's token (slurm-sync) speaks for the job: A ended.
    ctl = msgspec.structs.replace(AGENT, instance="sync-1", node="ctl")
    ended = wire.JobRecord(job_id="9101", state="COMPLETED", end_time=t0 + timedelta(seconds=9), nodes=["n1"])
    assert post(collector, batch(ctl, 0, jobs=[ended]), CTL).status_code == 200
    a = next(j for j in state(dsn)[0] if j[0] == "9101")
    assert a[1:5] == ("daemon", "gpu", {}, "COMPLETED")


def test_a_two_node_job_of_real_agents_under_bound_tokens_keeps_every_batch(
        fake_nvml: Path, collector: RunningCollector, dsn: str, tmp_path: Path) -> None:
    bind_tokens(collector)
    agents = []
    try:
        for node, token in (("n1", N1), ("n2", N2)):
            scn = Scenario().gpu(0, f"GPU-{node}-0", "00000000:17:00.0", minor=0, **FULL_H100).write(
                tmp_path / f"{node}.scn")
            agent = start_agent(fake_nvml, scn, tmp_path / node, node, collector=collector.url, token=token)
            agents.append(agent)
        for agent in reversed(agents):  # the second node's registration first, as parallel prologs may
            reply = agent.control("register", "7001", "--uid", str(os.getuid()), "--user", "alice",
                                  "--partition", "gpu", "--gpus", "0", "--nodes", "n1,n2")
            assert reply["ok"], reply
        deadline = time.monotonic() + 30
        while len({r[1] for r in state(dsn)[3] if r[0] == "7001"}) < 2:
            assert time.monotonic() < deadline, "samples of both nodes"
            time.sleep(0.3)
        for agent in agents:
            assert agent.control("unregister", "7001", "--state", "COMPLETED", "--exit-code", "0")["ok"]
        for agent in agents:
            agent.stop()
    finally:
        for agent in agents:
            agent.kill_if_running()
    for agent in agents:
        assert "collector refused batch" not in agent.log.read_text(), agent.log.read_text()[-2000:]
    jobs, gpus, *_ = state(dsn)
    assert [j[1:3] + (j[4], j[6]) for j in jobs] == [("alice", "gpu", "COMPLETED", ["n1", "n2"])]
    assert [g[1:] for g in gpus] == [("n1", "GPU-n1-0"), ("n2", "GPU-n2-0")]
