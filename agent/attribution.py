"""Attribute: PID -> job, step, rank, local rank, from the kernel's view of the process.

The job comes from the process's Slurm cgroup (``job_<id>/step_<step>/task_<n>``, cgroup v1
and v2 layouts; from Slurm 26.05 the job's directory is named by its SLUID, which the task's
environment pairs with its job id in ``SLURM_JOB_SLUID``) when Slurm confines jobs in cgroups;
otherwise from ``SLURM_JOB_ID`` in its initial environment, accepted only when the process belongs
to the user the job was registered for. Rank and local rank come from
``SLURM_PROCID``/``SLURM_LOCALID``, used only when the environment names the same job as the cgroup.
An owner found through the cgroup carries the job's cgroup directory, from which the process sampler
then takes the job's processes (`procfs.CgroupTree`) instead of listing /proc.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from jobpulse.agent.procfs import ProcFs, Stat
from jobpulse.agent.slurm.dialect import SLUID, cgroup_job, cgroup_job_dir

_STEP = re.compile(r"/step_([A-Za-z0-9_]+)(?:/|$)")
_TASK = re.compile(r"/task_(\d+)(?:/|$)")
_ENV = frozenset({"SLURM_JOB_ID", "SLURM_JOB_SLUID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID",
                  "SLURMD_NODENAME"})


@dataclass(frozen=True)
class Owner:
    job_id: str
    step: str | None
    rank: int | None
    local_rank: int | None
    uid: int | None
    cgroup: str | None = None  # the job's cgroup directory on this machine, where its cgroup named it


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def _job_line(text: str) -> tuple[str, str] | None:
    """(controllers, path) of the first /proc/PID/cgroup line whose path names a Slurm job."""
    for line in text.splitlines():
        _, controllers, path = (["", "", ""] + line.split(":", 2))[-3:]
        if cgroup_job_dir(path):
            return controllers, path
    return None


def parse_cgroup(text: str) -> tuple[str | None, str | None, int | None]:
    """(job, step, task) from /proc/PID/cgroup, any hierarchy that names a Slurm job: the job is its
    id, or its SLUID where Slurm 26.05 named the directory so."""
    found = _job_line(text)
    if found is None:
        return None, None, None
    path = found[1]
    job_id, sluid = cgroup_job(path)
    step, task = _STEP.search(path), _TASK.search(path)
    return job_id or sluid, step.group(1) if step else None, int(task.group(1)) if task else None


class Attributor:
    """Caches one owner per PID, valid while the PID's start time and name stay: a process that takes
    over a finished rank's PID is resolved anew, never the old rank, and so is a task after its exec
    (before it, the task slurmstepd forked shows slurmstepd's name and environment); a process that
    renames itself replaces its entry. ``forget`` drops PIDs that are gone. Shared by the process
    sampler and the event socket, hence the lock."""

    def __init__(self, proc: ProcFs, job_uid: Callable[[str], int | None], node: str | None = None) -> None:
        self.proc = proc
        self.job_uid = job_uid
        self.node = node
        self._cache: dict[int, tuple[tuple[int, str], Owner | None]] = {}  # pid -> ((start, name), owner)
        self._lock = threading.Lock()
        self.generation = 0  # bumped by retry_unowned: a caller that skips unowned PIDs looks again

    def job_of(self, pid: int) -> str | None:
        """The job ``pid`` belongs to (None: in no job, or gone)."""
        owner = self.owner(pid)
        return owner.job_id if owner else None

    def owner(self, pid: int, stat: Stat | None = None) -> Owner | None:
        """The owner of ``pid``; ``stat``: its /proc stat when the caller has just read it."""
        stat = stat or self.proc.stat(pid)
        if stat is None:
            return None  # gone already
        key = (stat.start_ticks, stat.comm)
        with self._lock:
            cached = self._cache.get(pid)
            if cached is not None and cached[0] == key:
                return cached[1]
            generation = self.generation
        owner = self._resolve(pid)
        with self._lock:
            if owner is not None or self.generation == generation:  # else a job registered meanwhile: ask again
                self._cache[pid] = (key, owner)
        return owner

    def forget(self, alive: set[int]) -> None:
        with self._lock:
            for pid in [p for p in self._cache if p not in alive]:
                del self._cache[pid]

    def retry_unowned(self) -> None:
        """Resolve unowned PIDs again (a job registered after its processes were first seen)."""
        with self._lock:
            for pid in [p for p, (_, owner) in self._cache.items() if owner is None]:
                del self._cache[pid]
            self.generation += 1

    def claim(self, pid: int, uid: int) -> Owner | None:
        """The job an unowned ``pid``'s environment names, for ``uid`` (the user the kernel says sent):
        its prolog's registration may reach the agent after the job's first events, which wait for it
        (`confirm`)."""
        named = self._resolve(pid, claimed=True)
        return None if named is None else replace(named, uid=uid)

    def confirm(self, claim: Owner) -> bool:
        """Whether the claimed job is now registered, to the user the process ran as."""
        return claim.uid is not None and self.job_uid(claim.job_id) == claim.uid

    def _resolve(self, pid: int, claimed: bool = False) -> Owner | None:
        uid = self.proc.uid(pid)
        cgroups = self.proc.cgroup(pid)
        cg_job, cg_step, cg_task = parse_cgroup(cgroups)
        env = self.proc.environ(pid, _ENV)
        if self.node and env.get("SLURMD_NODENAME", self.node) != self.node:
            return None  # a task slurmd started for another node (several slurmd on one host)
        env_job = env.get("SLURM_JOB_ID")
        if cg_job is not None and SLUID.fullmatch(cg_job):  # 26.05: the job the task's SLUID names
            cg_job = env_job if env.get("SLURM_JOB_SLUID") == cg_job and env_job and env_job.isdigit() else None
            if cg_job is None:
                return None  # a Slurm job's process, but which job is not to be told
        if cg_job is not None:
            expected = self.job_uid(cg_job)
            if expected is not None and uid != expected:
                return None  # in the job's cgroup but not the job's user: not the job's process
            same = env_job == cg_job
            return Owner(cg_job, cg_step if cg_step is not None else (env.get("SLURM_STEP_ID") if same else None),
                         _int(env.get("SLURM_PROCID")) if same else None,
                         _int(env.get("SLURM_LOCALID")) if same else cg_task, uid, self._job_dir(cgroups))
        if env_job is None or not env_job.isdigit():
            return None
        expected = self.job_uid(env_job)
        if not claimed and (expected is None or uid != expected):
            return None  # not a job we serve, or a process claiming someone else's job
        return Owner(env_job, env.get("SLURM_STEP_ID"), _int(env.get("SLURM_PROCID")),
                     _int(env.get("SLURM_LOCALID")), uid)

    def _job_dir(self, cgroups: str) -> str | None:
        """The job's cgroup directory on this machine, from the process's /proc/PID/cgroup."""
        found = _job_line(cgroups)
        top = cgroup_job_dir(found[1]) if found else None
        return self.proc.cgroup_dir(found[0], top) if found and top else None
