"""The jobs this node serves: registered by the prolog, unregistered by the epilog.

Slurm names a job's GPUs by its own indices (``SLURM_JOB_GPUS``), which follow the
``/dev/nvidiaN`` minor numbers of gres.conf, not NVML's enumeration order: an index is
mapped through the device minor number (NVML index only when the minor is unreadable).
UUIDs and PCI bus ids are accepted as they are; a MIG instance by its `MIG-` UUID, in the form
drivers before R470 gave `CUDA_VISIBLE_DEVICES`: `MIG-<GPU UUID>/<GPU instance>/<compute instance>`,
or as the driver's capability table names it (`gpu<minor>/gi<GI>/ci<CI>`, what the prolog reads
from gres.conf's MIG lines; `gpu<minor>/gi<GI>` is all compute instances of that GPU instance).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import structlog

from jobpulse.agent.nvml import Gpu
from jobpulse.schema import wire
from jobpulse.schema.semantics import check_interval

log = structlog.get_logger("jobpulse.agent.control.jobs")


class RegistrationError(ValueError):
    """A registration the agent cannot accept (names the bad field)."""


@dataclass
class Job:
    record: wire.JobRecord
    gpu_uuids: set[str] = field(default_factory=set)
    interval_s: float | None = None  # the job's own sampling interval (#SBATCH hook)
    shared: bool = False  # shares its GPUs with other jobs (Slurm shards, MPS)


ENDED_KEPT = 4096  # ended jobs remembered, to refuse their stale registrations
_CAP = re.compile(r"gpu(\d+)/gi(\d+)(?:/ci(\d+))?")


def resolve_gpus(specs: list[str], gpus: list[Gpu]) -> list[Gpu]:
    """Map Slurm GPU indices, UUIDs or PCI bus ids to this node's GPUs."""
    out = []
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        if cap := _CAP.fullmatch(spec):
            minor, gi, ci = (int(x) if x is not None else None for x in cap.groups())
            slices = [g for g in gpus if g.parent and g.parent.minor == minor and g.gi == gi and ci in (None, g.ci)]
            if not slices:
                raise RegistrationError(f"gpus: no MIG instance {spec!r} on this node")
            out.extend(slices)
            continue
        if spec.isdigit():
            i = int(spec)
            match = next((g for g in gpus if g.minor == i), None)
            if match is None and all(g.minor is None for g in gpus):
                match = next((g for g in gpus if g.index == i), None)
        elif ":" in spec:
            match = next((g for g in gpus if g.pci_bus_id and g.pci_bus_id.lower().endswith(spec.lower())), None)
        elif spec.startswith("MIG-") and spec.count("/") == 2:
            parent, gi_text, ci_text = spec.removeprefix("MIG-").split("/")
            match = next((g for g in gpus if g.parent and g.parent.uuid == parent and str(g.gi) == gi_text
                          and str(g.ci) == ci_text), None)
        else:
            match = next((g for g in gpus if g.uuid == spec), None)
        if match is None:
            raise RegistrationError(f"gpus: no GPU {spec!r} on this node")
        out.append(match)
    return out


class _Saved(msgspec.Struct):
    record: wire.JobRecord
    interval_s: float | None = None
    shared: bool = False


