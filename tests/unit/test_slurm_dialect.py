"""The one reader of what Slurm says, on each version's real output (`tests/data/slurm/`: 22.05,
24.11 and 26.05 daemons, jobs that ended every way jobpulse tells apart)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobpulse.agent.attribution import Attributor, parse_cgroup
from jobpulse.agent.procfs import ProcFs
from jobpulse.agent.slurm import dialect
from jobpulse.agent.slurm.env import end_state, job_gpus, job_metadata, oom_killed
from jobpulse.agent.slurm.sync import records

from .test_agent_units import fake_proc

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
VERSIONS = ("22.05", "24.11", "26.05")
# kind -> (state, exit code) the sync records; None: no record (the job never ran)
ENDS = {"exit0": ("COMPLETED", 0), "exit3": ("FAILED", 3), "first_second": ("FAILED", 3),
        "signal": ("FAILED", 137), "failed_step": ("FAILED", 1), "timeout": ("TIMEOUT", 0),
        "cancelled_pending": None, "running": ("SUSPENDED", None), "pending_gpus": None}


def doc(kind: str, version: str) -> dict[str, object]:
    found: dict[str, object] = json.loads((DATA / f"{kind}-{version}.json").read_text())
    return found


def hooks(version: str) -> list[tuple[str, dict[str, str]]]:
    """(hook, environment) of every prolog and epilog recorded."""
    out = []
    for block in (DATA / f"env-{version}.txt").read_text().split("=== ")[1:]:
        head, *lines = block.splitlines()
        env = dict(line.split("=", 1) for line in lines if "=" in line)
        if "SLURM_JOB_ID" in env:
            out.append((head.split()[0], env))
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_the_sync_reads_states_and_exit_codes_as_each_version_means_them(version: str) -> None:
    """23.02+'s return_code is the exit status (3, not 3 >> 8 = 0); a job failing in its first
    second (start == end) is kept, one cancelled while pending is not; a running job's state shows."""
    squeue = doc("squeue", version)
    names = {str(j["job_id"]): j["name"] for j in squeue["jobs"]}  # type: ignore[index, union-attr]
    got = {names[r.job_id]: (r.state, r.exit_code) for r in records(dialect.squeue_jobs(squeue))}
    assert got == {kind: end for kind, end in ENDS.items() if end is not None}
    jobs = {j.name: j for j in dialect.squeue_jobs(squeue)}
    assert jobs["first_second"].start == jobs["first_second"].end and jobs["first_second"].ran
    assert jobs["running"].tres_per_node and jobs["running"].restarts == 0
    assert all((j.sluid is not None) == (version == "26.05") for j in jobs.values())  # 26.05's SLUID


@pytest.mark.parametrize("version", VERSIONS)
def test_sacct_states_and_times_wherever_each_version_put_them(version: str) -> None:
    jobs = {j.name: j for j in dialect.sacct_jobs(doc("sacct", version))}
    assert {k: j.state for k, j in jobs.items()} == {
        "exit0": "COMPLETED", "exit3": "FAILED", "first_second": "FAILED", "signal": "FAILED",
        "failed_step": "COMPLETED", "timeout": "TIMEOUT", "cancelled_pending": "CANCELLED", "running": "SUSPENDED",
        "pending_gpus": "PENDING"}
    assert jobs["first_second"].start == jobs["first_second"].end is not None
    assert jobs["running"].end is None and jobs["exit0"].submit is not None
    assert jobs["signal"].signal == 9 and jobs["exit0"].admin_comment == ""


def test_an_admin_comment_reads_back_as_written() -> None:
    """24.11's accounting gave `jobpulse:{"v":1}` back with backticks (22.05's too:
    test_slurm_versions)."""
    assert dialect.admin_comment("jobpulse:{`v`:1}") == 'jobpulse:{"v":1}'
    assert dialect.admin_comment("jp1:abc") == "jp1:abc" and dialect.admin_comment(None) == ""


