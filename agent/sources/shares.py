"""A GPU several jobs share (Slurm shards, MPS): one row per job, from that job's own processes.

NVML's utilization and GPM are the whole GPU's, whoever ran on it. A job's part is the sum of its
processes' SM and memory shares (`nvmlDeviceGetProcessUtilization`) and their memory; its row
carries the GPU's own fields (power, temperature, clocks, ...) and no GPM. The rules then judge each
job from its own work, never from its neighbour's; the whole GPU keeps its row without a job.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from jobpulse.agent.nvml import Gpu, Nvml, mib
from jobpulse.schema import wire
from jobpulse.schema.fields import PER_PARENT


class ShareSampler:
    def __init__(self, nvml: Nvml, jobs_of_gpu: Callable[[str], list[str]],
                 job_of_pid: Callable[[int], str | None]) -> None:
        self.nvml = nvml
        self.jobs_of_gpu = jobs_of_gpu
        self.job_of_pid = job_of_pid
        self._since: dict[str, int] = {}  # uuid -> time of the last read (us): process samples after it

    def rows(self, g: Gpu, whole: wire.GpuSample) -> list[wire.GpuSample]:
        """Each sharing job's part of the GPU at ``whole``'s time; none for a GPU of one job or none."""
        jobs = self.jobs_of_gpu(g.uuid)
        if len(jobs) < 2:
            return []
        now_us = int(whole.ts.timestamp() * 1e6)
        since, self._since[g.uuid] = self._since.get(g.uuid, int(time.time() * 1e6) - 1_000_000), now_us
        procs = self.nvml.compute_processes(g)
        util = self.nvml.process_utilization(g, since) if procs else {}
        known = "process_utilization" not in g.failed  # else the shares are unknown, not zero
        part = {job: [0, 0, 0] for job in jobs}  # SM %, memory %, memory bytes
        for pid, mem in procs:
            p = part.get(self.job_of_pid(pid) or "")
            if p is not None:
                sm, mu = util.get(pid, (0, 0))  # no sample since the last read: it did not run
                p[0], p[1], p[2] = p[0] + sm, p[1] + mu, p[2] + (mem or 0)
        inherited = {name: getattr(whole, name) for name in PER_PARENT}
        return [wire.GpuSample(ts=whole.ts, gpu_uuid=g.uuid, gpu_index=g.index, job_id=job,
                               sm_util=min(100, sm) if known else None, mem_util=min(100, mu) if known else None,
                               fb_used_mib=mib(mem), fb_total_mib=whole.fb_total_mib, **inherited)
                for job, (sm, mu, mem) in part.items()]
