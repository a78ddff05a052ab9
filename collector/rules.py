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

HW_SLOWDOWN_BITS = 0x8 | 0x40 | 0x80  # HW slowdown, HW thermal slowdown, HW power brake


@dataclass(frozen=True)
class GpuStats:
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
        text = path.read_text() if path else resources.files("jobpulse.collector").joinpath(
            "rules_default.toml").read_text()
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"rules file {path}: {exc}") from None
        base = dict(tomllib.loads(resources.files("jobpulse.collector").joinpath("rules_default.toml").read_text())
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
        return timedelta(minutes=max(minutes) + 1)


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(float(x), nd)


def gpu_rules(s: GpuStats, t: dict[str, Any]) -> list[Hit]:
    hits = []
    key = f"{s.node}/{s.gpu_uuid}"
    value, metric = s.activity
    # Idle run: the latest sample idle, and no busy sample for idle_minutes. A GPU idle right now
    # is the idle rule's to judge (not yet long enough is no verdict, not "low utilization").
    if s.last_util is not None and s.last_util <= t["idle_percent"]:
        since = s.last_busy or s.first_ts
        idle = (s.last_ts - since).total_seconds() / 60
        if idle < t["idle_minutes"]:
            return hits
        held = f" while holding {s.last_mem_mib} MiB of memory" if s.last_mem_mib else ""
        hits.append(Hit("idle_gpu", "warning", "code", "gpu", key, since,
                        {"idle_minutes": _r(idle), "idle_since": since.isoformat(), "memory_mib": s.last_mem_mib,
                         "threshold_minutes": t["idle_minutes"], "metric": metric},
                        f"{s.where} has been idle for {idle:.0f} min{held}. If the job does not need it, "
                        f"request fewer GPUs (--gres=gpu:N); if it should, check that every rank picks its own "
                        f"GPU (LOCAL_RANK / CUDA_VISIBLE_DEVICES) and that no rank waits on another."))
        return hits  # an idle GPU is not additionally "low"
    if s.samples >= t["min_samples"] and value is not None and value < t["low_percent"]:
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


def job_rules(gpus: list[GpuStats], thresholds: Thresholds) -> list[Hit]:
    """Rules that compare a job's GPUs with each other or look at the job as a whole."""
    hits: list[Hit] = []
    first = gpus[0]
    t = thresholds.for_gpu(first.partition, first.model)
    means = [(g, g.activity[0]) for g in gpus if g.activity[0] is not None and g.samples >= t["min_samples"]]
    if len(means) >= 2:
        median = statistics.median(v for _, v in means)
        if median >= t["imbalance_busy_percent"]:
            for g, v in means:
                if v < median * t["imbalance_ratio"]:
                    hits.append(Hit("imbalance", "warning", "code", "gpu", f"{g.node}/{g.gpu_uuid}", g.first_ts,
                                    {"mean_percent": _r(v), "job_median_percent": _r(median), "metric": g.activity[1]},
                                    f"{g.where} runs at {v:.0f}% while the job's GPUs run at {median:.0f}% (median): "
                                    f"a straggler or an idle rank holds the others back. Check its data shard, "
                                    f"its node ({g.node}) and its rank's logs."))
    runtime = max(g.last_ts for g in gpus) - min((g.job_start or g.first_ts) for g in gpus)
    shares = [g.peak_mem_share for g in gpus if g.peak_mem_share is not None]
    if shares and runtime >= timedelta(minutes=t["min_runtime_minutes"]) and max(shares) < t["memory_share"]:
        peak = max(g.peak_mem_mib or 0 for g in gpus)
        hits.append(Hit("memory_underused", "info", "code", "job", "", min(g.first_ts for g in gpus),
                        {"peak_share": _r(max(shares), 3), "peak_mib": peak, "threshold": t["memory_share"]},
                        f"The job never used more than {max(shares):.0%} of GPU memory ({peak} MiB): a larger batch "
                        f"would use the GPUs better, or a smaller GPU or MIG slice would do."))
    return hits
