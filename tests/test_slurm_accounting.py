"""Slurm with its accounting (slurmdbd on MariaDB) as sites run it: the controller's epilog
(`slurm/epilog_slurmctld.sh`) puts each job's jobpulse summary into the job's AdminComment, where
`sacct` shows it long after the job, as Princeton's jobstats does with its own."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobpulse.agent.slurm.admin_comment import compact, decode

from .conftest import RunningCollector
from .slurm_cluster import AccountingCluster, accounting_available
from .test_slurm import configure, query, running_cluster, wait_until

pytestmark = pytest.mark.skipif(accounting_available() is not None,
                                reason=f"Slurm with accounting: {accounting_available()}")


@pytest.fixture(scope="module")
def cluster(fake_nvml: Path) -> Iterator[AccountingCluster]:
    with running_cluster(fake_nvml, AccountingCluster) as c:
        yield c  # type: ignore[misc]


def test_the_job_summary_goes_into_slurms_admin_comment(cluster: AccountingCluster, collector: RunningCollector,
                                                        dsn: str) -> None:
    configure(cluster, collector.url)
    conf = cluster.root / "slurm" / "jobpulse.conf"
    # slurmctld's epilog has no SLURM_CONF: a slurm.conf not at the default path is named in jobpulse.conf
    conf.write_text(conf.read_text().replace("JOBPULSE_ADMIN_COMMENT_WAIT=0", "JOBPULSE_ADMIN_COMMENT_WAIT=90")
                    + f"SLURM_CONF={cluster.conf}\n")
    job = cluster.sbatch("-N1", "--gres=gpu:2", f"--output={cluster.root}/out-%j.txt", script="#!/bin/bash\nsleep 6\n")
    # what the idle-GPU policy writes while a job runs: kept before the summary
    wait_until(lambda: subprocess.run(["scontrol", "update", f"JobId={job}", "AdminComment=jobpulse: warned, idle"],
                                      env=cluster.env, capture_output=True, timeout=30).returncode == 0, 30,
               "the job to run")
    wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.jobs WHERE job_id = %s AND end_time IS NOT NULL",
                             job)[0][0] == 1, 60, "the job's end")
    evaluate = [sys.executable, "-m", "jobpulse.collector.cli", "rules", "evaluate", "--dsn", dsn]
    wait_until(lambda: subprocess.run(evaluate, capture_output=True, timeout=60).returncode == 0 and query(
        dsn, "SELECT count(*) FROM jobpulse.job_summaries WHERE job_id = %s", job)[0][0] == 1, 60, "the job's summary")

    def admin_comment() -> str:
        return subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "AdminComment%4000"], env=cluster.env,
                              capture_output=True, text=True, timeout=30).stdout.strip()

    logs = list((cluster.root / "jp").glob("*/log/admin_comment.log"))
    try:
        wait_until(lambda: " jp1:" in admin_comment(), 90, "the summary in sacct's AdminComment")
    finally:
        logs = list((cluster.root / "jp").glob("*/log/admin_comment.log"))
        print(logs[0].read_text() if logs else "no admin_comment.log")
    value = admin_comment()
    found = decode(value)
    assert value.startswith("jobpulse: warned, idle jp1:")
    summary = query(dsn, "SELECT summary FROM jobpulse.job_summaries WHERE job_id = %s", job)[0][0]
    assert len(value) <= 1024 and found == compact(summary)  # what sacct gives back is the summary's figures
    assert [g[0] for g in found["gpus"]] == ["n1/GPU0", "n1/GPU1"] and "wasted" in found
    out = subprocess.run([sys.executable, "-m", "jobpulse.agent.slurm.admin_comment", "--decode", value],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and json.loads(out.stdout) == found
    assert "summary written into AdminComment" in logs[0].read_text()