class JobRegistry:
    """Thread-safe: the control socket writes, the samplers read. Kept in a state file so a
    restarted agent still knows the jobs the prolog registered."""

    def __init__(self, gpus: list[Gpu], state_file: Path | None = None) -> None:
        self._gpus = gpus
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._gpu_jobs: dict[str, list[str]] = {}  # several: a GPU shared (Slurm shards, MPS)
        self._ended: dict[str, float] = {}  # job -> when it was unregistered (epoch), the latest ENDED_KEPT
        self._state = state_file
        self._save_failed = False
        if state_file and state_file.exists():
            try:
                saved = msgspec.json.decode(state_file.read_bytes(), type=list[_Saved])
            except (msgspec.MsgspecError, OSError):
                saved = []
            for item in saved:
                self._add(item.record, item.interval_s, item.shared)

    def _add(self, record: wire.JobRecord, interval_s: float | None, shared: bool) -> None:
        """A job takes its GPUs over (a holder whose epilog never came is gone), unless it shares
        them: then it joins the jobs sharing each."""
        self._drop(record.job_id)  # registered again: its GPUs are the new ones
        self._jobs[record.job_id] = Job(record, {g.gpu_uuid for g in record.gpus}, interval_s, shared)
        for g in record.gpus:
            holders = [j for j in self._gpu_jobs.get(g.gpu_uuid, []) if shared and self._jobs[j].shared]
            self._gpu_jobs[g.gpu_uuid] = [*holders, record.job_id]

    def _drop(self, job_id: str) -> Job | None:
        job = self._jobs.pop(job_id, None)
        for uuid in job.gpu_uuids if job else ():
            holders = [j for j in self._gpu_jobs.get(uuid, []) if j != job_id]
            if holders:
                self._gpu_jobs[uuid] = holders
            else:
                self._gpu_jobs.pop(uuid, None)
        return job

    def _save(self) -> None:
        """Best effort: a disk that refuses the state file (full, read-only, its folder removed) costs a
        restarted agent its memory of the jobs, never a registration or a job's end."""
        if not self._state:
            return
        tmp = self._state.with_suffix(".tmp")
        try:
            tmp.write_bytes(msgspec.json.encode([_Saved(j.record, j.interval_s, j.shared) for j in self._jobs.values()]))
            os.replace(tmp, self._state)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if not self._save_failed:
                log.warning("job list not saved (a restarted agent would not know these jobs); kept in memory",
                            file=str(self._state), error=str(exc), jobs=len(self._jobs))
            self._save_failed = True
            return
        if self._save_failed:
            log.info("job list saved again", file=str(self._state))
        self._save_failed = False

    def register(self, fields: dict[str, Any], sent: float | None = None) -> wire.JobRecord:
        """``sent``: when the hook made the request; one made before the job's end is stale."""
        specs = fields.pop("gpus", []) or []
        interval = fields.pop("interval_s", None)
        shared = fields.pop("shared", False) is True
        share = fields.pop("share", None)
        if interval is not None:
            try:
                check_interval(float(interval) if isinstance(interval, (int, float)) else float("nan"))
            except ValueError as exc:
                raise RegistrationError(f"interval_s: {exc}") from None
        if isinstance(specs, str):
            specs = specs.split(",")
        fields.setdefault("start_time", datetime.now(UTC).isoformat())
        fields, _ = wire.clipped(wire.JobRecord, fields)  # a long name never costs the job its monitoring
        # No state while it runs (end_time NULL says so): the epilog or slurmctld names how it ended.
        try:
            base = msgspec.convert(fields, wire.JobRecord, strict=False)
        except msgspec.ValidationError as exc:
            raise RegistrationError(str(exc)) from None
        gpus = resolve_gpus([str(s) for s in specs], self._gpus)
        try:
            held = [msgspec.convert({"gpu_uuid": g.uuid, "gpu_index": g.index, "pci_bus_id": g.pci_bus_id,
                                     "share": share}, wire.JobGpu, strict=False) for g in gpus]
        except msgspec.ValidationError as exc:
            raise RegistrationError(f"share: {exc}") from None
        record = msgspec.structs.replace(base, gpus=held)
        with self._lock:  # checked where it is added: an unregistration in between cannot slip past it
            ended = self._ended.get(record.job_id)
            if sent is not None and ended is not None and sent < ended:
                raise RegistrationError(f"job {record.job_id} ended after this registration was sent: stale")
            self._add(record, interval, shared)
            self._save()
        return record

    def unregister(self, job_id: str, state: str | None, exit_code: int | None) -> wire.JobRecord:
        with self._lock:
            self._drop(job_id)
            self._save()
            self._ended[job_id] = time.time()
            while len(self._ended) > ENDED_KEPT:
                del self._ended[next(iter(self._ended))]
        try:
            return msgspec.convert({"job_id": job_id, "end_time": datetime.now(UTC).isoformat(),
                                    "state": state, "exit_code": exit_code}, wire.JobRecord)
        except msgspec.ValidationError as exc:
            raise RegistrationError(str(exc)) from None

    def tags_of(self, job_id: str) -> dict[str, str]:
        """The job's tags from its comment (``capture=off``, ...); none for a job not registered."""
        with self._lock:
            job = self._jobs.get(job_id)
            return dict(job.record.tags) if job else {}

    def interval_of_gpu(self, uuid: str) -> float | None:
        """The sampling interval the GPU's jobs asked for, if any (the shortest)."""
        asked = [j.interval_s for j in map(self._jobs.get, self.jobs_of_gpu(uuid)) if j and j.interval_s]
        return min(asked) if asked else None

    def intervals(self) -> list[float]:
        with self._lock:
            return [j.interval_s for j in self._jobs.values() if j.interval_s]

    def job_of_gpu(self, uuid: str) -> str | None:
        """The job holding the GPU; None when none does, or several share it (no one job's samples)."""
        holders = self._gpu_jobs.get(uuid, [])
        return holders[0] if len(holders) == 1 else None

    def jobs_of_gpu(self, uuid: str) -> list[str]:
        """Every job holding the GPU: one, or several sharing it (Slurm shards, MPS)."""
        return list(self._gpu_jobs.get(uuid, ()))

    def nodes_of(self, job_id: str) -> list[str] | None:
        """The job's node list as its registration gave it (None: not registered, or none given)."""
        with self._lock:
            job = self._jobs.get(job_id)
            return job.record.nodes if job else None

    def uid_of(self, job_id: str) -> int | None:
        job = self._jobs.get(job_id)
        return job.record.uid if job else None

    def job_ids(self) -> set[str]:
        with self._lock:
            return set(self._jobs)

    def records(self) -> list[wire.JobRecord]:
        with self._lock:
            return [j.record for j in self._jobs.values()]
