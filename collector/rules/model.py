"""The statistics rules read (per GPU, per process, per job) and the hits they return."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar, overload

from jobpulse.collector.store.state.flags import Hit

T = TypeVar("T")


class cached(Generic[T]):
    """`functools.cached_property` without the lock Python 3.11's takes on every first read (a cycle
    reads these of tens of thousands of GPUs): computed once, then found in the instance's dict."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self._compute = compute
        self._name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> cached[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> T | cached[T]:
        if obj is None:
            return self
        value = obj.__dict__[self._name] = self._compute(obj)
        return value


@dataclass(frozen=True)
class Block:
    """A block of one GPU's samples (a minute by default: ``evidence_block_seconds``), from its 10 s
    roll-ups: the unit of evidence for means."""

    start: datetime
    n: int  # samples
    idle: int  # samples at <= IDLE_PERCENT activity
    busy: int  # samples at >= BUSY_PERCENT activity
    act: float | None  # mean activity: GPM SM activity where measured, else duty cycle
    sm_active: float | None  # GPM mean (None without GPM)
    tensor_max: float | None
    fb_max: int | None  # peak framebuffer used, MiB
    throttled: int = 0  # samples with a hardware slowdown (thermal, power brake)
    power: float | None = None  # mean power draw, W (None: not measured)
    duty: float | None = None  # mean duty-cycle utilization (a kernel resident), also where GPM measures SMs
    traffic: float | None = None  # mean PCIe + NVLink traffic, KB/s (None: not measured)
    power_limit: float | None = None  # the enforced power limit, W


@dataclass(frozen=True)
class Ecc:
    """ECC and row-remapping over the window: counter increases and the remap flags."""

    dbe_increase: int = 0
    sbe_increase: int = 0
    remap_pending: bool = False
    remap_failure: bool = False


@dataclass(frozen=True)
class MigSlice:
    """A MIG instance: the GPU it is a slice of, its profile (e.g. 1g.10gb), and its name for people
    (the database's ``jobpulse.gpu_name``: node/GPU index and the slice)."""

    parent_uuid: str
    profile: str | None
    name: str


@dataclass(frozen=True)
class GpuStats:
    """One GPU of one job over the look-back window, block by block, and its faults since the job
    started."""

    cluster: str
    job_id: str
    partition: str | None
    node: str
    gpu_uuid: str
    gpu_index: int
    model: str | None
    first_ts: datetime  # first sample in the look-back
    last_ts: datetime  # newest sample
    job_start: datetime | None
    blocks: tuple[Block, ...] = ()
    fb_total_mib: int | None = None
    last_mem_mib: int | None = None
    pcie_below_max_share: float | None = None  # of samples under load
    pcie_loaded_samples: int = 0
    pcie_link: str | None = None  # e.g. "3x8/4x16": current / max gen x width
    ecc: Ecc = Ecc()
    xids: dict[int, datetime] = field(default_factory=dict)  # code -> first seen since the job started
    lost_at: datetime | None = None  # the agent lost the GPU (NVML stopped answering)
    ever_busy: bool | None = None  # a busy sample since the job started (None: not read)
    idle_before: datetime | None = None  # start of an idle stretch older than the look-back
    reporting: bool = True  # sampled in the last minutes: its usage can be judged
    mig: MigSlice | None = None  # a MIG instance: what the job was given is this slice
    # What rules derived from this GPU's blocks under given thresholds (`evidence.per_gpu`); empty
    # again in a copy (`dataclasses.replace`). A field, not a cached_property: Python 3.11's takes a
    # lock on every first read, and a cycle asks it of thousands of GPUs.
    memo: dict[str, tuple[Settings, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def samples(self) -> int:
        return sum(m.n for m in self.blocks)

    @property
    def uses_gpm(self) -> bool:
        return any(m.sm_active is not None for m in self.blocks)

    @property
    def metric(self) -> str:
        return "SM activity (GPM)" if self.uses_gpm else "GPU utilization (duty cycle)"

    @property
    def where(self) -> str:
        return self.mig.name if self.mig else f"{self.node}/GPU{self.gpu_index}"

    @property
    def key(self) -> str:
        return f"{self.node}/{self.gpu_uuid}"

    @property
    def start(self) -> datetime:
        return self.job_start or self.first_ts

    @cached
    def peak_mem_mib(self) -> int | None:
        return max((m.fb_max for m in self.blocks if m.fb_max is not None), default=None)

    @cached
    def full_blocks(self) -> tuple[Block, ...]:
        """Blocks with at least half the samples of the fullest one: a partial block at either end
        of the look-back is no evidence. Cached: every rule on the GPU asks."""
        most = max((m.n for m in self.blocks), default=0)
        return tuple(m for m in self.blocks if m.n * 2 >= most)


@dataclass(frozen=True)
class ProcStats:
    """One process of the job: the rank it belongs to, the GPU it drives (None for a data-loader
    worker or any other host process), and its CPU use minute by minute (percent of one core)."""

    node: str
    pid: int
    rank: int | None
    gpu_uuid: str | None
    command: str | None
    cpu_by_minute: dict[datetime, float] = field(default_factory=dict)  # from the 60 s roll-ups
    cpus: dict[int, int] = field(default_factory=dict)  # CPU it last ran on -> samples (recent)
    runnable_by_minute: dict[datetime, float] = field(default_factory=dict)  # % of samples runnable
    allowed_by_minute: dict[datetime, int] = field(default_factory=dict)  # CPUs it may run on (affinity)

    def cpu_over(self, minutes: frozenset[datetime]) -> float | None:
        """Mean CPU over these minutes (`minutes_of` a stretch; None if it was not seen then)."""
        return _mean_over(self.cpu_by_minute, minutes)

    def allowed_over(self, minutes: frozenset[datetime]) -> int | None:
        """The CPUs the process could use over those minutes (None: not measured)."""
        seen = [self.allowed_by_minute[m] for m in minutes if m in self.allowed_by_minute]
        return max(seen) if seen else None

    def demand_over(self, minutes: frozenset[datetime]) -> float | None:
        """The CPU the process wanted over those minutes, percent of one core: what it used, or, where
        other processes on its CPUs kept it waiting, the share of samples it was runnable."""
        used, wanted = self.cpu_over(minutes), _mean_over(self.runnable_by_minute, minutes)
        return used if wanted is None else max(used or 0.0, wanted)


def minutes_of(starts: list[datetime]) -> frozenset[datetime]:
    """The minutes (of the 60 s process roll-ups) that hold these block starts."""
    return frozenset(s.replace(second=0, microsecond=0) for s in starts)


def _mean_over(by_minute: dict[datetime, float], minutes: frozenset[datetime]) -> float | None:
    seen = [by_minute[m] for m in minutes if m in by_minute]
    return sum(seen) / len(seen) if seen else None


@dataclass
class JobView:
    """Everything the rules know about one job in one cycle."""

    gpus: list[GpuStats]
    procs: list[ProcStats] = field(default_factory=list)
    links: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # node -> uuid -> peer -> NV#/SYS
    local_cpus: dict[str, str] = field(default_factory=dict)  # node/uuid -> cpulist near the GPU
    ended_at: datetime | None = None  # the job's end, once it has ended (by the cycle's clock)
    rows: dict[str, list[Any]] = field(default_factory=dict)
    """What the families' per-job reads found (`Read`: query name -> the store's rows), for the jobs
    that asked."""
    memo: dict[str, tuple[Settings, Any]] = field(default_factory=dict, repr=False, compare=False)
    """What a family derived from the whole view under given thresholds (`evidence.per_job`), once
    every read has landed: each family is judged once a job and cycle."""

    def rows_of(self, query: str) -> list[Any]:
        """The rows a per-job read found for this job (none: not asked, or nothing stored)."""
        return self.rows.get(query, [])

    def drivers(self, g: GpuStats) -> list[ProcStats]:
        """The processes that drive a GPU (its ranks' main processes)."""
        return [p for p in self.procs if p.node == g.node and p.gpu_uuid == g.gpu_uuid]

    def ranks_on(self, g: GpuStats) -> list[int]:
        """The ranks driving the GPU now, else those that drove it within the look-back (read for a
        hung job whose broken rank exited)."""
        return sorted({p.rank for p in self.drivers(g) if p.rank is not None}) or next(
            (list(r.ranks) for r in self.rows_of("gpu_ranks") if f"{r.node}/{r.gpu_uuid}" == g.key), [])

    def workers_of(self, main: ProcStats) -> list[ProcStats]:
        """A rank's other processes on its node (data-loader workers): same rank, no GPU."""
        if main.rank is None:
            return []
        return [p for p in self.procs if p.node == main.node and p.rank == main.rank and p.gpu_uuid is None]


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
SettingsOf = Callable[[GpuStats], Settings]
"""A GPU's merged thresholds (its partition's and model's): `Thresholds.for_gpu`."""


@dataclass(frozen=True)
class Read:
    """What a family needs read beyond the window, and of which jobs: ``asks`` looks at a job's view
    (as read so far) and yields what of it to read, nothing for most jobs. ``query`` names a per-job
    read of the store (`rule_reads.JOB_READS`: its SQL and row type; the rows land in
    `JobView.rows`), or a reader of its own (`inputs.READERS`: ``history``, ``processes``). Families
    declare theirs in ``READS``; the engine reads them in that order, each once a cycle, and never
    looks inside a family."""

    query: str
    asks: Callable[[JobView, SettingsOf], Iterable[Any]]


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
