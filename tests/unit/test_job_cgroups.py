"""A job's processes from its cgroup: where each hierarchy is mounted (mountinfo), the job's directory
an owner carries, and the PIDs of a directory tree, on trees laid out as Slurm's (regular files here;
`tests/test_agent_cgroups.py` runs the real agent on the machine's cgroup v2)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from jobpulse.agent.attribution import Attributor
from jobpulse.agent.procfs import CgroupTree, ProcFs, cgroup_mounts
from jobpulse.agent.slurm.dialect import cgroup_job_dir

from .test_agent_units import fake_proc

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
"""
SLUID = "sB19M8TKC67X00"


def test_each_hierarchy_where_it_is_mounted() -> None:
    """A hybrid machine (this kind: v1 controllers beside cgroup2 at unified/), a container's mount of
    a subtree (root not /), a mount point with a space (octal-escaped in mountinfo)."""
    mounts = cgroup_mounts(HYBRID + "50 23 0:40 /kubepods/pod1 /host\\040cg rw - cgroup2 cgroup2 rw\n")
    assert [(None if o is None else sorted(o - {"rw"}), r, p) for o, r, p in mounts] == [
        (["cpu", "cpuacct"], "/", "/sys/fs/cgroup/cpu,cpuacct"), (["memory"], "/", "/sys/fs/cgroup/memory"),
        (["name=systemd", "xattr"], "/", "/sys/fs/cgroup/systemd"), (None, "/", "/sys/fs/cgroup/unified"),
        (None, "/kubepods/pod1", "/host cg")]


def proc_with_mounts(root: Path, mountinfo: str) -> ProcFs:
    (root / "self").mkdir(parents=True, exist_ok=True)
    (root / "self" / "mountinfo").write_text(mountinfo)
    return ProcFs(str(root))


def test_a_cgroup_line_to_its_directory(tmp_path: Path) -> None:
    proc = proc_with_mounts(tmp_path, HYBRID)
    job = "/system.slice/slurmstepd.scope/job_7"
    assert proc.cgroup_dir("", job) == f"/sys/fs/cgroup/unified{job}"  # v2: the cgroup2 mount
    assert proc.cgroup_dir("memory", "/slurm_n1/uid_0/job_7") == "/sys/fs/cgroup/memory/slurm_n1/uid_0/job_7"
    assert proc.cgroup_dir("cpu,cpuacct", "/slurm/job_7") == "/sys/fs/cgroup/cpu,cpuacct/slurm/job_7"
    assert proc.cgroup_dir("freezer", "/slurm/job_7") is None  # not mounted here
    inner = proc_with_mounts(tmp_path / "c", "50 23 0:40 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert inner.cgroup_dir("", "/kubepods/pod1/slurm/job_7") == "/sys/fs/cgroup/slurm/job_7"
    assert inner.cgroup_dir("", "/elsewhere/job_7") is None  # outside what the mount shows


def test_the_job_directory_of_a_slurm_path() -> None:
    assert cgroup_job_dir("/system.slice/slurmstepd.scope/job_7/step_0/user/task_1") == \
        "/system.slice/slurmstepd.scope/job_7"
    assert cgroup_job_dir("/slurm_n1/uid_0/job_7") == "/slurm_n1/uid_0/job_7"
    assert cgroup_job_dir(f"/system.slice/n1_slurmstepd.scope/{SLUID}/step_batch") == \
        f"/system.slice/n1_slurmstepd.scope/{SLUID}"
    assert cgroup_job_dir("/system.slice/slurmstepd.scope/system") is None


def test_an_owner_found_through_its_cgroup_carries_the_jobs_directory(tmp_path: Path) -> None:
    """Only an owner the cgroup names: one found by its environment alone (proctrack/linuxproc) has
    no cgroup to take the job's processes from."""
    me = os.getuid()
    proc = proc_with_mounts(tmp_path, HYBRID)
    fake_proc(tmp_path, 51, cgroup="4:memory:/slurm_n1/uid_0/job_7/step_0\n0::/system.slice/slurmstepd.scope/job_7"
                                   "/step_0/user/task_0\n", env={"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"})
    fake_proc(tmp_path, 52, cgroup="0::/user.slice\n", env={"SLURM_JOB_ID": "7", "SLURM_PROCID": "1"})
    att = Attributor(proc, lambda job: me if job == "7" else None)
    by_cgroup, by_env = att.owner(51), att.owner(52)
    assert by_cgroup is not None and by_cgroup.cgroup == "/sys/fs/cgroup/memory/slurm_n1/uid_0/job_7"  # its first line
    assert by_env is not None and by_env.job_id == "7" and by_env.cgroup is None


def tree(root: Path, dirs: dict[str, list[int]]) -> None:
    for d, pids in dirs.items():
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))


def test_the_pids_of_a_cgroup_tree(tmp_path: Path) -> None:
    """Every directory's members, at any depth; a step added later, a step removed; the job's own
    directory gone (the job ended): None. Without cgroup.stat (v1) the tree is listed on each call."""
    job = tmp_path / "job_7"
    tree(job, {".": [], "step_extern/slurm": [10], "step_0/slurm": [11], "step_0/user/task_0": [12, 13],
               "step_0/user/task_1": [14]})
    cg = CgroupTree(str(job))
    assert cg.pids() == {10, 11, 12, 13, 14}
    (job / "step_0" / "user" / "task_1" / "cgroup.procs").write_text("14\n15\n")  # forked: read anew
    tree(job, {"step_1/user/task_0": [20]})
    assert cg.pids() == {10, 11, 12, 13, 14, 15, 20}
    shutil.rmtree(job / "step_0")
    assert cg.pids() == {10, 20}
    shutil.rmtree(job)
    assert cg.pids() is None
    cg.close()


def test_cgroup_v2_lists_the_tree_again_only_when_its_descendants_change(tmp_path: Path) -> None:
    job = tmp_path / "job_7"
    tree(job, {".": [], "step_0/user/task_0": [12]})
    (job / "cgroup.stat").write_text("nr_descendants 3\nnr_dying_descendants 0\n")
    cg = CgroupTree(str(job))
    assert cg.pids() == {12}
    tree(job, {"step_1/user/task_0": [20]})
    assert cg.pids() == {12}, "the same count of descendants: the directories kept are read"
    (job / "cgroup.stat").write_text("nr_descendants 6\nnr_dying_descendants 0\n")
    assert cg.pids() == {12, 20}
    cg.close()
