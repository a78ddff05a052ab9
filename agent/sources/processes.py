"""Sample processes: every process on a GPU (NVML) and every process of a served job (/proc),
with GPU memory, SM share, CPU use and RSS, attributed to job, step, rank and PID.

A node runs many processes that are no job's (daemons, shells): each is looked at once, then
skipped while it stays in the /proc listing, and looked at again after a job registers (the
attributor's ``generation``) and once a minute (``RECHECK_S``). A PID that leaves the listing is
forgotten, so a new process under a reused PID is looked at anew (the same PID reused between two
listings one interval apart would need the kernel to wrap around ``pid_max``; the minute's
recheck catches even that).

A new process is looked at on every tick for its first ``SETTLE_S`` seconds, and a task slurmstepd
forked for as long as it still bears slurmstepd's name: slurmstepd runs the task prolog (and a
container's set-up) in the forked task and only then execs the program with the job's environment,
so a task seen before its exec shows slurmstepd's environment and no job (the attributor resolves
it again once the exec changed its name). Without this, a rank first seen in that window went
unattributed until the next job registered on the node: on a Slurm node under load, a whole short
job's process samples were lost.

Once every served job's cgroup is known (the attributor found a job's process through it), the
job's processes come from its cgroup directory tree instead (`procfs.CgroupTree`): /proc is not
listed and no other process is looked at, until a job registers whose cgroup is not known yet or a
job's cgroup goes away. Where Slurm tracks jobs without cgroups (proctrack/linuxproc), /proc is
listed every tick as above.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from datetime import datetime

import msgspec

from jobpulse.agent.attribution import Attributor
from jobpulse.agent.nvml import Nvml, mib
from jobpulse.agent.procfs import CLOCK_TICKS, IO_MAX, CgroupTree, KeptFiles, ProcFs, StatFiles, parse_io
from jobpulse.schema import wire
from jobpulse.schema.fields import HELD_MAX, HOLD_BIN_S

MIB = 1024 * 1024
RECHECK_S = 60.0
SETTLE_S = 10.0
_NO_GPU = [(None, None, None, None)]  # a job process on no GPU: one row without GPU fields
_NOBODY = (None, None, None, None)  # a GPU process of no served job: job, step, rank, local rank


class ProcessSampler:
    def __init__(self, nvml: Nvml, proc: ProcFs, attributor: Attributor, job_ids: Callable[[], set[str]]) -> None:
        self.nvml = nvml
        self.proc = proc
        self.attributor = attributor
        self.job_ids = job_ids
        self._cpu: dict[int, tuple[float, int]] = {}  # pid -> (monotonic time, cpu ticks)
        self._io: dict[int, tuple[float, int, int]] = {}  # pid -> (monotonic time, rchar, wchar)
        self._last_us = int(time.time() * 1e6)
        self._others: set[int] = set()  # PIDs in the listing that were no served job's when looked at
        self._others_for = (-1, 0.0)  # (attributor generation, time) the set was started at
        self._alive: set[int] = set()  # the /proc listing at the last tick
        self._new: dict[int, float] = {}  # PIDs listed less than SETTLE_S ago -> when first listed (monotonic)
        self.stats = StatFiles(proc)  # job and GPU processes' stat files, kept open between ticks
        self.io = KeptFiles(proc, "io", IO_MAX)  # and their io files (rchar, wchar)
        self._trees: dict[str, CgroupTree] = {}  # served job -> its cgroup, once a process showed it
        self._looked: set[int] = set()  # the PIDs the cgroups gave at the last tick

    def sample(self, ts: datetime) -> list[wire.ProcessSample]:
        # GPU side: which PID uses which GPU, how much memory, what SM share.
        on_gpu: dict[int, list[tuple[str, int | None, int | None, int | None]]] = {}
        since, self._last_us = self._last_us, int(ts.timestamp() * 1e6)
        for g in self.nvml.gpus:
            # In MIG mode a process is read on its instance (the parent's list is every instance's again),
            # and NVML has no per-process utilization there: the instance's GPM is its activity.
            if g.lost or g.mig:
                continue
            procs = self.nvml.compute_processes(g)
            util = self.nvml.process_utilization(g, since) if procs and g.parent is None else {}
            for pid, mem in procs:
                sm, mu = util.get(pid, (None, None))
                on_gpu.setdefault(pid, []).append((g.uuid, None if mem is None else mib(mem), sm, mu))
        # Host side: every live process of a job we serve, plus every GPU process. The generation before
        # the jobs: a registration between the two reads (jobs first, then the attributor's retry) leaves
        # the generation read stale, so the next tick looks again.
        generation = self.attributor.generation
        jobs = self.job_ids()
        now = time.monotonic()
        listed = self._from_cgroups(jobs)
        if listed is None:
            look, self._looked = self._from_proc(now, generation, on_gpu), set()
        else:  # every served job's processes from its cgroup: /proc is not listed, no other process looked at
            look = listed | on_gpu.keys()
            if look != self._looked:
                self._looked = look
                self._keep(look, forget=look | self._alive)
        out = []
        for pid in sorted(look):
            stat = self.stats.stat(pid)
            if stat is None:
                continue
            owner = self.attributor.owner(pid, stat)
            if pid not in on_gpu and (owner is None or owner.job_id not in jobs):
                if listed is None:  # (one in a job's cgroup, slurmstepd or another user's, stays looked at)
                    settled = stat.comm != "slurmstepd" and now - self._new.get(pid, -math.inf) >= SETTLE_S
                    if settled:  # else it may not have exec'd yet: looked at again next tick
                        self._others.add(pid)
                    self.stats.drop(pid)
                    self.io.drop(pid)
                continue
            if owner is not None and owner.cgroup and owner.job_id not in self._trees:
                self._trees[owner.job_id] = CgroupTree(owner.cgroup)
            cpu = self._cpu_percent(pid, now, stat.cpu_ticks)
            io_read, io_write = self._io_rates(pid, now)
            job, step, rank, local_rank = (owner.job_id, owner.step, owner.rank, owner.local_rank) if owner else _NOBODY
            for uuid, mem, sm, mu in on_gpu.get(pid, _NO_GPU):
                out.append(wire.ProcessSample(
                    ts=ts, pid=pid, gpu_uuid=uuid, job_id=job, step=step, rank=rank, local_rank=local_rank,
                    gpu_mem_mib=mem, sm_util=sm, mem_util=mu, cpu_percent=cpu, rss_mib=stat.rss_bytes // MIB,
                    command=stat.comm[:256], cpu=stat.processor, runnable=stat.state == "R",
                    cpus_allowed=self._allowed(pid), state=stat.state[:1] or None, io_read_bps=io_read,
                    io_write_bps=io_write))
        return out

    def _from_proc(self, now: float, generation: int,
                   on_gpu: dict[int, list[tuple[str, int | None, int | None, int | None]]]) -> set[int]:
        """The PIDs to look at from the /proc listing: all but those known to be no served job's."""
        alive = self.proc.pids()
        if alive != self._alive:  # processes came or went: forget those gone, note those new
            self._new.update(dict.fromkeys(alive - self._alive, now))  # the first listing's too: a task may
            # be waiting for its exec when the agent starts
            self._new = {p: t for p, t in self._new.items() if p in alive and now - t < SETTLE_S}
            self._alive = alive
            self._keep(alive, forget=alive)
            self._others &= alive
        if generation != self._others_for[0] or now - self._others_for[1] >= RECHECK_S:
            self._others, self._others_for = set(), (generation, now)
        return alive - self._others.difference(on_gpu)  # a process on a GPU is always sampled

    def _from_cgroups(self, jobs: set[str]) -> set[int] | None:
        """Every served job's processes, from its cgroup directory tree; None while a job's cgroup is
        not known (its processes not seen yet, or in no cgroup of Slurm's: /proc is listed)."""
        for job in [j for j in self._trees if j not in jobs]:
            self._trees.pop(job).close()
        if not jobs or len(self._trees) < len(jobs):
            return None
        out: set[int] = set()
        for job, tree in list(self._trees.items()):
            pids = tree.pids()
            if pids is None:  # its cgroup is gone (the job ending): /proc is listed until it is seen again
                self._trees.pop(job).close()
                return None
            out |= pids
        return out

    def _keep(self, alive: set[int], forget: set[int]) -> None:
        """Drop what is kept of processes no longer looked at (``forget``: no longer cached by the attributor)."""
        self.attributor.forget(forget)
        self.stats.keep_only(alive)
        self.io.keep_only(alive)
        self._cpu = {p: v for p, v in self._cpu.items() if p in alive}
        self._io = {p: v for p, v in self._io.items() if p in alive}

    def _io_rates(self, pid: int, now: float) -> tuple[int | None, int | None]:
        """Bytes read and written per second through system calls since the process's previous tick
        (/proc/PID/io rchar, wchar: what a rank writing a checkpoint to a network file system does,
        which the block-device counters miss); None on its first tick or where the file is
        unreadable (another user's process to an agent that is not root)."""
        raw = self.io.read(pid)
        counts = parse_io(raw) if raw else None
        prev = self._io.pop(pid, None)
        if counts is None:
            return None, None
        self._io[pid] = (now, *counts)
        if prev is None or now <= prev[0]:
            return None, None
        dt = now - prev[0]
        return (max(0, round((counts[0] - prev[1]) / dt)), max(0, round((counts[1] - prev[2]) / dt)))

    def _allowed(self, pid: int) -> int | None:
        """How many CPUs the process may run on (None: gone, or not ours to ask)."""
        try:
            return min(len(os.sched_getaffinity(pid)), 32767)
        except OSError:
            return None

    def _cpu_percent(self, pid: int, now: float, ticks: int) -> float | None:
        prev = self._cpu.get(pid)
        self._cpu[pid] = (now, ticks)
        if prev is None or now <= prev[0]:
            return None
        return max(0.0, (ticks - prev[1]) / CLOCK_TICKS / (now - prev[0]) * 100.0)


