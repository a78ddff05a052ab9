"""The scheduler's time on a real Slurm cluster with accounting (slurmctld, two slurmd, slurmdbd): a job
`scontrol suspend`ed and resumed has its states with Slurm's own times and its suspended minutes
apart in goodput; a job `scontrol requeue`d and one whose node was taken down each show two runs,
the first kept with how it ended (REQUEUED, NODE_FAIL as accounting names it) and its nodes, the
second judged, summarised and named in the summary."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from jobpulse.collector.report.text import gather

from .conftest import RunningCollector
from .slurm_cluster import NODES, AccountingCluster, accounting_available
from .test_slurm import agent_pids, configure, query, running_cluster, slurm_sync, wait_until

pytestmark = pytest.mark.skipif(accounting_available() is not None,
                                reason=f"Slurm with accounting: {accounting_available()}")

# The first run waits to be requeued; a later run (SLURM_RESTART_COUNT > 0) works a few seconds and ends.
RERUN = "#!/bin/bash\nif [ \"${SLURM_RESTART_COUNT:-0}\" = 0 ]; then sleep 600; else sleep 4; fi\n"


@pytest.fixture(scope="module")
def cluster(fake_nvml: Path) -> Iterator[AccountingCluster]:
    with running_cluster(fake_nvml, AccountingCluster) as c:
        yield c  # type: ignore[misc]


@pytest.fixture(autouse=True)
def agents_gone(cluster: AccountingCluster, collector: RunningCollector) -> Iterator[None]:
    """After each test the agents its jobs started deliver and exit while its collector still runs (an
    agent with batches it cannot send lingers): the next test's jobs start their own, sending to its
    collector."""
    yield
    for node in NODES:
        wait_until(lambda: not agent_pids(cluster.root, node), 60, f"the agent on {node} to exit")


def scontrol(c: AccountingCluster, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=c.env, check=True, timeout=30, capture_output=True)


def state(c: AccountingCluster, job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=c.env, capture_output=True, text=True,
                         timeout=30)
    return out.stdout.strip()


def evaluate(dsn: str) -> None:
    subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "rules", "evaluate", "--dsn", dsn],
                   check=True, capture_output=True, timeout=120)


def started(c: AccountingCluster, dsn: str, job: str, run: int, timeout: float) -> None:
    """Wait for the run's registration; on timeout, say what Slurm and the store hold of the job."""
    try:
        wait_until(lambda: registered(dsn, job, run), timeout, f"run {run} of job {job}")
    except AssertionError as exc:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r %N"], env=c.env, capture_output=True, text=True,
                             timeout=30).stdout.strip()
        rows = query(dsn, "SELECT run, start_time, end_time, state FROM jobpulse.jobs WHERE job_id = %s", job)
        raise AssertionError(f"{exc}; squeue: {out!r}; stored: {rows}") from None


def registered(dsn: str, job: str, run: int) -> bool:
    return query(dsn, "SELECT count(*) FROM jobpulse.jobs WHERE job_id = %s AND run = %s AND start_time IS NOT NULL",
                 job, run)[0][0] == 1


def test_a_suspended_job_has_its_states_and_its_suspension_apart_in_goodput(
        cluster: AccountingCluster, collector: RunningCollector, dsn: str) -> None:
    configure(cluster, collector.url)
    job = cluster.sbatch("-N1", "-w", "n1", "--gres=gpu:2", f"--output={cluster.root}/out-%j.txt",
                         script=f"#!/bin/bash\nsrun {sys.executable} -c 'import time; time.sleep(25)'\n")
    wait_until(lambda: registered(dsn, job, 0) and state(cluster, job) == "RUNNING", 90, "the job to run")
    slurm_sync(cluster, collector)
    scontrol(cluster, "suspend", job)
    wait_until(lambda: state(cluster, job) == "SUSPENDED", 30, "the suspension")
    slurm_sync(cluster, collector)
    wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.job_states WHERE job_id = %s AND state = 'SUSPENDED'",
                             job)[0][0] == 1, 30, "the suspension stored")
    # the agent keeps sampling the suspended job: its GPUs held, its processes stopped (state T)
    wait_until(lambda: query(dsn, "SELECT coalesce(max(ts) - min(ts) >= interval '6 seconds', false)"
                                  " FROM jobpulse.process_samples WHERE job_id = %s AND state = 'T'", job)[0][0],
               30, "stopped processes sampled for 6 s")
    scontrol(cluster, "resume", job)
    wait_until(lambda: state(cluster, job) == "RUNNING", 30, "the resume")
    slurm_sync(cluster, collector)
    cluster.wait_done(job, timeout=120)
    slurm_sync(cluster, collector)
    wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.jobs WHERE job_id = %s AND state = 'COMPLETED'",
                             job)[0][0] == 1, 30, "the end")
    spans = query(dsn, "SELECT state, since, until, source FROM jobpulse.job_states WHERE job_id = %s ORDER BY since",
                  job)
    assert [s[0] for s in spans] == ["RUNNING", "SUSPENDED", "RUNNING"], spans
    assert all(s[3] == "slurm" for s in spans) and spans[0][2] == spans[1][1] and spans[1][2] == spans[2][1]
    (start, end), = query(dsn, "SELECT start_time, end_time FROM jobpulse.jobs WHERE job_id = %s", job)
    assert spans[0][1] == start and spans[2][2] == end  # Slurm's times: start, suspend, resume, end
    held = spans[1][2] - spans[1][1]
    assert held >= timedelta(seconds=4)
    with psycopg.connect(dsn) as conn:
        g = gather(conn, job, None)["goodput"]
    # 2 GPUs held while suspended: apart, neither badput nor productive
    assert g["scheduler_gpu_hours"]["suspended"] == pytest.approx(2 * held.total_seconds() / 3600, rel=0.01)
    assert "suspended" not in g["badput_gpu_hours"]


