"""The site policy on the real two-node Slurm cluster: a job that holds an idle GPU is warned, then
cancelled with its reason in the job's AdminComment; a job of an exempt partition is not; a hung job
(its GPUs spinning at near-idle power) is warned at once and cancelled after its warning; the report
shows what was done."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .agents import Scenario
from .conftest import start_collector, stop_collector
from .slurm_cluster import SlurmCluster, available
from .test_slurm import agent_pids, configure, query, running_cluster, wait_until

pytestmark = pytest.mark.skipif(available() is not None, reason=f"Slurm cluster: {available()}")
RULES = Path(__file__).parent / "data" / "rules_fast.toml"
# The hung job's GPUs work this long after their scenario starts (written just before the job is
# submitted), then spin. Its working level is the 5-min mean power of its busy samples, the spin's
# included: 10 s of work at 600 W keep it above twice the spin's 80 W until the job is cancelled, so
# an agent that starts 30 s late on a loaded machine still sees a job that worked, then hung.
WORK_S = 45


@pytest.fixture(scope="module")
def idle_cluster(fake_nvml: Path) -> Iterator[SlurmCluster]:
    with running_cluster(fake_nvml, SlurmCluster, sm=(0, 0)) as c:  # every GPU idle
        yield c


def job_state(c: SlurmCluster, job: str) -> dict[str, str]:
    """JobState and AdminComment as `scontrol show job` prints them."""
    out = subprocess.run(["scontrol", "show", "job", job], env=c.env, capture_output=True, text=True,
                         timeout=20, check=True).stdout
    return {k: m.group(1) for k in ("JobState", "AdminComment")
            if (m := re.search(rf"\b{k}=(.*?)(?=\s+[A-Z][A-Za-z]*=|\n|$)", out))}


def test_an_idle_job_is_warned_then_cancelled_and_an_exempt_one_is_not(idle_cluster: SlurmCluster, dsn: str,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    c = idle_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))  # the collector's host is a Slurm client of this cluster
    policy = tmp_path / "policy.toml"
    policy.write_text("""
