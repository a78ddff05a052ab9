"""jobpulse on each Slurm a site runs: 22.05 (the host's), 24.11 and 26.05 (Debian chroots,
`tests/slurm_chroot.py`), real slurmctld, two slurmd and slurmdbd of that version. The project's
prolog and epilog run inside that version's slurmd; `slurm-sync` reads that version's squeue. Only
what depends on the version is repeated here; the rest of the Slurm tier runs on 22.05."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import slurm_chroot
from .conftest import RunningCollector
from .slurm_cluster import NODES, AccountingCluster, ChrootCluster, SlurmCluster, accounting_available
from .test_slurm import agent_pids, configure, query, running_cluster, wait_until

VERSIONS = (SlurmCluster.version, *slurm_chroot.SUITES)


def _why_not(version: str) -> str | None:
    return accounting_available() or (None if version == SlurmCluster.version else slurm_chroot.unavailable(version))


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"slurm-{v}") for v in VERSIONS])
def cluster(request: pytest.FixtureRequest, fake_nvml: Path) -> Iterator[SlurmCluster]:
    version = request.param
    why = _why_not(version)
    if why:
        pytest.skip(f"Slurm {version}: {why}")

    def kind(*paths: Path) -> SlurmCluster:
        return AccountingCluster(*paths) if version == SlurmCluster.version else ChrootCluster(*paths, version=version)

    with running_cluster(fake_nvml, kind) as c:  # type: ignore[arg-type]
        yield c


JOBS = {  # kind -> (sbatch options, script body, (state, exit code) jobpulse records)
    "exit0": (["-N2", "--ntasks-per-node=1", "--gres=gpu:1"], "srun {python} {root}/rank.py\nexit 0", ("COMPLETED", 0)),
    "exit3": (["-N1"], "sleep 2\nexit 3", ("FAILED", 3)),
    "first_second": (["-N1"], "exit 3", ("FAILED", 3)),
    "signal": (["-N1"], "sleep 2\nkill -9 $$", ("FAILED", 137)),
    "failed_step": (["-N1"], "srun false\nsleep 2\nexit 0", ("FAILED", 1)),
    "timeout": (["-N1", "--time=10"], "sleep 600", ("TIMEOUT", 0)),
}


def test_jobs_end_as_each_version_says(cluster: SlurmCluster, collector: RunningCollector, dsn: str) -> None:
    """Prolog registration and epilog end on two nodes; the sync's states and exit codes for jobs
    that exit 0, exit 3, fail in their first second, are killed by a signal, have a failed step or
    time out; the run (Slurm's restart count)."""
    configure(cluster, collector.url)
    jobs = {kind: cluster.sbatch(*opts, f"--job-name={kind}", f"--output={cluster.root}/out-%j.txt",
                                 script="#!/bin/bash\n" + body.format(python=sys.executable, root=cluster.root) + "\n")
            for kind, (opts, body, _) in JOBS.items()}
    wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.jobs WHERE job_id = %s", jobs["timeout"])[0][0], 90,
               "the timeout job to be registered")
    cluster.run("scontrol", "update", f"JobId={jobs['timeout']}", "EndTime=now+10", check=True)
    for job in jobs.values():
        cluster.wait_done(job, timeout=150)
    for node in NODES:
        wait_until(lambda: not agent_pids(cluster.root, node), 30, f"the agent on {node} to exit")
    sync = cluster.run(sys.executable, "-m", "jobpulse.agent", "slurm-sync", "--once", "--collector", collector.url,
                       "--token-file", str(cluster.root / "token"), "--node", "ctld", "--cluster", "jpcluster",
                       "--spool-dir", str(cluster.root / "sync-spool"), timeout=60)
    assert sync.returncode == 0, sync.stderr
    rows = {r[0]: r[1:] for r in query(dsn, "SELECT job_id, state, exit_code, run, nodes FROM jobpulse.jobs")}
    logs = "".join(p.read_text() for p in (cluster.root / "jp").glob("*/log/*.log"))
    assert {kind: rows[job][:2] for kind, job in jobs.items() if job in rows} == {
        kind: end for kind, (_, _, end) in JOBS.items()}, logs
    assert rows[jobs["exit0"]][2:] == (0, ["n1", "n2"])
    gpus = query(dsn, "SELECT DISTINCT node FROM jobpulse.gpu_samples WHERE job_id = %s", jobs["exit0"])
    assert sorted(g[0] for g in gpus) == ["n1", "n2"]  # both nodes' agents, started by that version's prolog


def test_an_admin_comment_reads_back_as_written(cluster: SlurmCluster) -> None:
    """What the idle-GPU policy writes (with quotes, which accounting stores as backticks) reads
    back through the reader as written (22.05 lower-cases it)."""
    job = cluster.sbatch("-N1", f"--output={cluster.root}/out-%j.txt", script="#!/bin/bash\nsleep 1\n")
    cluster.wait_done(job)
    written = 'jobpulse: Warned, "idle" GPUs'
    wait_until(lambda: cluster.run("sacctmgr", "-i", "update", "job", "where", f"jobid={job}", "set",
                                   f"AdminComment={written}").returncode == 0
               and job in cluster.run("sacct", "-n", "-X", "-j", job, "-o", "JobID").stdout, 30, "accounting's job")
    read = "from jobpulse.agent.slurm.admin_comment import current; import sys; print(current(sys.argv[1]))"
    got = cluster.run(sys.executable, "-c", read, job, check=True).stdout.strip()
    assert got == (written.lower() if cluster.version == SlurmCluster.version else written)
