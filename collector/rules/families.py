"""Evaluate: rules that flag wasted GPUs and sick hardware while jobs run.

Each rule reads per-GPU statistics over a sliding window (one query for all running jobs, see
`rule_engine.py`) and returns hits with scope, evidence and advice. Idle GPUs are judged by the
length of the current idle *run*, not a mean, so brief use cannot hide long idling. Thresholds
come from a TOML file (`rules_default.toml` documents each default and its reason), overridable
per partition and per GPU model.
"""

from __future__ import annotations

import statistics
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from jobpulse.schema.semantics import IDLE_PERCENT


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
class Hit:
    rule_id: str
    severity: str  # info, warning, critical
    category: str  # code, hardware
    scope: str  # job, node, gpu, rank
    scope_key: str
    started_at: datetime
    evidence: dict[str, Any]
    advice: str


class Thresholds:
    def __init__(self, path: Path | None = None) -> None:
        text = path.read_text() if path else resources.files("jobpulse.collector.rules").joinpath(
            "rules_default.toml").read_text()
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"rules file {path}: {exc}") from None
        base = dict(tomllib.loads(resources.files("jobpulse.collector.rules").joinpath("rules_default.toml").read_text())
                    ["defaults"])
        unknown = set(data.get("defaults", {})) - set(base)
        if unknown:
            raise ValueError(f"rules file {path}: unknown settings {', '.join(sorted(unknown))}")
        self.defaults = {**base, **data.get("defaults", {})}
        self.partitions: dict[str, dict[str, Any]] = data.get("partition", {})
        self.models: dict[str, dict[str, Any]] = data.get("model", {})

    def for_gpu(self, partition: str | None, model: str | None) -> dict[str, Any]:
        return {**self.defaults, **self.partitions.get(partition or "", {}), **self.models.get(model or "", {})}

    @property
    def lookback(self) -> timedelta:
        minutes = [self.defaults["window_minutes"], self.defaults["idle_minutes"]]
        for table in (*self.partitions.values(), *self.models.values()):
            minutes += [table.get("window_minutes", 0), table.get("idle_minutes", 0)]
        # + three 10 s roll-up buckets: a GPU idle since before the window still shows a run
        # longer than idle_minutes whatever the bucket boundaries (no flapping flag).
        return timedelta(minutes=max(minutes), seconds=30)


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(float(x), nd)


