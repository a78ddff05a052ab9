"""Sample processes: every process on a GPU (NVML) and every process of a served job (/proc),
with GPU memory, SM share, CPU use and RSS, attributed to job, step, rank and PID.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from jobpulse.agent.attribution import Attributor
from jobpulse.agent.nvml import Nvml
from jobpulse.agent.procfs import CLOCK_TICKS, ProcFs
from jobpulse.schema import wire

MIB = 1024 * 1024


class ProcessSampler:
    def __init__(self, nvml: Nvml, proc: ProcFs, attributor: Attributor, job_ids: Callable[[], set[str]]) -> None:
        self.nvml = nvml
        self.proc = proc
        self.attributor = attributor
        self.job_ids = job_ids
        self._cpu: dict[int, tuple[float, int]] = {}  # pid -> (monotonic time, cpu ticks)
        self._last_us = int(time.time() * 1e6)

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
                on_gpu.setdefault(pid, []).append((g.uuid, None if mem is None else mem // MIB, sm, mu))
        # Host side: every live process of a job we serve, plus every GPU process.
        alive = set(self.proc.pids())
        self.attributor.forget(alive)
        self._cpu = {p: v for p, v in self._cpu.items() if p in alive}
        jobs = self.job_ids()
        out = []
        now = time.monotonic()
        for pid in sorted(alive):
            owner = self.attributor.owner(pid)
            if pid not in on_gpu and (owner is None or owner.job_id not in jobs):
                continue
            stat = self.proc.stat(pid)
            if stat is None:
                continue
            cpu = self._cpu_percent(pid, now, stat.cpu_ticks)
            base = dict(ts=ts, pid=pid, job_id=owner.job_id if owner else None, step=owner.step if owner else None,
                        rank=owner.rank if owner else None, local_rank=owner.local_rank if owner else None,
                        cpu_percent=cpu, rss_mib=stat.rss_bytes // MIB, command=stat.comm[:256], cpu=stat.processor,
                        runnable=stat.state == "R")
            for uuid, mem, sm, mu in on_gpu.get(pid, [(None, None, None, None)]):
                out.append(wire.ProcessSample(gpu_uuid=uuid, gpu_mem_mib=mem, sm_util=sm, mem_util=mu, **base))
        return out

    def _cpu_percent(self, pid: int, now: float, ticks: int) -> float | None:
        prev = self._cpu.get(pid)
        self._cpu[pid] = (now, ticks)
        if prev is None or now <= prev[0]:
            return None
        return max(0.0, (ticks - prev[1]) / CLOCK_TICKS / (now - prev[0]) * 100.0)