[idle_gpu]
warn_after_minutes = 0.1
cancel_after_minutes = 0.2
action = "cancel"
cluster = "jpcluster"
exempt_partitions = ["debug"]
""")
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1",
                                "--policy", str(policy))
    try:
        configure(c, collector.url)
        out = f"--output={c.root}/out-%j.txt"
        idle = c.sbatch("-N1", "-w", "n1", "--gres=gpu:1", out, script="#!/bin/bash\nsleep 300\n")
        exempt = c.sbatch("-N1", "-w", "n2", "-p", "debug", "--gres=gpu:1", out, script="#!/bin/bash\nsleep 300\n")
        started = time.monotonic()
        done = c.wait_done(idle, timeout=150)
        took = time.monotonic() - started
        assert done["job_state"] == "CANCELLED", done
        comment = job_state(c, idle).get("AdminComment")
        assert isinstance(comment, str) and comment.startswith("jobpulse: cancelled,") and "idle for" in comment
        actions = query(dsn, "SELECT job_id, action FROM jobpulse.policy_actions ORDER BY at")
        assert [a for j, a in actions if j == idle] == ["warned", "cancelled"]
        wait_until(lambda: ("exempt",) in query(dsn, "SELECT action FROM jobpulse.policy_actions WHERE job_id = %s",
                                                exempt), 30, "the exempt job's audit row")
        assert job_state(c, exempt)["JobState"] == "RUNNING", "an exempt partition's job runs on"
        report = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", idle, "--dsn", dsn],
                                capture_output=True, text=True, timeout=60, check=True).stdout
        assert "Idle-GPU policy:" in report and "warned:" in report and "cancelled:" in report
        print(f"\nidle job cancelled {took:.0f} s after submission (warn after 6 s idle, cancel 12 s later)")
    finally:
        subprocess.run(["scancel", exempt], env=c.env, check=False)
        stop_collector(collector)


def test_a_hung_job_is_warned_at_once_then_cancelled(idle_cluster: SlurmCluster, dsn: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Both GPUs of a job work at 600 W for 45 s, then spin (100 % duty cycle at 80 W, no traffic):
    the hung flag, its owner warned at once, the job cancelled after its warning."""
    c = idle_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    scenario = c.root / "n1.scn"
    before = scenario.read_text()
    agent_pids(c.root, "n1", kill=True)  # an agent left from an earlier job plays the scenario it read
    work = dict(sm=95, mem=40, power_mw=600_000, power_limit_mw=700_000, fb_total_mib=81_559, fb_used_mib=50_000,
                pcie_rx_kbs=90_000, pcie_tx_kbs=30_000)
    spin = dict(sm=100, mem=0, power_mw=80_000, pcie_rx_kbs=10, pcie_tx_kbs=10)
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES.read_text() + "hang_minutes = 0.3\n")  # two 10 s blocks of waiting
    policy = tmp_path / "policy.toml"
    policy.write_text("""
[hung]
warn_after_minutes = 0
cancel_after_minutes = 0.1
action = "cancel"
cluster = "jpcluster"
partitions = ["gpu"]
""")
    collector = start_collector(dsn, tmp_path, "--rules", str(rules), "--rules-interval", "1", "--policy", str(policy))
    job = ""
    try:
        configure(c, collector.url)
        hanging = Scenario().add("driver 550.54.15")  # its time starts now, not before the collector did
        for i, bus in enumerate(("00000000:17:00.0", "00000000:65:00.0")):
            hanging.gpu(i, f"GPU-n1-{i}", bus, minor=i, **work).set(WORK_S, i, **spin)
        hanging.write(scenario)
        job = c.sbatch("-N1", "-w", "n1", "--gres=gpu:2", f"--output={c.root}/out-%j.txt",
                       script="#!/bin/bash\nsleep 400\n")
        started = time.monotonic()
        try:
            done = c.wait_done(job, timeout=240)
        except TimeoutError:
            print(query(dsn, "SELECT rule_id, started_at, ended_at, evidence FROM jobpulse.job_flags WHERE job_id = %s", job))
            print(query(dsn, "SELECT * FROM jobpulse.policy_actions WHERE job_id = %s", job))
            print(query(dsn, "SELECT node, gpu_uuid, count(*), min(ts), max(ts), avg(sm_util), avg(power_w), avg(power_limit_w), avg(pcie_rx_kbs), avg(nvlink_rx_kbs) FROM jobpulse.gpu_samples WHERE job_id = %s GROUP BY 1, 2", job))
            print(collector.log.read_text()[-3000:])
            raise
        took = time.monotonic() - started
        assert done["job_state"] == "CANCELLED", done
        comment = job_state(c, job).get("AdminComment")
        assert isinstance(comment, str) and comment.startswith("jobpulse: cancelled,") and "hung since" in comment
        actions = query(dsn, "SELECT action FROM jobpulse.policy_actions WHERE job_id = %s AND policy = 'hung'"
                             " ORDER BY at", job)
        assert actions == [("warned",), ("cancelled",)], actions
        flags = query(dsn, "SELECT rule_id FROM jobpulse.job_flags WHERE job_id = %s", job)
        assert ("hung",) in flags and ("idle_gpu",) not in flags, flags
        report = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", job, "--dsn", dsn],
                                capture_output=True, text=True, timeout=60, check=True).stdout
        assert "Hung-job policy:" in report and "warned:" in report and "cancelled:" in report
        print(f"\nhung job cancelled {took:.0f} s after submission (work {WORK_S} s, spin: flag after 20 s of it)")
    finally:
        if job:
            subprocess.run(["scancel", job], env=c.env, check=False)
        stop_collector(collector)
        scenario.write_text(before)