def gpu_rules(s: GpuStats, t: dict[str, Any], job: JobView) -> list[Hit]:
    hits = []
    key = s.key
    value, metric = s.activity
    covered = s.samples >= t["min_samples"] and s.covers(t["window_minutes"])
    # Idle run: the latest sample idle, and no busy sample for idle_minutes (run length, not a mean).
    idle_now = s.last_util is not None and s.last_util <= IDLE_PERCENT
    since = s.last_busy or s.first_ts
    idle = (s.last_ts - since).total_seconds() / 60
    if idle_now and idle >= t["idle_minutes"]:
        held = f" while holding {s.last_mem_mib} MiB of memory" if s.last_mem_mib else ""
        hits.append(Hit("idle_gpu", "warning", "code", "gpu", key, since,
                        {"idle_minutes": _r(idle), "idle_since": since.isoformat(), "memory_mib": s.last_mem_mib,
                         "threshold_minutes": t["idle_minutes"], "metric": metric, "ranks": job.ranks_on(s)},
                        f"{s.where} has been idle for {idle:.0f} min{held}. If the job does not need it, "
                        f"request fewer GPUs (--gres=gpu:N); if it should, check that every rank picks its own "
                        f"GPU (LOCAL_RANK / CUDA_VISIBLE_DEVICES) and that no rank waits on another."))
    elif idle_now and s.last_busy is None:
        pass  # idle all window long but not yet for idle_minutes: the idle rule's to judge, later
    elif covered and s.idle_share >= t["stall_share"] and s.busy_share >= t["stall_share"]:
        hits.append(Hit("input_bound", "warning", "code", "gpu", key, s.first_ts,
                        {"pattern": "stalls", "idle_share": _r(s.idle_share, 3), "busy_share": _r(s.busy_share, 3),
                         "mean_percent": _r(value), "metric": metric, "ranks": job.ranks_on(s)},
                        f"{s.where} keeps dropping to idle between bursts of work ({s.idle_share:.0%} of samples "
                        f"idle, {s.busy_share:.0%} busy): the GPU waits for input. Use more data-loader workers "
                        f"(num_workers), pin_memory=True and prefetching, or move preprocessing to the GPU."))
    elif covered and value is not None and value < t["low_percent"]:
        cpu = job.busiest(s.node)
        if cpu is not None and (cpu.cpu_mean or 0) >= t["cpu_saturated_percent"]:
            hits.append(Hit("input_bound", "warning", "code", "gpu", key, s.first_ts,
                            {"pattern": "cpu_saturated", "mean_percent": _r(value), "metric": metric,
                             "cpu_percent": _r(cpu.cpu_mean), "pid": cpu.pid, "rank": cpu.rank,
                             "command": cpu.command},
                            f"{s.where} averaged {value:.0f}% {metric} while process {cpu.pid} ({cpu.command}"
                            f"{'' if cpu.rank is None else f', rank {cpu.rank}'}) kept a CPU at "
                            f"{cpu.cpu_mean:.0f}%: the GPU waits for the CPU. Load data in worker processes "
                            f"(DataLoader num_workers > 0, pin_memory=True) and ask for enough CPUs "
                            f"(--cpus-per-task)."))
        else:
            hits.append(Hit("low_utilization", "warning", "code", "gpu", key, s.first_ts,
                            {"mean_percent": _r(value), "metric": metric, "window_minutes": t["window_minutes"],
                             "threshold_percent": t["low_percent"]},
                            f"{s.where} averaged {value:.0f}% {metric} over the last {t['window_minutes']:.0f} min. "
                            f"Larger batches, fewer data-loader stalls (more workers, pinned memory, prefetching), "
                            f"or fewer GPUs would use them better."))
    if s.samples >= t["min_samples"] and s.hw_throttle_share >= t["hw_throttle_share"]:
        hits.append(Hit("hw_throttling", "warning", "hardware", "gpu", key, s.first_ts,
                        {"share_of_samples": _r(s.hw_throttle_share, 3), "threshold": t["hw_throttle_share"]},
                        f"{s.where} slowed itself down in hardware (thermal or power brake) in "
                        f"{s.hw_throttle_share:.0%} of samples: the node's fault, not the code's — admins: "
                        f"check cooling and power on {s.node}."))
    if s.pcie_below_max_share is not None and s.pcie_below_max_share >= t["pcie_below_max_share"]:
        hits.append(Hit("pcie_downgraded", "warning", "hardware", "gpu", key, s.first_ts,
                        {"share_of_busy_samples": _r(s.pcie_below_max_share, 3), "link": s.pcie_link},
                        f"{s.where}'s PCIe link runs below its maximum under load ({s.pcie_link}, current/max "
                        f"gen x width): host-device copies are slower. Admins: reseat or replace the riser, check "
                        f"BIOS link settings on {s.node} (`jobpulse-agent validate` shows it)."))
    if s.xids:
        hits.append(Hit("xid_error", "critical", "hardware", "gpu", key, s.first_ts,
                        {"xids": sorted(set(s.xids)), "count": len(s.xids)},
                        f"{s.where} reported XID {', '.join(map(str, sorted(set(s.xids))))}: a driver or hardware "
                        f"fault on {s.node}. Admins: drain and inspect the node; users: resubmit excluding it "
                        f"(--exclude={s.node})."))
    if (s.gpm_samples and s.sm_active_mean is not None and s.sm_active_mean >= t["tensor_busy_percent"]
            and (s.tensor_max or 0) < 1.0):
        hits.append(Hit("no_tensor_cores", "info", "code", "gpu", key, s.first_ts,
                        {"sm_active_percent": _r(s.sm_active_mean), "tensor_active_max_percent": _r(s.tensor_max)},
                        f"{s.where} is busy ({s.sm_active_mean:.0f}% SM activity) without using tensor cores: "
                        f"enable mixed precision (torch.autocast / bf16) or TF32."))
    return hits


def job_rules(job: JobView, thresholds: Thresholds) -> list[Hit]:
    """Rules that compare a job's GPUs and ranks with each other or look at the job as a whole."""
    gpus = job.gpus
    first = gpus[0]
    t = thresholds.for_gpu(first.partition, first.model)
    hits = _imbalance(job, t) + _topology(job) + _numa(job, t)
    started = min(g.first_ts for g in gpus)
    runtime = max(g.last_ts for g in gpus) - min((g.job_start or g.first_ts) for g in gpus)
    long_enough = runtime >= timedelta(minutes=t["min_runtime_minutes"])
    shares = [g.peak_mem_share for g in gpus if g.peak_mem_share is not None]
    if shares and long_enough and max(shares) < t["memory_share"]:
        peak = max(g.peak_mem_mib or 0 for g in gpus)
        hits.append(Hit("memory_underused", "info", "code", "job", "", started,
                        {"peak_share": _r(max(shares), 3), "peak_mib": peak, "threshold": t["memory_share"]},
                        f"The job never used more than {max(shares):.0%} of GPU memory ({peak} MiB): a larger batch "
                        f"would use the GPUs better, or a smaller GPU or MIG slice would do."))
    requested = max(job.gpus_requested or 0, len(gpus))
    if long_enough and job.gpus_ever_used is not None and job.gpus_ever_used < requested:
        never = [g.where for g in gpus if g.last_busy is None]
        hits.append(Hit("over_allocation", "warning", "code", "job", "", started,
                        {"gpus_requested": requested, "gpus_used": job.gpus_ever_used, "never_used": never},
                        f"The job asked for {requested} GPUs and has used {job.gpus_ever_used} so far"
                        + (f" ({', '.join(never)} never busy)" if never else "")
                        + f": request --gres=gpu:{max(job.gpus_ever_used, 1)} per job (or make the code use all of "
                          f"them: torchrun --nproc-per-node, DistributedDataParallel)."))
    return hits


