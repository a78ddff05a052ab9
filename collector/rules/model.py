"""The statistics rules read (per GPU, per process, per job) and the hits they return."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class GpuStats:
    """One GPU of one job over the look-back window, from the 10 s roll-ups."""

    cluster: str
    job_id: str
    partition: str | None
    node: str
    gpu_uuid: str
    gpu_index: int
    model: str | None
    samples: int
    first_ts: datetime
    last_ts: datetime
    job_start: datetime | None
    last_util: float | None
    last_busy: datetime | None
    util_mean: float | None
    gpm_samples: int
    sm_active_mean: float | None
    tensor_max: float | None
    peak_mem_share: float | None
    peak_mem_mib: int | None
    last_mem_mib: int | None
    hw_throttle_share: float
    idle_share: float = 0.0  # samples at <= 2 % activity
    busy_share: float = 0.0  # samples at >= 50 % activity
    xids: list[int] = field(default_factory=list)
    pcie_below_max_share: float | None = None  # of samples under load
    pcie_link: str | None = None  # e.g. "3x8/4x16": current / max gen x width

    @property
    def activity(self) -> tuple[float | None, str]:
        """SM activity when GPM measured it (the truth), else the duty-cycle utilization."""
        if self.gpm_samples and self.sm_active_mean is not None:
            return self.sm_active_mean, "SM activity (GPM)"
        return self.util_mean, "GPU utilization (duty cycle)"

    @property
    def where(self) -> str:
        return f"{self.node}/GPU{self.gpu_index}"

    @property
    def key(self) -> str:
        return f"{self.node}/{self.gpu_uuid}"

    def covers(self, minutes: float) -> bool:
        """Samples span the window: means are not judged during a job's first minutes (warm-up)."""
        return (self.last_ts - self.first_ts).total_seconds() >= minutes * 60 * 0.95


@dataclass(frozen=True)
class ProcStats:
    """One process of the job over the window (from process_samples)."""

    node: str
    pid: int
    rank: int | None
    gpu_uuid: str | None
    command: str | None
    cpu_mean: float | None
    cpus: dict[int, int]  # CPU it last ran on -> samples


@dataclass
class JobView:
    """Everything the rules know about one job in one cycle."""

    gpus: list[GpuStats]
    procs: list[ProcStats] = field(default_factory=list)
    gpus_requested: int | None = None
    gpus_ever_used: int | None = None  # GPUs busy at any time since the job started
    links: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # node -> uuid -> peer -> NV#/SYS
    local_cpus: dict[str, str] = field(default_factory=dict)  # node/uuid -> cpulist near the GPU

    def ranks_on(self, g: GpuStats) -> list[int]:
        return sorted({p.rank for p in self.procs if p.node == g.node and p.gpu_uuid == g.gpu_uuid
                       and p.rank is not None})

    def busiest(self, node: str) -> ProcStats | None:
        procs = [p for p in self.procs if p.node == node and p.cpu_mean is not None]
        return max(procs, key=lambda p: p.cpu_mean or 0.0, default=None)


@dataclass(frozen=True)
class Finding:
    """What one rule found: where, since when, the evidence and the advice to the researcher."""

    scope_key: str
    started_at: datetime
    evidence: dict[str, Any]
    advice: str


Settings = dict[str, Any]
GpuCheck = Callable[[GpuStats, Settings, JobView], "Finding | None"]
JobCheck = Callable[[JobView, Settings], "list[Finding]"]


@dataclass(frozen=True)
class Rule:
    """A rule's declaration: what it judges and how badly, the statistics and thresholds it reads,
    and its check (per GPU, or over the whole job). Ids, severities and categories live here only."""

    id: str
    scope: str  # gpu, job, node, rank: what scope_key names
    category: str  # code (the researcher's to fix) or hardware (the admins')
    severity: str  # info, warning, critical
    summary: str
    reads: tuple[str, ...]  # GpuStats / JobView attributes
    thresholds: tuple[str, ...]  # keys of rules_default.toml
    gpu_check: GpuCheck | None = None
    job_check: JobCheck | None = None

    def hit(self, f: Finding) -> Hit:
        return Hit(self.id, self.severity, self.category, self.scope, f.scope_key, f.started_at, f.evidence,
                   f.advice)


def rounded(x: float | None, nd: int = 1) -> float | None:
    """A number for evidence: rounded, None kept."""
    return None if x is None else round(float(x), nd)


@dataclass(frozen=True)
class Hit:
    """A rule's finding as it is stored in job_flags."""

    rule_id: str
    severity: str  # info, warning, critical
    category: str  # code, hardware
    scope: str  # job, node, gpu, rank
    scope_key: str
    started_at: datetime
    evidence: dict[str, Any]
    advice: str
