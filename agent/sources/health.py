"""Health events: XID and ECC events from an NVML event set (with their time), and lost GPUs."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import structlog

from jobpulse.agent.nvml import HEALTH_EVENTS, Gpu, Nvml, NVMLError
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent.sources.health")


def lost_event(g: Gpu, job_id: str | None) -> wire.HealthEvent:
    return wire.HealthEvent(ts=datetime.now(UTC), kind="gpu_lost", gpu_uuid=g.uuid, job_id=job_id,
                            message=f"GPU {g.index} ({g.pci_bus_id}) stopped answering NVML (GPU is lost)")


class HealthWatcher(threading.Thread):
    """Waits on the event set in its own thread; each event goes to ``emit`` as it happens."""

    def __init__(self, nvml: Nvml, emit: Callable[[wire.HealthEvent], None],
                 jobs_of_gpu: Callable[[str], list[str]]) -> None:
        super().__init__(name="health-events", daemon=True)
        self.nvml = nvml
        self.emit = emit
        self.jobs_of_gpu = jobs_of_gpu
        self.stopping = threading.Event()
        self.event_set = nvml.event_set(sum(HEALTH_EVENTS))

    def run(self) -> None:
        if self.event_set is None:
            return
        while not self.stopping.is_set():
            try:
                got = self.nvml.wait_event(self.event_set, 500)
            except NVMLError as exc:
                log.warning("event wait failed", reason=str(exc))
                self.stopping.wait(5)
                continue
            if got is None:
                continue
            gpus, etype, data = got
            kind = next((k for bit, k in HEALTH_EVENTS.items() if etype & bit), f"event_{etype:x}")
            ts = datetime.now(UTC)
            # One event per GPU and job it concerns: a fault of a GPU in MIG mode is each of its slices',
            # and of a shared GPU each sharing job's.
            concerned: Sequence[Gpu | None] = gpus or [None]
            for gpu in concerned:
                uuid = gpu.uuid if gpu else None
                parent = {"parent_uuid": gpu.parent.uuid} if gpu and gpu.parent else {}
                jobs: Sequence[str | None] = (self.jobs_of_gpu(uuid) if uuid else []) or [None]
                for job in jobs:
                    self.emit(wire.HealthEvent(
                        ts=ts, kind=kind, gpu_uuid=uuid, job_id=job, code=data if kind == "xid" else None,
                        message=f"XID {data}" if kind == "xid" else f"{kind} event",
                        attrs={"event_type": etype, **parent}))
                log.warning("GPU health event", kind=kind, gpu=uuid, code=data)