def _imbalance(job: JobView, t: dict[str, Any]) -> list[Hit]:
    """A GPU (and its ranks) far below the median of the job's other GPUs while they work. The
    median leaves the judged GPU out: with two GPUs, one idle must not drag the reference down."""
    means = [(g, g.activity[0]) for g in job.gpus
             if g.activity[0] is not None and g.samples >= t["min_samples"] and g.covers(t["window_minutes"])]
    hits = []
    for i, (g, v) in enumerate(means):
        others = [x for j, (_, x) in enumerate(means) if j != i]
        if not others:
            break
        median = statistics.median(others)
        if median >= t["imbalance_busy_percent"] and v < median * t["imbalance_ratio"]:
            hits.append(Hit("imbalance", "warning", "code", "gpu", g.key, g.first_ts,
                            {"mean_percent": _r(v), "others_median_percent": _r(median), "metric": g.activity[1],
                             "ranks": job.ranks_on(g), "nodes_in_job": len({x.node for x in job.gpus})},
                            f"{g.where}{_ranks(job.ranks_on(g))} runs at {v:.0f}% while the job's other GPUs run "
                            f"at {median:.0f}% (median): a straggler or an idle rank holds the others back. Check "
                            f"its data shard, its node ({g.node}) and its rank's logs."))
    return hits


def _ranks(ranks: list[int]) -> str:
    return f" (rank {', '.join(map(str, ranks))})" if ranks else ""


_VIA_CPU = {"PHB", "NODE", "SYS"}  # paths through a CPU's host bridge or between sockets


def _topology(job: JobView) -> list[Hit]:
    """A job's GPUs on a node talk through the CPU while that node has NVLink-connected GPUs."""
    hits = []
    for node in sorted({g.node for g in job.gpus}):
        mine = [g for g in job.gpus if g.node == node]
        node_links = job.links.get(node, {})
        if len(mine) < 2 or not any(link.startswith("NV") for peers in node_links.values() for link in peers.values()):
            continue
        slow = {f"GPU{a.gpu_index}-GPU{b.gpu_index}": link for i, a in enumerate(mine) for b in mine[i + 1:]
                if (link := node_links.get(a.gpu_uuid, {}).get(b.gpu_uuid, "")) in _VIA_CPU}
        if slow:
            hits.append(Hit("topology_no_nvlink", "warning", "hardware", "node", node, min(g.first_ts for g in mine),
                            {"links": slow, "gpus": [g.where for g in mine]},
                            f"The job's GPUs on {node} reach each other only through the CPU "
                            f"({', '.join(f'{k} {v}' for k, v in slow.items())}) although {node} has NVLink-connected "
                            f"GPUs: collectives run far slower. Admins: describe NVLink groups in gres.conf (Links=) "
                            f"so Slurm packs GPUs by link; users: request whole NVLink groups (--gres=gpu:N with "
                            f"N a group size) or --exclusive."))
    return hits


def _cpus(cpulist: str) -> set[int]:
    out: set[int] = set()
    for part in cpulist.split(","):
        lo, _, hi = part.partition("-")
        if lo.strip().isdigit():
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _numa(job: JobView, t: dict[str, Any]) -> list[Hit]:
    """A rank that runs on CPUs far from its GPU (outside the GPU's local CPU set)."""
    hits = []
    for p in job.procs:
        local = job.local_cpus.get(f"{p.node}/{p.gpu_uuid}") if p.gpu_uuid else None
        seen = sum(p.cpus.values())
        if not local or seen < t["min_samples"]:
            continue
        near = _cpus(local)
        far = sum(n for cpu, n in p.cpus.items() if cpu not in near)
        if far / seen >= t["numa_far_share"]:
            g = next((x for x in job.gpus if x.node == p.node and x.gpu_uuid == p.gpu_uuid), None)
            where = g.where if g else f"{p.node}/{p.gpu_uuid}"
            hits.append(Hit("numa_far", "warning", "code", "rank", f"{p.node}/pid{p.pid}",
                            g.first_ts if g else min(x.first_ts for x in job.gpus),
                            {"pid": p.pid, "rank": p.rank, "gpu": where, "cpus_seen": sorted(p.cpus),
                             "gpu_local_cpus": local, "far_share": _r(far / seen, 3)},
                            f"Process {p.pid}{'' if p.rank is None else f' (rank {p.rank})'} drives {where} from "
                            f"CPUs {_cpulist_short(p.cpus)}, outside the GPU's local CPUs ({local}): every copy "
                            f"crosses sockets. Bind tasks near their GPUs: srun --cpu-bind=cores --gpu-bind=closest "
                            f"(admins: Cores= in gres.conf)."))
    return hits


def _cpulist_short(cpus: dict[int, int]) -> str:
    return ",".join(map(str, sorted(cpus)[:8])) + ("..." if len(cpus) > 8 else "")
