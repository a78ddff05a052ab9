"""The real agent takes a job's processes from the job's cgroup once a process showed it: a cgroup v2
tree made on this machine's real cgroup2 hierarchy in Slurm's layout
(``system.slice/slurmstepd.scope/job_ID/step_N/user/task_N``), ranks moved into it as slurmstepd moves
tasks."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobpulse.agent.procfs import cgroup_mounts

from .agents import Scenario, spawn_rank, start_agent
from .conftest import RunningCollector
from .test_agent_e2e import query, wait_for

JOB = "6601"


def _cgroup2() -> Path | None:
    """A cgroup2 mount this process may make directories in (None: none, or not root)."""
    if os.geteuid() != 0:
        return None
    mounts = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    found = next((Path(point) for options, root, point in mounts if options is None and root == "/"), None)
    return found if found and os.access(found, os.W_OK) else None


@pytest.fixture
def job_cgroup() -> Iterator[Path]:
    """The job's directory, under a folder of this test's own on the cgroup2 hierarchy, removed after."""
    top = _cgroup2()
    if top is None:
        pytest.skip("needs root and a writable cgroup2 mount (cgroup v2 or a hybrid machine's unified/); CI has both")
    base = top / f"jobpulse-test-{secrets.token_hex(4)}"
    job = base / "system.slice" / "slurmstepd.scope" / f"job_{JOB}"
    job.mkdir(parents=True)
    yield job
    for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [base]:
        deadline = time.monotonic() + 10
        while d.exists():
            try:
                d.rmdir()
            except OSError:  # a killed process leaves its cgroup once reaped
                assert time.monotonic() < deadline, f"{d} still holds {(d / 'cgroup.procs').read_text()}"
                time.sleep(0.1)


def into(cgroup: Path, proc: subprocess.Popen[bytes]) -> None:
    """Move ``proc`` into ``cgroup`` (made if missing), as slurmstepd places a task."""
    cgroup.mkdir(parents=True, exist_ok=True)
    (cgroup / "cgroup.procs").write_text(str(proc.pid))


def test_a_jobs_processes_come_from_its_cgroup(fake_nvml: Path, collector: RunningCollector, dsn: str,
                                                tmp_path: Path, job_cgroup: Path) -> None:
    """Both ranks (task directories at depth), a step made later (the tree listed again) are sampled
    with their step and rank; a process outside the job's cgroup that claims the job in its
    environment is not: once the cgroup is known /proc is not listed, and Slurm's cgroup is the job."""
    ranks = [spawn_rank(JOB, r, r) for r in (0, 1)]
    started: list[subprocess.Popen[bytes]] = list(ranks)
    try:
        for r, p in enumerate(ranks):
            into(job_cgroup / "step_0" / "user" / f"task_{r}", p)
        scn = (Scenario().gpu(0, "GPU-cg0", "00000000:17:00.0", sm=50, mem=1, fb_total_mib=1000, fb_used_mib=10)
               .add(f"proc 0 0 {ranks[0].pid} 10 1 1").write(tmp_path / "s.scn"))
        agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", collector=collector.url, token=collector.token)
        try:
            assert agent.control("register", JOB, "--uid", "0", "--gpus", "0")["ok"]

            def seen() -> dict[int, set[tuple[str | None, int | None]]]:
                out: dict[int, set[tuple[str | None, int | None]]] = {}
                for pid, step, rank in query(dsn, "SELECT DISTINCT pid, step, rank FROM jobpulse.process_samples"
                                                  " WHERE job_id = %s", JOB):
                    out.setdefault(pid, set()).add((step, rank))
                return out

            wait_for(lambda: {p.pid for p in ranks} <= seen().keys(), 60, "both ranks' samples")
            later = spawn_rank(JOB, 2, 0, step="1")
            started.append(later)
            into(job_cgroup / "step_1" / "user" / "task_0", later)
            wait_for(lambda: later.pid in seen(), 60, "the later step's process")
            outsider = spawn_rank(JOB, 3, 1)  # the job's user and environment, in no cgroup of the job's
            started.append(outsider)
            since = time.time()
            wait_for(lambda: query(dsn, "SELECT count(DISTINCT ts) FROM jobpulse.process_samples WHERE pid = %s"
                                          " AND ts > to_timestamp(%s)", ranks[1].pid, since + 2)[0][0] >= 3, 60,
                       "three ticks after the outsider started")
            found = seen()
            assert found[ranks[0].pid] == {("0", 0)} and found[ranks[1].pid] == {("0", 1)}
            assert found[later.pid] == {("1", 2)}
            assert outsider.pid not in found
            gpu = query(dsn, "SELECT DISTINCT gpu_uuid FROM jobpulse.process_samples WHERE pid = %s", ranks[0].pid)
            assert gpu == [("GPU-cg0",)]
        finally:
            agent.stop()
    finally:
        for p in started:
            p.kill()
            p.wait()
