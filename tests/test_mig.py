"""MIG on the whole system: real agent on the fake NVML library (one GPU in MIG mode with three
instances, two jobs on two of them, one free), real collector running its rules, real PostgreSQL.
Each instance is a GPU of its own: its samples, processes and flags belong to its job; a fault of
the GPU reaches every job on it; memory advice names the MIG profile that fits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg

from jobpulse.collector.embedded.postgres import free_port

from .agents import Scenario, spawn_rank, start_agent
from .conftest import RunningCollector, start_collector, stop_world
from .test_rules_live import RULES

PARENT = dict(power_mw=420_000, power_limit_mw=700_000, temp=58, smclk=1980, memclk=2619, pcie_gen=5, pcie_width=16,
              pcie_gen_max=5, pcie_width_max=16, clkev=0, ecc_sbe=3, ecc_dbe=0, fb_total_mib=81_559,
              fb_used_mib=20_000)
BUSY_SLICE = dict(fb_total_mib=9_856, fb_used_mib=8_000, gpm_sm=85, gpm_occ=40, gpm_tensor=35, gpm_dram=40,
                  gpm_fp16=30, gpm_fp32=5, gpm_fp64=0)
IDLE_SLICE = {**BUSY_SLICE, "gpm_sm": 0, "gpm_tensor": 0}
WHOLE = dict(sm=25, mem=10, power_mw=200_000, pcie_gen=5, pcie_width=16, pcie_gen_max=5, pcie_width_max=16,
             clkev=0, fb_total_mib=81_559, fb_used_mib=900, gpm_sm=20, gpm_occ=10, gpm_tensor=5, gpm_dram=10,
             gpm_fp16=5, gpm_fp32=5, gpm_fp64=0)
# Well after the jobs registered, even on a loaded machine (at 2 s on an idle one): MIG-b was busy in
# its job first.
IDLE_AT_S = 25.0
# After MIG-b's idle flag (5 s after IDLE_AT_S on an idle machine; the test prints the timeline): from a
# fault on, a job's usage is the node's doing and no longer judged.
XID_AT_S = 60.0
# 9105's slice has no activity reading (no GPM, as on an A100): its usage is not judged, its faults are.
EXPECTED = {("9101", "xid_error", "n1/MIG-a"), ("9102", "xid_error", "n1/MIG-b"), ("9102", "idle_gpu", "n1/MIG-b"),
            ("9103", "low_utilization", "n1/GPU-w1"), ("9103", "memory_underused", ""),
            ("9105", "xid_error", "n1/MIG-d")}


def test_mig_instances_are_gpus_of_their_own_judged_for_their_jobs(fake_nvml: Path, dsn: str,
                                                                   tmp_path: Path) -> None:
    scenario = (Scenario().gpu(0, "GPU-m0", "00000000:10:00.0", **PARENT)
                .mig(0, 100, 0, "MIG-a", gi=7, profile="1g.10gb", **BUSY_SLICE)
                .mig(0, 101, 1, "MIG-b", gi=8, profile="1g.10gb", **BUSY_SLICE)
                .mig(0, 102, 2, "MIG-c", gi=9, profile="2g.20gb", **{**IDLE_SLICE, "fb_total_mib": 19_968})
                .mig(0, 103, 3, "MIG-d", gi=10, profile="1g.10gb", fb_total_mib=9_856, fb_used_mib=8_000)
                .gpu(1, "GPU-w1", "00000000:11:00.0", **WHOLE))
    scenario.set(IDLE_AT_S, 101, **IDLE_SLICE)
    scenario.add(f"xid {XID_AT_S} 0 79")  # the GPU fell off the bus: every slice's fault
    ranks = {job: spawn_rank(job, 0, 0) for job in ("9101", "9102", "9103", "9105")}
    for job, where in (("9101", 100), ("9102", 101), ("9103", 1), ("9105", 103)):
        scenario.add(f"proc 0 {where} {ranks[job].pid} 3000 0 0")
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1")
    port = free_port()
    agent = start_agent(fake_nvml, scenario.write(tmp_path / "s.scn"), tmp_path / "a", "n1",
                        "--prometheus-listen", f"127.0.0.1:{port}", collector=collector.url, token=collector.token)
    uid = str(os.getuid())
    try:
        # A slice by its MIG- UUID, or as drivers before R470 named it in CUDA_VISIBLE_DEVICES.
        for job, gpu in (("9101", "MIG-a"), ("9102", "MIG-GPU-m0/8/0"), ("9103", "1"), ("9105", "MIG-d")):
            assert agent.control("register", job, "--uid", uid, "--gpus", gpu, "--partition", "gpu")["ok"]
        registered = time.time() - scenario.start
        got = settled_flags(dsn, collector, EXPECTED, within=120)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        bad = agent.control("register", "9104", "--uid", uid, "--gpus", "MIG-GPU-m0/99/0")
        agent.end_jobs("9101", "9102", "9103", "9105")
    finally:
        stop_world(ranks.values(), agent, collector)
    with psycopg.connect(dsn) as conn:  # the timeline, for whoever moves IDLE_AT_S or XID_AT_S
        opened = conn.execute("SELECT job_id, rule_id, extract(epoch FROM opened_at) - %s FROM jobpulse.job_flags"
                              " ORDER BY 3", (scenario.start,)).fetchall()
    print(f"\njobs registered at {registered:.0f} s; flags opened at (s): "
          + ", ".join(f"{j} {r} {at:.0f}" for j, r, at in opened))
    assert got == EXPECTED
    assert not bad["ok"] and "no GPU 'MIG-GPU-m0/99/0'" in str(bad["error"])  # no such slice: refused, said so

    with psycopg.connect(dsn) as conn:
        # Samples: each instance its own memory and GPM, its parent's power and temperature; its job.
        samples = {r[0]: r[1:] for r in conn.execute(
            "SELECT gpu_uuid, array_agg(DISTINCT job_id) FILTER (WHERE job_id IS NOT NULL), max(fb_total_mib),"
            " max(power_w), max(gpu_temp_c), max(sm_util), max(gpm_sm_active) FROM jobpulse.gpu_samples"
            " GROUP BY 1").fetchall()}
        procs = {r[0]: r[1:] for r in conn.execute(
            "SELECT pid, array_agg(DISTINCT gpu_uuid), array_agg(DISTINCT job_id) FILTER (WHERE job_id IS NOT NULL)"
            " FROM jobpulse.process_samples WHERE gpu_uuid IS NOT NULL GROUP BY 1").fetchall()}
        topo = {r[0]: r[1:] for r in conn.execute(
            "SELECT gpu_uuid, parent_uuid, mig_profile, gpu_instance_id, gpu_index, model"
            " FROM jobpulse.topology_current").fetchall()}
        flag = {(r[0], r[1]): r[2:] for r in conn.execute(
            "SELECT job_id, rule_id, category, advice, evidence FROM jobpulse.job_flags").fetchall()}
        node = conn.execute("SELECT rule_id, scope_key, category FROM jobpulse.node_flags").fetchall()
    assert samples["MIG-a"] == (["9101"], 9_856, 420.0, 58, None, 85.0)
    assert samples["MIG-b"][:5] == (["9102"], 9_856, 420.0, 58, None)
    assert samples["MIG-c"][:3] == (None, 19_968, 420.0)
    assert samples["MIG-d"][0] == ["9105"] and samples["MIG-d"][4:] == (None, None)  # no reading of its activity
    assert samples["GPU-m0"][:5] == (None, 81_559, 420.0, 58, None)  # MIG mode: no utilization rates
    assert procs[ranks["9101"].pid] == (["MIG-a"], ["9101"]) and procs[ranks["9102"].pid] == (["MIG-b"], ["9102"])
    assert procs[ranks["9103"].pid] == (["GPU-w1"], ["9103"])
    assert topo["MIG-a"] == ("GPU-m0", "1g.10gb", 7, 0, "NVIDIA H100 80GB HBM3")
    assert topo["MIG-c"][:3] == ("GPU-m0", "2g.20gb", 9) and topo["GPU-m0"][:3] == (None, None, None)
    # The parent's XID reached both jobs as hardware, named by slice; the free slice is the node's.
    for job, label in (("9101", "GI 7"), ("9102", "GI 8")):
        category, advice, evidence = flag[(job, "xid_error")]
        assert category == "hardware" and evidence["xids"] == [79] and f"n1/GPU0 MIG 1g.10gb ({label})" in advice
    assert ("xid_error", "n1/MIG-c", "hardware") in node
    assert "n1/GPU0 MIG 1g.10gb (GI 8) has been idle" in flag[("9102", "idle_gpu")][1]
    # Memory advice names the profile that holds the whole-GPU job's peak memory and its compute.
    advice, evidence = flag[("9103", "memory_underused")][1:]
    assert evidence["mig_profile"] == "2g.20gb" and "--gres=gpu:2g.20gb:1" in advice
    # The report names the slice by its GPU, profile and GPU instance.
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "9102", "--dsn", dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "n1/GPU0 MIG 1g.10gb (GI 8)  util" in out.stdout, out.stdout + out.stderr
    # dcgm-exporter's MIG labels: the parent's identity plus GPU_I_PROFILE and GPU_I_ID.
    line = next(x for x in metrics.splitlines() if x.startswith("DCGM_FI_DEV_FB_USED{") and 'GPU_I_ID="7"' in x)
    assert 'UUID="GPU-m0"' in line and 'GPU_I_PROFILE="1g.10gb"' in line and 'hpc_job="9101"' in line
    assert line.endswith(" 8000.0")


def flags(dsn: str) -> set[tuple[str, str, str]]:
    with psycopg.connect(dsn) as conn:
        return set(conn.execute("SELECT job_id, rule_id, scope_key FROM jobpulse.job_flags").fetchall())


def settled_flags(dsn: str, collector: RunningCollector, expected: set[tuple[str, str, str]],
                  within: float) -> set[tuple[str, str, str]]:
    """The flags once the expected ones are up (or ``within`` seconds passed) and three more rule
    cycles ran: nothing else may come up."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not expected <= flags(dsn):
        time.sleep(0.5)
    collector.wait_for_rule_cycles(3)
    return flags(dsn)
