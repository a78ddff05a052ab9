"""Rules on how much of each GPU a job uses: idle, input-bound, low, imbalanced, no tensor cores.

Idle GPUs are judged by the length of the current idle *run*, not a mean, so brief use cannot hide
long idling; the means wait until a GPU's samples cover the window (no verdict during warm-up).
"""

from __future__ import annotations

import statistics

from jobpulse.collector.rules.model import Finding, GpuStats, JobView, Rule, Settings, rounded
from jobpulse.schema.semantics import IDLE_PERCENT


def _idle_now(s: GpuStats) -> bool:
    return s.last_util is not None and s.last_util <= IDLE_PERCENT


def _idle_pending(s: GpuStats) -> bool:
    """Idle all window long but not yet for idle_minutes: the idle rule's to judge, later."""
    return _idle_now(s) and s.last_busy is None


def _covered(s: GpuStats, t: Settings) -> bool:
    return s.samples >= t["min_samples"] and s.covers(t["window_minutes"])


def idle_gpu(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """The latest sample idle and no busy sample for idle_minutes (run length, not a mean)."""
    since = s.last_busy or s.first_ts
    idle = (s.last_ts - since).total_seconds() / 60
    if not _idle_now(s) or idle < t["idle_minutes"]:
        return None
    metric = s.activity[1]
    held = f" while holding {s.last_mem_mib} MiB of memory" if s.last_mem_mib else ""
    return Finding(s.key, since,
                   {"idle_minutes": rounded(idle), "idle_since": since.isoformat(), "memory_mib": s.last_mem_mib,
                    "threshold_minutes": t["idle_minutes"], "metric": metric, "ranks": job.ranks_on(s)},
                   f"{s.where} has been idle for {idle:.0f} min{held}. If the job does not need it, "
                   f"request fewer GPUs (--gres=gpu:N); if it should, check that every rank picks its own "
                   f"GPU (LOCAL_RANK / CUDA_VISIBLE_DEVICES) and that no rank waits on another.")


def input_bound(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """Bursts of work with idle gaps (stalls), or a low GPU while a CPU of the job is saturated."""
    if _idle_pending(s) or not _covered(s, t):
        return None
    value, metric = s.activity
    if s.idle_share >= t["stall_share"] and s.busy_share >= t["stall_share"]:
        return Finding(s.key, s.first_ts,
                       {"pattern": "stalls", "idle_share": rounded(s.idle_share, 3),
                        "busy_share": rounded(s.busy_share, 3), "mean_percent": rounded(value), "metric": metric,
                        "ranks": job.ranks_on(s)},
                       f"{s.where} keeps dropping to idle between bursts of work ({s.idle_share:.0%} of samples "
                       f"idle, {s.busy_share:.0%} busy): the GPU waits for input. Use more data-loader workers "
                       f"(num_workers), pin_memory=True and prefetching, or move preprocessing to the GPU.")
    cpu = job.busiest(s.node)
    if value is None or value >= t["low_percent"] or cpu is None or (cpu.cpu_mean or 0) < t["cpu_saturated_percent"]:
        return None
    return Finding(s.key, s.first_ts,
                   {"pattern": "cpu_saturated", "mean_percent": rounded(value), "metric": metric,
                    "cpu_percent": rounded(cpu.cpu_mean), "pid": cpu.pid, "rank": cpu.rank, "command": cpu.command},
                   f"{s.where} averaged {value:.0f}% {metric} while process {cpu.pid} ({cpu.command}"
                   f"{'' if cpu.rank is None else f', rank {cpu.rank}'}) kept a CPU at "
                   f"{cpu.cpu_mean:.0f}%: the GPU waits for the CPU. Load data in worker processes "
                   f"(DataLoader num_workers > 0, pin_memory=True) and ask for enough CPUs (--cpus-per-task).")


def low_utilization(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """A mean below low_percent over a covered window."""
    value, metric = s.activity
    if _idle_pending(s) or not _covered(s, t) or value is None or value >= t["low_percent"]:
        return None
    return Finding(s.key, s.first_ts,
                   {"mean_percent": rounded(value), "metric": metric, "window_minutes": t["window_minutes"],
                    "threshold_percent": t["low_percent"]},
                   f"{s.where} averaged {value:.0f}% {metric} over the last {t['window_minutes']:.0f} min. "
                   f"Larger batches, fewer data-loader stalls (more workers, pinned memory, prefetching), "
                   f"or fewer GPUs would use them better.")


def no_tensor_cores(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """Busy SMs (GPM) with no tensor-pipe activity at all."""
    if not (s.gpm_samples and s.sm_active_mean is not None and s.sm_active_mean >= t["tensor_busy_percent"]
            and (s.tensor_max or 0) < 1.0):
        return None
    return Finding(s.key, s.first_ts,
                   {"sm_active_percent": rounded(s.sm_active_mean), "tensor_active_max_percent": rounded(s.tensor_max)},
                   f"{s.where} is busy ({s.sm_active_mean:.0f}% SM activity) without using tensor cores: "
                   f"enable mixed precision (torch.autocast / bf16) or TF32.")


def imbalance(job: JobView, t: Settings) -> list[Finding]:
    """A GPU (and its ranks) far below the median of the job's other GPUs while they work. The
    median leaves the judged GPU out: with two GPUs, one idle must not drag the reference down."""
    means = [(g, g.activity[0]) for g in job.gpus if g.activity[0] is not None and _covered(g, t)]
    found = []
    for i, (g, v) in enumerate(means):
        others = [x for j, (_, x) in enumerate(means) if j != i]
        if not others:
            break
        median = statistics.median(others)
        if median >= t["imbalance_busy_percent"] and v < median * t["imbalance_ratio"]:
            ranks = job.ranks_on(g)
            named = f" (rank {', '.join(map(str, ranks))})" if ranks else ""
            found.append(Finding(
                g.key, g.first_ts,
                {"mean_percent": rounded(v), "others_median_percent": rounded(median), "metric": g.activity[1],
                 "ranks": ranks, "nodes_in_job": len({x.node for x in job.gpus})},
                f"{g.where}{named} runs at {v:.0f}% while the job's other GPUs run at {median:.0f}% (median): "
                f"a straggler or an idle rank holds the others back. Check its data shard, its node "
                f"({g.node}) and its rank's logs."))
    return found


_MEANS = ("samples", "first_ts", "last_ts", "util_mean", "gpm_samples", "sm_active_mean")
RULES = (
    Rule("idle_gpu", "gpu", "code", "warning", "a GPU idle for a run of idle_minutes",
         ("last_util", "last_busy", "first_ts", "last_ts", "last_mem_mib"), ("idle_minutes",), gpu_check=idle_gpu),
    Rule("input_bound", "gpu", "code", "warning", "a GPU waiting for input: stalls, or a saturated CPU",
         (*_MEANS, "idle_share", "busy_share"),
         ("window_minutes", "min_samples", "stall_share", "low_percent", "cpu_saturated_percent"),
         gpu_check=input_bound),
    Rule("low_utilization", "gpu", "code", "warning", "a GPU's mean activity below low_percent",
         _MEANS, ("window_minutes", "min_samples", "low_percent"), gpu_check=low_utilization),
    Rule("imbalance", "gpu", "code", "warning", "a GPU far below the job's other GPUs",
         _MEANS, ("window_minutes", "min_samples", "imbalance_ratio", "imbalance_busy_percent"),
         job_check=imbalance),
    Rule("no_tensor_cores", "gpu", "code", "info", "busy SMs without tensor cores (GPM)",
         ("gpm_samples", "sm_active_mean", "tensor_max"), ("tensor_busy_percent",), gpu_check=no_tensor_cores),
)