CPU_TOLERANCE = 1.0
"""Percentage points of one core a process's CPU use may move and still count as unchanged: the
resolution of /proc's 100 Hz ticks over a one-second interval."""


def _numa_nodes(root: str = "/sys/devices/system/node") -> dict[int, int]:
    """CPU -> its NUMA node, from sysfs (empty where it cannot be read: CPUs then compare as they are)."""
    out: dict[int, int] = {}
    try:
        names = [n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()]
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(root, name, "cpulist")) as f:
                spans = f.read().strip()
        except OSError:
            continue
        for span in filter(None, spans.split(",")):
            lo, _, hi = span.partition("-")
            for cpu in range(int(lo), int(hi or lo) + 1):
                out[cpu] = int(name[4:])
    return out


def _io_kind(rate: int | None) -> int:
    """What holding compares of an I/O rate: unknown, none, or some (its amount is averaged over the run)."""
    return -1 if rate is None else int(rate > 0)


class ChangeOnly:
    """A node's process samples, sent when they change: a tick whose processes all hold the values
    of the last tick sent (the same processes, GPUs, jobs and ranks, GPU memory, SM and memory
    shares, RSS, kernel state and CPUs allowed; CPU use within ``CPU_TOLERANCE``; the CPU last
    run on within the same NUMA node; reading and writing, or not, as before) is held, not sent;
    the held run goes out as its last tick, whose ``held`` says how many ticks before it it stands
    for and whose I/O rates are the run's means (so every byte counts once, weighed by 1 + held),
    when the values change, at the end of its ``HOLD_BIN_S`` bin, once it holds ten ticks (``held``
    at most `HELD_MAX`, what the collector accepts: a sub-second interval), or at `flush` (the agent
    stopping). A changed tick is sent at once.

    The whole node is held or sent together, so the rows of one tick share its time (reports sum
    a rank's processes per tick), and the store weighs each row by ``1 + held``: roll-ups, rank bins
    and reports count every tick as the agent saw it, within the tolerance. A node whose processes
    do not change sends a row a process every ten seconds instead of every second (a rule reading
    the last 30 s sees each of them); one whose processes keep changing, every tick as before.
    """

    def __init__(self, numa: dict[int, int] | None = None) -> None:
        self.numa = _numa_nodes() if numa is None else numa
        self._sent: list[wire.ProcessSample] = []  # the last tick sent
        self._pending: list[wire.ProcessSample] = []  # the newest held tick
        self._held = 0  # ticks held in the run (the pending one included)
        self._io: list[tuple[int, int]] = []  # per pending row: the run's summed read and write rates
        self._bin: int | None = None  # the run's bin

    def _same(self, a: wire.ProcessSample, b: wire.ProcessSample) -> bool:
        if (a.pid, a.gpu_uuid, a.job_id, a.step, a.rank, a.local_rank, a.gpu_mem_mib, a.sm_util, a.mem_util,
                a.rss_mib, a.command, a.runnable, a.cpus_allowed, a.state) != (
                b.pid, b.gpu_uuid, b.job_id, b.step, b.rank, b.local_rank, b.gpu_mem_mib, b.sm_util, b.mem_util,
                b.rss_mib, b.command, b.runnable, b.cpus_allowed, b.state):
            return False
        if _io_kind(a.io_read_bps) != _io_kind(b.io_read_bps) or _io_kind(a.io_write_bps) != _io_kind(b.io_write_bps):
            return False
        if (a.cpu_percent is None) != (b.cpu_percent is None) or (
                a.cpu_percent is not None and b.cpu_percent is not None
                and abs(a.cpu_percent - b.cpu_percent) > CPU_TOLERANCE):
            return False
        return a.cpu == b.cpu or (a.cpu is not None and b.cpu is not None
                                  and self.numa.get(a.cpu, -1 - a.cpu) == self.numa.get(b.cpu, -2 - b.cpu))

    def flush(self) -> list[wire.ProcessSample]:
        """The held run, as its last tick standing for the ticks before it (none if nothing is held)."""
        out = [msgspec.structs.replace(s, held=self._held - 1, **self._io_means(s, io)) if self._held > 1 else s
               for s, io in zip(self._pending, self._io, strict=True)]
        self._pending, self._held, self._io = [], 0, []
        return out

    def _io_means(self, s: wire.ProcessSample, io: tuple[int, int]) -> dict[str, int | None]:
        """The held run's mean read and write rates (None where the run's last tick had none)."""
        return {"io_read_bps": None if s.io_read_bps is None else round(io[0] / self._held),
                "io_write_bps": None if s.io_write_bps is None else round(io[1] / self._held)}

    def __call__(self, samples: list[wire.ProcessSample], ts: datetime) -> list[wire.ProcessSample]:
        b = int(ts.timestamp() // HOLD_BIN_S)
        same = bool(samples) and len(samples) == len(self._sent) and all(
            map(self._same, samples, self._sent))
        out = self.flush() if self._held and (b != self._bin or not same or self._held > HELD_MAX) else []
        if same:
            self._io = [(r + (s.io_read_bps or 0), w + (s.io_write_bps or 0))
                        for s, (r, w) in zip(samples, self._io or [(0, 0)] * len(samples), strict=True)]
            self._pending, self._bin = samples, b
            self._held += 1
        else:
            out.extend(samples)
            self._sent = samples
        return out
