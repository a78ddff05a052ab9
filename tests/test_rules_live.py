"""The rules on scripted jobs: real agent on the fake NVML library, real collector running its
rule loop, real PostgreSQL. Each rule fires on its scenario with the right scope and evidence;
healthy jobs raise nothing; a precision/recall table is printed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from PIL import Image

from .agents import RunningAgent, Scenario, spawn_rank, start_agent
from .conftest import start_collector, stop_collector

RULES = Path(__file__).parent / "data" / "rules_fast.toml"
BUSY = dict(sm=92, mem=40, pcie_gen=4, pcie_width=16, pcie_gen_max=4, pcie_width_max=16, gpm_sm=85, gpm_occ=40,
            gpm_tensor=35, gpm_dram=40, gpm_fp16=30, gpm_fp32=5, gpm_fp64=0, fb_total_mib=81_559, fb_used_mib=50_000,
            clkev=0, power_mw=600_000)
NO_GPM = {k: v for k, v in BUSY.items() if not k.startswith("gpm")}  # duty cycle only (older GPUs)
IDLE = {**BUSY, "sm": 0, "gpm_sm": 0, "gpm_tensor": 0, "fb_used_mib": 30_000}
STARVED = {**BUSY, "sm": 15, "gpm_sm": 12}
FAR_CPU = "8000000000000000"  # CPU 63: no rank of the test machine runs there
WARM_UP_S = 20.0  # job 8013 registers 1 s before its GPU gets busy
# job -> (its GPUs on n1 as value overrides, the flags it must raise as (rule, scope, gpu index or None))
JOBS: dict[str, tuple[list[dict[str, object]], set[tuple[str, str, int | None]]]] = {
    "8001": ([BUSY, BUSY], set()),  # healthy: compute-bound, balanced, memory used, NVLink between its GPUs
    # one GPU goes idle after IDLE_AT_S: idle_gpu explains why it is below its peer (no imbalance flag)
    "8002": ([BUSY, BUSY], {("idle_gpu", "gpu", 3)}),
    "8003": ([{**BUSY, "clkev": 0x40}], {("hw_throttling", "gpu", 4), ("xid_error", "gpu", 4)}),  # sick node
    "8004": ([{**BUSY, "sm": 15, "gpm_sm": 12}], {("low_utilization", "gpu", 5)}),  # starved GPU
    "8005": ([{**BUSY, "gpm_tensor": 0}], {("no_tensor_cores", "gpu", 6)}),  # FP32 only
    "8006": ([{**BUSY, "fb_used_mib": 900}], {("memory_underused", "job", None)}),  # tiny batch
    "8007": ([{**BUSY, "pcie_gen": 3, "pcie_width": 8, "pcie_gen_max": 4, "pcie_width_max": 16}],
             {("pcie_downgraded", "gpu", 8)}),  # a riser that trained down
    # bursts of work, idle in between, while its rank's data-loader worker pins a CPU
    "8008": ([NO_GPM], {("input_bound", "gpu", 9)}),
    # a steady low GPU beside a main process spinning on a core (busy-wait): low use, not input-bound
    "8009": ([{**NO_GPM, "sm": 20}], {("low_utilization", "gpu", 10)}),
    "8010": ([BUSY, BUSY], {("topology_no_nvlink", "job", None)}),  # two GPUs joined by SYS, NVLink elsewhere
    "8011": ([{**BUSY, "cpus": FAR_CPU}], {("numa_far", "rank", None)}),  # a rank far from its GPU
    "8012": ([BUSY], set()),  # healthy: two nodes (its other GPU on n2), balanced
    "8013": ([IDLE], set()),  # healthy: idle for a moment while it starts, then busy
    # on n2 (GPUs 1, 2): a GPU never used, the job's over-allocation, not an idle GPU and a straggler
    "8014": ([], {("over_allocation", "job", None)}),
    # on n2 (GPUs 3, 4): both starved alike, one job-wide flag naming them, not one per GPU
    "8015": ([], {("low_utilization", "job", None)}),
}
IDLE_AT_S = 40.0  # well after registration even on a loaded machine: GPU 3 was busy in its job first


def test_rules_flag_their_scenarios_and_nothing_else(fake_nvml: Path, dsn: str, tmp_path: Path) -> None:
    scenario = Scenario()
    index, owner = 0, {}
    for job, (gpus, _) in JOBS.items():
        for values in gpus:
            cpus = str(values.get("cpus", "ffffffffffffffff"))
            scenario.gpu(index, f"GPU-r{index}", f"00000000:{0x10 + index:02x}:00.0", cpus=cpus,
                         **{k: v for k, v in values.items() if k != "cpus"})
            owner[index] = job
            index += 1
    scenario.add("xid 45 4 48")  # well after the jobs registered (even on a loaded machine): filed under its job
    for a, b in ((0, 1), (2, 3)):  # the healthy multi-GPU jobs sit on NVLink pairs; 11-12 only meet via SYS
        scenario.add(f"nvlink {a} 0 {b}").add(f"nvlink {b} 0 {a}")
    for t in range(0, 240, 2):  # job 8008: busy two seconds, idle the next two (1 Hz samples see both
        scenario.set(t, 9, sm=0 if t % 4 else 95)  # even when a loaded machine delays them)
    scenario.set(WARM_UP_S, 15, **BUSY)
    scenario.set(IDLE_AT_S, 3, **IDLE)
    # The data-loader-bound rank's worker and 8009's main process spin: always runnable, which is the CPU
    # they want (`demand_over`) whatever they get. At the idle scheduling class they take only CPU nobody
    # else wants: two full cores for the whole test would slow every other test sharing the machine.
    spin = {"preexec_fn": lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))}
    spinner = [sys.executable, "-c", "while True: pass"]
    ranks = [spawn_rank("8011", 0, 0), spawn_rank("8008", 0, 0), spawn_rank("8008", 0, 0, command=spinner, **spin),
             spawn_rank("8009", 0, 0, command=spinner, **spin)]
    scenario.add(f"proc 0 13 {ranks[0].pid} 20000 80 30")
    scenario.add(f"proc 0 9 {ranks[1].pid} 20000 50 30")  # 8008's main process; ranks[2] is its loader worker
    scenario.add(f"proc 0 10 {ranks[3].pid} 20000 20 10")
    other = (Scenario(start=scenario.start).gpu(0, "GPU-n2-0", "00000000:20:00.0", **BUSY)
             .gpu(1, "GPU-n2-1", "00000000:21:00.0", **BUSY).gpu(2, "GPU-n2-2", "00000000:22:00.0", **IDLE)
             .gpu(3, "GPU-n2-3", "00000000:23:00.0", **STARVED).gpu(4, "GPU-n2-4", "00000000:24:00.0", **STARVED))
    collector = agent = agent2 = None
    uid = str(os.getuid())
    try:  # the spinning ranks run from here on: whatever fails to start next, they are killed
        collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1")
        agent = start_agent(fake_nvml, scenario.write(tmp_path / "s.scn"), tmp_path / "a", "n1",
                            collector=collector.url, token=collector.token)
        agent2 = start_agent(fake_nvml, other.write(tmp_path / "n2.scn"), tmp_path / "b", "n2",
                             collector=collector.url, token=collector.token)
        for job in JOBS:
            if job in ("8013", "8014", "8015"):
                continue
            gpus = ",".join(str(i) for i, j in owner.items() if j == job)
            assert agent.control("register", job, "--uid", uid, "--gpus", gpus, "--partition", "gpu")["ok"]
        assert agent2.control("register", "8012", "--uid", uid, "--gpus", "0", "--partition", "gpu")["ok"]
        assert agent2.control("register", "8014", "--uid", uid, "--gpus", "1,2", "--partition", "gpu")["ok"]
        assert agent2.control("register", "8015", "--uid", uid, "--gpus", "3,4", "--partition", "gpu")["ok"]
        emit(agent, "8002", "--phase-start", "load")
        time.sleep(4)
        emit(agent, "8002", "--phase-end", "load")
        emit(agent, "8002", "--phase-start", "train")
        time.sleep(max(0.0, scenario.start + WARM_UP_S - 1 - time.time()))
        assert agent.control("register", "8013", "--uid", uid, "--gpus", "14", "--partition", "gpu")["ok"]
        deadline = time.monotonic() + 90
        expected = {(job, *flag) for job, (_, flags) in JOBS.items() for flag in flags}
        while time.monotonic() < deadline:
            got = flags(dsn)
            if expected <= got:
                break
            time.sleep(0.5)
        collector.wait_for_rule_cycles(3)  # flags must be refreshed, never duplicated
        got = flags(dsn)
        for job in JOBS:
            assert (agent2 if job in ("8014", "8015") else agent).control("unregister", job, "--exit-code", "0")["ok"]
        deadline = time.monotonic() + 30  # each job's final cycle closes its flags (later on a loaded machine)
        while open_flags(dsn) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        for r in ranks:
            r.kill()
        for a in (agent, agent2):
            if a is not None:
                a.stop()
        stop_collector(collector)

    print("\nrule               TP  FP  FN  precision  recall")
    for rule in sorted({f[1] for f in expected | got}):
        tp = len({f for f in got if f[1] == rule} & expected)
        fp = len({f for f in got if f[1] == rule} - expected)
        fn = len({f for f in expected if f[1] == rule} - got)
        print(f"{rule:18} {tp:3} {fp:3} {fn:3}  {tp / (tp + fp) if tp + fp else 1:9.2f} {tp / (tp + fn) if tp + fn else 1:7.2f}")
    with psycopg.connect(dsn) as conn:
        unexpected = conn.execute(
            "SELECT job_id, rule_id, scope_key, started_at, opened_at, evidence FROM jobpulse.job_flags"
            " WHERE (job_id, rule_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            ([f[0] for f in got - expected], [f[1] for f in got - expected])).fetchall()
    assert got == expected, f"unexpected flags: {unexpected}"

    with psycopg.connect(dsn) as conn:
        per_flag = conn.execute("SELECT job_id, rule_id, scope_key, count(*) FROM jobpulse.job_flags"
                                " GROUP BY 1, 2, 3").fetchall()
        assert [f for f in per_flag if f[-1] != 1] == []  # one row per condition, refreshed in place
    with psycopg.connect(dsn) as conn:
        still_open = conn.execute(
            "SELECT f.job_id, f.rule_id, f.scope_key, f.last_seen, j.end_time, j.rules_final_at, now()"
            " FROM jobpulse.job_flags f JOIN jobpulse.jobs j USING (cluster, job_id) WHERE f.ended_at IS NULL").fetchall()
    assert still_open == [], "flags left open after their jobs ended"
    with psycopg.connect(dsn) as conn:
        idle = conn.execute("SELECT evidence, advice, category, severity,"
                            " extract(epoch from opened_at - started_at)::float8 FROM jobpulse.job_flags"
                            " WHERE rule_id = 'idle_gpu'").fetchone()
        hw = dict(conn.execute("SELECT rule_id, category FROM jobpulse.job_flags WHERE job_id = '8003'").fetchall())
        low = conn.execute("SELECT evidence FROM jobpulse.job_flags WHERE rule_id = 'low_utilization'"
                               " AND job_id = '8004'").fetchone()[0]
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
    with psycopg.connect(dsn) as conn:
        ev = dict(conn.execute("SELECT job_id || ':' || rule_id, evidence FROM jobpulse.job_flags").fetchall())
    bound = ev["8008:input_bound"]
    assert bound["pattern"] == "workers_saturated" and 0.3 < bound["idle_share"] < 0.7
    # What the rule decides on: the CPU the worker wanted (used, or runnable when a loaded machine kept it waiting).
    assert bound["pid"] == ranks[1].pid and bound["workers"] == 1 and bound["worker_demand_percent"] >= 70
    assert ev["8010:topology_no_nvlink"]["links"] == {"GPU11-GPU12": "SYS"}
    assert ev["8011:numa_far"]["pid"] == ranks[0].pid and ev["8011:numa_far"]["gpu_local_cpus"] == "63"
    assert ev["8014:over_allocation"]["gpus_seen"] == 2 and ev["8014:over_allocation"]["gpus_used"] == 1
    assert ev["8014:over_allocation"]["gpus"] == ["n2/GPU-n2-2"]
    assert ev["8002:idle_gpu"]["memory_mib"] == 30_000
    both = ev["8015:low_utilization"]
    assert both["gpus"] == ["n2/GPU-n2-3", "n2/GPU-n2-4"] and both["gpus_flagged"] == both["gpus_in_job"] == 2
    assert [p["gpu"] for p in both["per_gpu"]] == ["n2/GPU3", "n2/GPU4"]

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
    assert {f["rule_id"] for f in data["flags"]} == {"idle_gpu"}
    assert 0.3 < data["usage"]["efficiency"] < 0.9  # one busy (85% SM activity) GPU, one that went idle
    missing = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "424242", "--dsn", dsn],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no job '424242'" in missing.stderr
    check_html_report(tmp_path, dsn)


def emit(agent: RunningAgent, job: str, *args: str) -> None:
    """A phase event from a process of the job, as a batch script would send it."""
    env = {**os.environ, "SLURM_JOB_ID": job, "SLURM_PROCID": "0", "JOBPULSE_EVENTS_SOCKET": str(agent.events_socket)}
    subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", "emit", args[-1], *args], env=env, check=True,
                   timeout=30)


def check_html_report(tmp_path: Path, rules_db: str) -> None:
    """The HTML report of a finished job: plots hold the job's samples, flags and phases are marked,
    and headless Chromium renders it (screenshot) without errors."""
    html_path, png = tmp_path / "8002.html", tmp_path / "8002.png"
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "8002", "--dsn", rules_db,
                          "--format", "html", "-o", str(html_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    page = html_path.read_text()
    with psycopg.connect(rules_db) as conn:
        start, end = conn.execute("SELECT start_time, end_time FROM jobpulse.jobs WHERE job_id = '8002'").fetchone()
        counts = dict(conn.execute(
            "SELECT node || '/' || gpu_uuid, count(*) FROM jobpulse.gpu_series('testcluster', '8002', %s, %s,"
            " greatest(1, (extract(epoch FROM %s::timestamptz - %s::timestamptz) / 600)::int + 1)) GROUP BY 1",
            (start, end, end, start)).fetchall())
    assert set(counts) == {"n1/GPU-r2", "n1/GPU-r3"}
    for key, n in counts.items():
        assert f"data-gpu='{key}' data-points='{n}'" in page and n >= 10
    assert page.count("data-series='sm_util'") >= 2 and page.count("data-flag='idle_gpu'") == 1
    assert "data-phase='load'" in page and "data-phase='train'" in page and "<script" not in page
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (make setup installs it as root)")
    run = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--enable-logging=stderr", "--v=0", f"--screenshot={png}", "--window-size=1000,1200",
                          html_path.as_uri()], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and png.exists(), run.stderr[-2000:]
    assert "Uncaught" not in run.stderr and "ERROR:CONSOLE" not in run.stderr, run.stderr[-2000:]
    image = Image.open(png).convert("RGB")
    colors = Counter(zip(*[iter(image.tobytes())] * 3))
    assert colors[(0x1F, 0x77, 0xB4)] > 200  # the utilization lines are drawn (pixels of their colour)
    assert len(colors) > 50  # not a blank page
    print(f"HTML report: {html_path.stat().st_size:,} bytes; screenshot {png} {image.size}")


def open_flags(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT count(*) FROM jobpulse.job_flags WHERE ended_at IS NULL").fetchone()[0])


def flags(dsn: str) -> set[tuple[str, str, str, int | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT job_id, rule_id, scope, scope_key FROM jobpulse.job_flags").fetchall()
    out = set()
    for job, rule, scope, key in rows:
        index = int(key.rsplit("GPU-r", 1)[1]) if "GPU-r" in key else None
        out.add((job, rule, scope, index))
    return out
