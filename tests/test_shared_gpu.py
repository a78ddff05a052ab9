"""A GPU two jobs share (Slurm shards, MPS), on the whole system: real agent on the fake NVML
library, real collector running its rules, real PostgreSQL. Each job's use of the GPU is its own
processes' share, never the whole GPU's: the job whose processes stop is flagged idle while its
neighbour keeps the GPU busy."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psycopg

from .agents import Scenario, spawn_rank, start_agent
from .conftest import start_collector, stop_world
from .test_mig import settled_flags
from .test_rules_live import RULES

GPU = dict(sm=100, mem=30, power_mw=300_000, pcie_gen=5, pcie_width=16, pcie_gen_max=5, pcie_width_max=16, clkev=0,
           fb_total_mib=81_559, fb_used_mib=40_000, gpm_sm=95, gpm_tensor=40)
IDLE_AT_S = 25.0  # well after both jobs registered: job 9202's process worked on the GPU first


def test_jobs_sharing_a_gpu_are_each_judged_from_their_own_processes(fake_nvml: Path, dsn: str,
                                                                      tmp_path: Path) -> None:
    scenario = Scenario().gpu(0, "GPU-s0", "00000000:10:00.0", **GPU)
    ranks = {job: spawn_rank(job, 0, 0) for job in ("9201", "9202")}
    scenario.add(f"proc 0 0 {ranks['9201'].pid} 20000 45 20").add(f"proc 0 0 {ranks['9202'].pid} 20000 55 10")
    scenario.add(f"proc {IDLE_AT_S} 0 {ranks['9202'].pid} 20000 0 0")
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1")
    agent = start_agent(fake_nvml, scenario.write(tmp_path / "s.scn"), tmp_path / "a", "n1",
                        collector=collector.url, token=collector.token)
    uid = str(os.getuid())
    expected = {("9202", "idle_gpu", "n1/GPU-s0")}
    try:
        for job in ("9201", "9202"):
            assert agent.control("register", job, "--uid", uid, "--gpus", "0", "--partition", "gpu", "--shared")["ok"]
        shared_from = time.time() + 1  # both registered: from the next sample on, the GPU is shared
        got = settled_flags(dsn, collector, expected, within=90)
        shared_until = time.time() - 1  # ending the jobs one by one leaves 9202 alone on the GPU a moment
        agent.end_jobs("9201", "9202")
    finally:
        stop_world(ranks.values(), agent, collector)
    assert got == expected

    with psycopg.connect(dsn) as conn:
        rows = {r[0]: r[1:] for r in conn.execute(
            "SELECT coalesce(job_id, '-'), max(sm_util), min(sm_util), max(fb_used_mib), max(gpm_sm_active),"
            " max(power_w) FROM jobpulse.gpu_samples WHERE gpu_uuid = 'GPU-s0' AND ts > to_timestamp(%s)"
             " AND ts < to_timestamp(%s) GROUP BY 1", (shared_from, shared_until)).fetchall()}
        busy = dict(conn.execute(
            "SELECT job_id, sum(sum_sm_util) / sum(n) FROM jobpulse.gpu_rollup_10s"
            " WHERE job_id IN ('9201', '9202') AND bucket > to_timestamp(%s) GROUP BY 1", (shared_from + 10,)).fetchall())
    # The whole GPU keeps its own row (no job); each job's row is its processes' share and memory, the
    # GPU's power, and no GPM (the whole GPU's, whoever ran).
    assert rows["-"][:2] == (100, 100) and rows["-"][3] == 95.0
    assert rows["9201"] == (45, 45, 20_000, None, 300.0)
    assert rows["9202"] == (55, 0, 20_000, None, 300.0)
    assert busy["9201"] == 45 and 0 <= busy["9202"] < 55  # the roll-ups judged: each job's own share
