"""The rules on scripted jobs: real agent on the fake NVML library, real collector running its
rule loop, real PostgreSQL. Each rule fires on its scenario with the right scope and evidence;
healthy jobs raise nothing; a precision/recall table is printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from .agents import Scenario, start_agent
from .conftest import start_collector, stop_collector

RULES = Path(__file__).parent / "data" / "rules_fast.toml"
BUSY = dict(sm=92, mem=40, pcie_gen=4, pcie_width=16, pcie_gen_max=4, pcie_width_max=16, gpm_sm=85, gpm_occ=40, gpm_tensor=35, gpm_dram=40, gpm_fp16=30, gpm_fp32=5, gpm_fp64=0,
            fb_total_mib=81_559, fb_used_mib=50_000, clkev=0, power_mw=600_000)
# job -> (its GPUs' overrides, the flags it must raise as (rule, scope, gpu index or None))
JOBS: dict[str, tuple[list[dict[str, float]], set[tuple[str, str, int | None]]]] = {
    "8001": ([BUSY, BUSY], set()),  # healthy: compute-bound, balanced, memory used
    "8002": ([BUSY, {**BUSY, "sm": 0, "gpm_sm": 0, "gpm_tensor": 0, "fb_used_mib": 30_000}],
             {("idle_gpu", "gpu", 3), ("imbalance", "gpu", 3)}),  # a rank that never uses its GPU
    "8003": ([{**BUSY, "clkev": 0x40}], {("hw_throttling", "gpu", 4), ("xid_error", "gpu", 4)}),  # sick node
    "8004": ([{**BUSY, "sm": 15, "gpm_sm": 12}], {("low_utilization", "gpu", 5)}),  # starved GPU
    "8005": ([{**BUSY, "gpm_tensor": 0}], {("no_tensor_cores", "gpu", 6)}),  # FP32 only
    "8006": ([{**BUSY, "fb_used_mib": 900}], {("memory_underused", "job", None)}),  # tiny batch
    "8007": ([{**BUSY, "pcie_gen": 3, "pcie_width": 8, "pcie_gen_max": 4, "pcie_width_max": 16}],
             {("pcie_downgraded", "gpu", 8)}),  # a riser that trained down
}


def test_rules_flag_their_scenarios_and_nothing_else(fake_nvml: Path, dsn: str, tmp_path: Path) -> None:
    scenario = Scenario()
    index, owner = 0, {}
    for job, (gpus, _) in JOBS.items():
        for values in gpus:
            scenario.gpu(index, f"GPU-r{index}", f"00000000:{0x10 + index:02x}:00.0", **values)
            owner[index] = job
            index += 1
    scenario.add("xid 2 4 48")
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1")
    agent = start_agent(fake_nvml, scenario.write(tmp_path / "s.scn"), tmp_path / "a", "n1",
                        collector=collector.url, token=collector.token)
    try:
        for job in JOBS:
            gpus = ",".join(str(i) for i, j in owner.items() if j == job)
            assert agent.control("register", job, "--uid", str(os.getuid()), "--gpus", gpus,
                                 "--partition", "gpu")["ok"]
        deadline = time.monotonic() + 60
        expected = {(job, *flag) for job, (_, flags) in JOBS.items() for flag in flags}
        while time.monotonic() < deadline:
            got = flags(dsn)
            if expected <= got:
                break
            time.sleep(0.5)
        time.sleep(3)  # more cycles: flags must be refreshed, never duplicated
        got = flags(dsn)
        for job in JOBS:
            assert agent.control("unregister", job, "--exit-code", "0")["ok"]
        time.sleep(3)
    finally:
        agent.stop()
        stop_collector(collector)

    print("\nrule               TP  FP  FN  precision  recall")
    for rule in sorted({f[1] for f in expected | got}):
        tp = len({f for f in got if f[1] == rule} & expected)
        fp = len({f for f in got if f[1] == rule} - expected)
        fn = len({f for f in expected if f[1] == rule} - got)
        print(f"{rule:18} {tp:3} {fp:3} {fn:3}  {tp / (tp + fp) if tp + fp else 1:9.2f} {tp / (tp + fn) if tp + fn else 1:7.2f}")
    assert got == expected

    with psycopg.connect(dsn) as conn:
        per_flag = conn.execute("SELECT job_id, rule_id, scope_key, count(*) FROM jobpulse.job_flags"
                                " GROUP BY 1, 2, 3").fetchall()
        assert all(n == 1 for *_, n in per_flag)  # one row per condition, refreshed in place
        assert conn.execute("SELECT count(*) FROM jobpulse.job_flags WHERE ended_at IS NULL").fetchone()[0] == 0
        idle = conn.execute("SELECT evidence, advice, category, severity,"
                            " extract(epoch from opened_at - started_at)::float8 FROM jobpulse.job_flags"
                            " WHERE rule_id = 'idle_gpu'").fetchone()
        hw = dict(conn.execute("SELECT rule_id, category FROM jobpulse.job_flags WHERE job_id = '8003'").fetchall())
        low = conn.execute("SELECT evidence FROM jobpulse.job_flags WHERE rule_id = 'low_utilization'").fetchone()[0]
        mem = conn.execute("SELECT evidence FROM jobpulse.job_flags WHERE rule_id = 'memory_underused'").fetchone()[0]
    evidence, advice, category, severity, delay = idle
    assert evidence["memory_mib"] == 30_000 and evidence["idle_minutes"] >= 0.05 and category == "code"
    assert "n1/GPU3 has been idle" in advice and "30000 MiB" in advice
    # From the condition becoming true (idle run reaching its length) to the flag row.
    latency = delay - 0.05 * 60
    print(f"idle GPU flagged {latency:.1f} s after its idle run reached the configured length")
    assert latency < 120
    assert hw == {"hw_throttling": "hardware", "xid_error": "hardware"}
    assert low["metric"] == "SM activity (GPM)" and low["mean_percent"] == pytest.approx(12, abs=0.5)
    assert mem["peak_share"] < 0.02
    with psycopg.connect(dsn) as conn:
        pcie = conn.execute("SELECT evidence, category FROM jobpulse.job_flags WHERE rule_id = 'pcie_downgraded'"
                            ).fetchone()
    assert pcie == ({"share_of_busy_samples": 1.0, "link": "3x8/4x16"}, "hardware")

    # The report of the job with the idle GPU shows it, its GPUs, and the advice.
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "8002", "--dsn", dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Job 8002" in out.stdout and "partition gpu" in out.stdout and "state COMPLETED" in out.stdout
    assert "n1/GPU2  util" in out.stdout and "n1/GPU3  util" in out.stdout
    assert "[warning/code] idle_gpu n1/GPU-r3 (closed)" in out.stdout and "advice: n1/GPU3 has been idle" in out.stdout
    assert "GPU-hours:" in out.stdout
    data = json.loads(subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "8002", "--dsn", dsn,
                                      "--format", "json"], capture_output=True, text=True, timeout=60).stdout)
    assert {f["rule_id"] for f in data["flags"]} == {"idle_gpu", "imbalance"}
    assert 0.3 < data["usage"]["efficiency"] < 0.6  # one busy (85% SM activity) and one idle GPU
    missing = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "424242", "--dsn", dsn],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no job '424242'" in missing.stderr


def flags(dsn: str) -> set[tuple[str, str, str, int | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT job_id, rule_id, scope, scope_key FROM jobpulse.job_flags").fetchall()
    out = set()
    for job, rule, scope, key in rows:
        index = int(key.rsplit("GPU-r", 1)[1]) if "GPU-r" in key else None
        out.add((job, rule, scope, index))
    return out