@pytest.mark.parametrize("version", VERSIONS)
def test_the_hooks_environment_is_read_alike_in_every_version(version: str) -> None:
    """The epilog's SLURM_JOB_EXIT_CODE is a wait status in all three; the prolog gives the run."""
    squeue = doc("squeue", version)
    names = {str(j["job_id"]): j["name"] for j in squeue["jobs"]}  # type: ignore[index, union-attr]
    ends = {names[env["SLURM_JOB_ID"]]: end_state(env, False) for hook, env in hooks(version)
            if hook == "epilog" and names.get(env["SLURM_JOB_ID"]) in ("exit0", "exit3", "signal", "failed_step")}
    assert ends == {"exit0": (None, 0), "exit3": ("FAILED", 3), "signal": ("FAILED", 137), "failed_step": ("FAILED", 1)}
    prologs = [env for hook, env in hooks(version) if hook == "prolog"]
    assert prologs and all(job_metadata(env)["run"] == 0 for env in prologs)
    assert all(("SLURM_JOB_SLUID" in env) == (version == "26.05") for env in prologs)
    gpus = [job_gpus(env) for env in prologs if names.get(env["SLURM_JOB_ID"]) == "running"]
    assert gpus == [["0", "1"], ["0", "1"]]  # each node's indices


def test_gpus_by_uuid_in_cuda_visible_devices() -> None:
    """25.11+ may name the job's GPUs by UUID: taken as names, not indices."""
    assert job_gpus({"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "GPU-5c1f-aa,GPU-9a07-bb"}) == [
        "GPU-5c1f-aa", "GPU-9a07-bb"]
    assert job_gpus({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}) == ["2", "3"]


SLUID = "sB19M8TKC67X00"  # job 1 of the 26.05 recording


@pytest.mark.parametrize(("text", "expected"), [
    (f"0::/system.slice/slurmstepd.scope/{SLUID}/step_0/user/task_2\n", (SLUID, "0", 2)),
    (f"0::/system.slice/slurmstepd.scope/job_{SLUID}/step_batch/user/task_0\n", (SLUID, "batch", 0)),
    ("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_1\n", ("77", "0", 1)),
    ("0::/system.slice/slurmstepd.scope/system\n", (None, None, None)),
])
def test_cgroup_paths_by_job_id_or_sluid(text: str, expected: tuple[object, ...]) -> None:
    assert parse_cgroup(text) == expected


def test_attribution_through_a_sluid_named_cgroup(tmp_path: Path) -> None:
    """26.05: the cgroup names the SLUID; the task's own SLURM_JOB_SLUID pairs it with its job id."""
    me = os.getuid()
    cg = f"0::/system.slice/slurmstepd.scope/{SLUID}/step_0/user/task_1\n"
    fake_proc(tmp_path, 41, cgroup=cg, env={"SLURM_JOB_ID": "1", "SLURM_JOB_SLUID": SLUID, "SLURM_PROCID": "1",
                                            "SLURM_LOCALID": "1"})
    fake_proc(tmp_path, 42, cgroup=cg, env={"SLURM_JOB_ID": "2", "SLURM_JOB_SLUID": "sB19M8TKC69X00"})  # another's
    att = Attributor(ProcFs(str(tmp_path)), lambda job: me if job in ("1", "2") else None)
    owner = att.owner(41)
    assert owner is not None and (owner.job_id, owner.step, owner.rank, owner.local_rank) == ("1", "0", 1, 1)
    assert att.owner(42) is None  # in job 1's cgroup, claiming job 2: no one's


def test_the_oom_check_finds_a_sluid_named_cgroup(tmp_path: Path) -> None:
    job = tmp_path / "system.slice" / "slurmstepd.scope" / SLUID
    job.mkdir(parents=True)
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert oom_killed("1", tmp_path, sluid=SLUID) and not oom_killed("1", tmp_path)