def test_a_requeued_job_shows_two_runs_and_its_second_is_judged(
        cluster: AccountingCluster, collector: RunningCollector, dsn: str) -> None:
    configure(cluster, collector.url)
    job = cluster.sbatch("-N1", "-w", "n1", "--gres=gpu:1", "--requeue", f"--output={cluster.root}/out-%j.txt",
                         script=RERUN)
    started(cluster, dsn, job, 0, 150)  # a sched_interval (60 s) after the last job
    slurm_sync(cluster, collector)
    scontrol(cluster, "requeue", job)
    wait_until(lambda: state(cluster, job) == "PENDING", 60, "the requeue")
    slurm_sync(cluster, collector)  # the restart count rose: how run 0 ended, from accounting
    wait_until(lambda: query(dsn, "SELECT end_time IS NOT NULL FROM jobpulse.jobs WHERE job_id = %s", job)[0][0],
               60, "the first run's end (its epilog)")
    evaluate(dsn)  # the first run judged final
    scontrol(cluster, "update", f"JobId={job}", "StartTime=now")  # not after Slurm's requeue delay (2 min)
    wait_until(lambda: registered(dsn, job, 1), 150, "the second run")  # eligible now; started at the
    # scheduler's next pass, which may be a sched_interval (60 s) away, then its prolog
    (row,) = query(dsn, "SELECT end_time, rules_final_at FROM jobpulse.jobs WHERE job_id = %s", job)
    assert row == (None, None)  # the row is the second run's, to be judged
    cluster.wait_done(job, timeout=120)
    slurm_sync(cluster, collector)
    wait_until(lambda: query(dsn, "SELECT state FROM jobpulse.jobs WHERE job_id = %s", job)[0][0] == "COMPLETED", 30,
               "the second run's end")
    runs = query(dsn, "SELECT run, state, nodes, start_time < end_time FROM jobpulse.job_runs WHERE job_id = %s", job)
    assert runs == [(0, "REQUEUED", ["n1"], True)], runs
    (first_end,) = query(dsn, "SELECT end_time FROM jobpulse.job_runs WHERE job_id = %s", job)[0]
    (start, end) = query(dsn, "SELECT start_time, end_time FROM jobpulse.jobs WHERE job_id = %s", job)[0]
    assert first_end <= start < end  # no start after an end
    wait_until(lambda: evaluate(dsn) is None and query(
        dsn, "SELECT count(*) FROM jobpulse.job_summaries WHERE job_id = %s AND end_time = %s", job, end)[0][0] == 1,
        60, "the second run's summary")
    (text,) = query(dsn, "SELECT text FROM jobpulse.job_summaries WHERE job_id = %s", job)[0]
    assert "Runs: run 1 ended REQUEUED on n1" in text and "run 2 ended COMPLETED on n1" in text, text


def test_a_job_whose_node_went_down_keeps_its_node_fail_run(
        cluster: AccountingCluster, collector: RunningCollector, dsn: str) -> None:
    configure(cluster, collector.url)
    job = cluster.sbatch("-N2", "--gres=gpu:1", "--requeue", f"--output={cluster.root}/out-%j.txt", script=RERUN)
    started(cluster, dsn, job, 0, 150)  # a sched_interval (60 s) after the last job
    slurm_sync(cluster, collector)
    scontrol(cluster, "update", "NodeName=n2", "State=DOWN", "Reason=jobpulse-test")
    try:
        wait_until(lambda: state(cluster, job) == "PENDING", 60, "the requeue after the node failed")
        # accounting names how the run ended once slurmdbd has the record
        wait_until(lambda: "NODE_FAIL" in subprocess.run(
            ["sacct", "-n", "-X", "-D", "-j", job, "-o", "State"], env=cluster.env, capture_output=True, text=True,
            timeout=30).stdout, 60, "accounting to record the node failure")
        slurm_sync(cluster, collector)
    finally:
        subprocess.run(["scontrol", "update", "NodeName=n2", "State=RESUME"], env=cluster.env, capture_output=True,
                       timeout=30)  # refused if it is back already
    scontrol(cluster, "update", f"JobId={job}", "StartTime=now")
    wait_until(lambda: registered(dsn, job, 1), 120, "the second run")
    cluster.wait_done(job, timeout=120)
    slurm_sync(cluster, collector)
    runs = query(dsn, "SELECT run, state, nodes FROM jobpulse.job_runs WHERE job_id = %s", job)
    assert runs == [(0, "NODE_FAIL", ["n1", "n2"])], runs
    with psycopg.connect(dsn) as conn:
        report = gather(conn, job, None)
    assert [(r["run"], r["state"]) for r in report["runs"]] == [(0, "NODE_FAIL"), (1, "COMPLETED")]
