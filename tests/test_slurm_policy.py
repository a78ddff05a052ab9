"""The idle-GPU policy on the real two-node Slurm cluster: a job that holds an idle GPU is warned,
then cancelled with its reason in the job's AdminComment; a job of an exempt partition is not; the
report shows what was done."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import start_collector, stop_collector
from .slurm_cluster import SlurmCluster, available
from .test_slurm import configure, query, running_cluster, wait_until

pytestmark = pytest.mark.skipif(available() is not None, reason=f"Slurm cluster: {available()}")
RULES = Path(__file__).parent / "data" / "rules_fast.toml"


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
