"""Rules on how much of each GPU a job uses: idle, input-bound, low, imbalanced, no tensor cores.

Idleness is judged by the share of samples idle over a trailing stretch (`evidence.idle_stretch`),
so a short burst cannot reset it; every mean by the same evidence rule (`evidence.trailing`): a
few minutes of clear signal after warm-up decide, and the stretch's start is when it began.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import operator
import statistics
from collections.abc import Callable
from datetime import datetime, timedelta

from jobpulse.collector.rules.evidence import (
    IDLE_HISTORY,
    Stretch,
    idle_stretch,
    idling,
    judged_blocks,
    per_gpu,
    spins,
    trailing,
    warmup_end,
    warmup_start,
    working_level,
)
from jobpulse.collector.rules.model import (
    Block,
    Finding,
    GpuStats,
    JobView,
    ProcStats,
    Read,
    Rule,
    Settings,
    SettingsOf,
    minutes_of,
    rounded,
)

_known = functools.partial(operator.is_not, None)

SINGLE_CORE_MAX_PERCENT = 110.0
"""A main process above one core is multi-threaded: its CPU use alone says nothing about loading."""


def _ranks(job: JobView, g: GpuStats) -> dict[str, list[int]]:
    ranks = job.ranks_on(g)
    return {"ranks": ranks} if ranks else {}


def _minutes(g: GpuStats, stretch: Stretch) -> float | None:
    """How long the stretch has held, in minutes (evidence)."""
    return rounded((g.last_ts - stretch.since).total_seconds() / 60)


START_UP_ADVICE = ("loading a model or data, or CPU work before the GPU part, holds it. Stage checkpoints and "
                   "data on local disk (or load once per node and broadcast), and run CPU preprocessing as a job "
                   "of its own without --gres.")


def start_up(s: GpuStats, since: datetime, t: Settings) -> bool:
    """Idle or nearly so since the job's first minutes, after at most a short GPU check (work shorter
    than evidence_minutes): start-up, told as such, not as a GPU the job does not need. Work before is
    known while the look-back reaches the job's start (a GPU never busy since it started had none)."""
    if s.first_ts > s.start + timedelta(seconds=t["evidence_block_seconds"]) and s.ever_busy is not False:
        return False
    worked = sum(1 for m in s.full_blocks if m.start < since and m.busy * 2 >= m.n) * t["evidence_block_seconds"]
    return since - s.start <= timedelta(minutes=t["warmup_max_minutes"]) and worked < t["evidence_minutes"] * 60


def idle_gpu(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """At least idle_share of the samples idle over a stretch of idle_minutes or more."""
    found = idle_stretch(s, t)
    if found is None:
        return None
    since, share = found
    idle = (s.last_ts - since).total_seconds() / 60
    if idle < t["idle_minutes"]:
        return None
    held = f" while holding {s.last_mem_mib} MiB of memory" if s.last_mem_mib else ""
    loading = start_up(s, since, t)
    return Finding(s.key, since,
                   {"idle_minutes": rounded(idle), "idle_since": since.isoformat(), "idle_share": rounded(share, 3),
                    "memory_mib": s.last_mem_mib, "threshold_minutes": t["idle_minutes"], "metric": s.metric,
                    **({"start_up": True} if loading else {}), **_ranks(job, s)},
                   f"{s.where} has been idle for {idle:.0f} min ({share:.0%} of samples){held}"
                   + (f" since the job's start-up: {START_UP_ADVICE}" if loading else ". ")
                   + ("" if loading else "If the job does not need it, request fewer GPUs (--gres=gpu:N); if it should, check that "
                      "every rank picks its own GPU (LOCAL_RANK / CUDA_VISIBLE_DEVICES) and that no rank waits on "
                      "another." if len(job.gpus) > 1 else
                      "The job's only GPU waits: if the work is on the CPU (preprocessing, an interactive session "
                      "left open), run that part without --gres and end the job when done; if it should compute, "
                      "check that the code moves its model and data to the GPU (.to('cuda'))."))


_act: Callable[[Block], float | None] = operator.attrgetter("act")  # a C call per block, not a frame
_idle: Callable[[Block], int] = operator.attrgetter("idle")
_busy: Callable[[Block], int] = operator.attrgetter("busy")
_sm_active: Callable[[Block], float | None] = operator.attrgetter("sm_active")


def _stall(m: Block) -> float | None:
    """How much a minute is both idle and busy: bursts of work with idle gaps between them."""
    return min(m.idle, m.busy) / m.n if m.n else None


def _act_mean(stretch: Stretch) -> float | None:
    """The GPU's mean activity over a stretch judged on another value (stalls)."""
    known = [(m.act, m.n) for m in stretch.blocks if m.act is not None]
    return sum(a * n for a, n in known) / sum(n for _, n in known) if known else None


@per_gpu
def low_stretch(s: GpuStats, t: Settings) -> Stretch | None:
    """A trailing stretch surely below low_percent that is not idleness (the idle rule's to judge);
    sparse work, idle in most samples, must last idle_minutes."""
    if idling(s, t):
        return None
    found = trailing(judged_blocks(s, t), _act, t, below=t["low_percent"])
    if found is None or found.idle_share >= t["idle_share"]:
        return None
    sparse = found.idle_share >= t["sparse_idle_share"]
    return None if sparse and s.last_ts - found.since < timedelta(minutes=t["idle_minutes"]) else found


def _saturated(main: ProcStats, workers: list[ProcStats], stretch: Stretch, stalls: bool,
               t: Settings) -> dict[str, object] | None:
    """Is this rank's data pipeline what the GPU waits for? Its loader workers all but saturated; with
    no workers, its main process's threads keeping every CPU it may use busy (tf.data, DALI), or its
    single-threaded main process at one full core while the GPU stalls (a steady low GPU beside a
    busy main thread is a host thread spinning or tiny kernels). Saturated
    means the CPU a process wanted (`ProcStats.demand_over`): a loader kept waiting by others on
    its CPUs uses less than a core but is just as much what the GPU waits for."""
    minutes = minutes_of(stretch.starts)
    seen = [(used, wanted) for w in workers if (wanted := w.demand_over(minutes)) is not None
            and (used := w.cpu_over(minutes)) is not None]
    main_used, main_wanted = main.cpu_over(minutes), main.demand_over(minutes)
    if seen:
        wanted = statistics.fmean(x for _, x in seen)
        if wanted < t["cpu_saturated_percent"]:
            return None
        return {"pattern": "workers_saturated", "workers": len(seen),
                "worker_cpu_percent": rounded(statistics.fmean(x for x, _ in seen)),
                "worker_demand_percent": rounded(wanted), "main_cpu_percent": rounded(main_used)}
    allowed = main.allowed_over(minutes)
    if (main_used is not None and allowed and allowed >= 2 and main_used > SINGLE_CORE_MAX_PERCENT
            and main_used >= t["cpu_saturated_percent"] * allowed):
        # An input pipeline in threads (tf.data, DALI, OpenMP decoding) keeping every CPU it has busy.
        return {"pattern": "threads_saturated", "workers": 0, "main_cpu_percent": rounded(main_used),
                "cpus_allowed": allowed}
    if (not stalls or main_used is None or main_wanted is None or main_used > SINGLE_CORE_MAX_PERCENT
            or main_wanted < t["cpu_saturated_percent"]):
        return None
    return {"pattern": "main_process_loads", "workers": 0, "main_cpu_percent": rounded(main_used),
            "main_demand_percent": rounded(main_wanted)}


@per_gpu
def underused(s: GpuStats, t: Settings) -> tuple[Stretch, bool] | None:
    """The stretch over which input_bound asks whether a rank's pipeline is saturated, and whether it
    is one of stalls (else of a low mean). The store reads process minutes only for jobs with one."""
    blocks = judged_blocks(s, t)
    # Most GPUs have no block both idle and busy in part: no stall share there can reach a positive
    # threshold, and the evidence rule need not look (builtins, not a frame per block).
    stalls = (trailing(blocks, _stall, t, at_least=t["stall_share"])
              if t["stall_share"] <= 0 or any(map(min, map(_idle, blocks), map(_busy, blocks))) else None)
    if stalls is not None:
        return stalls, True
    low = low_stretch(s, t)
    return None if low is None else (low, False)


def input_bound(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """An underused GPU (stalls, or a low mean) whose own rank's data pipeline is saturated."""
    found = underused(s, t)
    if found is None:
        return None
    stretch, stalls = found
    for main in job.drivers(s):
        pipeline = _saturated(main, job.workers_of(main), stretch, stalls, t)
        if pipeline is None:
            continue
        rank = "" if main.rank is None else f", rank {main.rank}"
        mean = _act_mean(stretch) or 0.0
        return Finding(s.key, stretch.since,
                       {**pipeline, "mean_percent": rounded(mean), "metric": s.metric,
                        "idle_share": rounded(stretch.idle_share, 3), "busy_share": rounded(stretch.busy_share, 3),
                        "minutes": _minutes(s, stretch), "pid": main.pid, "rank": main.rank},
                       f"{s.where} averaged {mean:.0f}% {s.metric} ({stretch.idle_share:.0%} of samples idle) "
                       f"while its data pipeline (process {main.pid}{rank}"
                       + (f" and {pipeline['workers']} loader workers" if pipeline["workers"] else "")
                       + (f", its threads on all {pipeline['cpus_allowed']} of its CPUs"
                          if pipeline["pattern"] == "threads_saturated" else "")
                       + ") kept its CPUs busy: the GPU waits for input. "
                       + ("Use more data-loader workers (num_workers) and ask for the CPUs they need "
                          "(--cpus-per-task), or move preprocessing to the GPU (DALI, torchvision v2 on GPU)."
                          if pipeline["workers"] else
                          "Ask for more CPUs (--cpus-per-task), cache or pre-decode the data, or move decoding "
                          "to the GPU (DALI, nvJPEG)." if pipeline["pattern"] == "threads_saturated" else
                          "Load data in worker processes (DataLoader num_workers > 0, pin_memory=True, "
                          "prefetching) and ask for enough CPUs (--cpus-per-task)."))
    return None


def low_utilization(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """A mean surely below low_percent over a trailing stretch after warm-up. Sparse work from the end
    of a warm-up that its cap cut short while memory still grew (a few copies and kernels: a slow
    load) is start-up."""
    stretch = low_stretch(s, t)
    if stretch is None:
        return None
    capped = warmup_start(s) + timedelta(minutes=t["warmup_max_minutes"])
    loading = (stretch.idle_share >= t["sparse_idle_share"] and warmup_end(s, t) >= capped
               and stretch.since <= capped + timedelta(seconds=t["evidence_block_seconds"]))
    return Finding(s.key, stretch.since,
                   {"mean_percent": rounded(stretch.mean), "upper_bound_percent": rounded(stretch.high),
                    "metric": s.metric, "minutes": _minutes(s, stretch), "threshold_percent": t["low_percent"],
                    **({"start_up": True} if loading else {}), **_ranks(job, s)},
                   f"{s.where} averaged {stretch.mean:.0f}% {s.metric} over the last {_minutes(s, stretch):.0f} min"
                   + (f" since the job's start-up, its memory still growing: {START_UP_ADVICE}" if loading else
                      ". Larger batches, fewer host round-trips (CUDA graphs, torch.compile), more data-loader "
                      + ("workers, or fewer GPUs would use them better." if len(job.gpus) > 1 else
                         "workers, or a smaller GPU or MIG slice would use it better.")))


def no_tensor_cores(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """Busy SMs (GPM) with no tensor-pipe activity at all, over a stretch after warm-up."""
    blocks = judged_blocks(s, t)
    if not any(map(_known, map(_sm_active, blocks))):  # no GPM: nothing to judge (most GPUs in a mixed cluster)
        return None
    stretch = trailing(blocks,
                       lambda m: m.sm_active if m.sm_active is not None and (m.tensor_max or 0) < 1.0 else None,
                       t, at_least=t["tensor_busy_percent"])
    if stretch is None:
        return None
    return Finding(s.key, stretch.since,
                   {"sm_active_percent": rounded(stretch.mean), "tensor_active_max_percent": 0.0,
                    "minutes": _minutes(s, stretch)},
                   f"{s.where} is busy ({stretch.mean:.0f}% SM activity) without using tensor cores: "
                   f"enable mixed precision (torch.autocast / bf16) or TF32.")


def effective(g: GpuStats, t: Settings, level: float | None) -> Callable[[Block], float | None]:
    """A block's activity, or -- for a GPU without GPM whose busy block spins (`evidence.spins`:
    under the spinning share of the job's working power) -- its activity scaled by that power share."""
    if level is None or g.uses_gpm:
        return _act

    def act(m: Block) -> float | None:
        if m.act is None or m.power is None or not spins(m.act, m.power, t, level):
            return m.act
        return m.act * m.power / level
    return act


def _spinning(g: GpuStats, t: Settings, level: float | None) -> bool:
    return not g.uses_gpm and level is not None and any(spins(m.act, m.power, t, level) for m in g.full_blocks)


def _gap_to(medians: dict[datetime, float], ratio: float) -> Callable[[Block], float | None]:
    """A minute's activity minus ``ratio`` times its peers' median then (below 0: far below them)."""
    def gap(m: Block) -> float | None:
        return None if m.act is None or m.start not in medians else m.act - ratio * medians[m.start]
    return gap


def _gap_of(act: Callable[[Block], float | None],
            gap: Callable[[Block], float | None]) -> Callable[[Block], float | None]:
    """The gap to the peers of a block's effective activity (`effective`)."""
    def of(m: Block) -> float | None:
        a = act(m)
        return gap(m if a == m.act else dataclasses.replace(m, act=a))
    return of


def _others_medians(by_minute: dict[str, dict[datetime, float]]) -> dict[str, dict[datetime, float]]:
    """For each GPU, minute by minute, the median of the other GPUs' activity then: one sort per
    minute, and each GPU's own value left out by position (a 64-GPU job would otherwise sort 63
    values 64 times a minute)."""
    at: dict[datetime, list[float]] = {}
    for acts in by_minute.values():
        for start, act in acts.items():
            at.setdefault(start, []).append(act)
    for values in at.values():
        values.sort()
    medians: dict[str, dict[datetime, float]] = {}
    for key, acts in by_minute.items():
        mine = medians[key] = {}
        for start, act in acts.items():
            values = at[start]
            n = len(values) - 1
            if not n:
                continue
            # The others' k-th value is values[k] below the GPU's own position i, values[k + 1] from it.
            i, k = bisect.bisect_left(values, act), n // 2
            upper = values[k] if k < i else values[k + 1]
            mine[start] = upper if n % 2 else ((values[k - 1] if k - 1 < i else values[k]) + upper) / 2
    return medians


def imbalance(job: JobView, t: Settings) -> list[Finding]:
    """A GPU surely below imbalance_ratio of the median of the job's other GPUs, minute by minute,
    while they work. The median leaves the judged GPU out: with two GPUs, one idle must not drag
    the reference down."""
    if len(job.gpus) < 2:
        return []
    level = working_level(job)
    acts = {g.key: effective(g, t, level) for g in job.gpus}
    by_minute = {g.key: {m.start: a for m in judged_blocks(g, t) if (a := acts[g.key](m)) is not None}
                 for g in job.gpus}
    others = _others_medians(by_minute)
    found = []
    for g in job.gpus:
        medians = others[g.key]
        stretch = trailing(judged_blocks(g, t), _gap_of(acts[g.key], _gap_to(medians, t["imbalance_ratio"])), t,
                           below=0.0)
        if stretch is None or stretch.idle_share >= t["idle_share"] or idling(g, t):
            continue
        peers = [medians[m] for m in stretch.starts]
        median = statistics.fmean(peers)
        # The others work through the stretch, not in one block of it: a block in which every GPU went
        # from work to waiting (a barrier's first) would carry the mean of three over the bar alone.
        if statistics.median(peers) < t["imbalance_busy_percent"]:
            continue
        ranks = job.ranks_on(g)
        named = f" (rank {', '.join(map(str, ranks))})" if ranks else ""
        found.append(Finding(
            g.key, stretch.since,
            {"mean_percent": rounded(stretch.mean + t["imbalance_ratio"] * median), "others_median_percent":
             rounded(median), "metric": g.metric, "minutes": _minutes(g, stretch), **_ranks(job, g),
             "nodes_in_job": len({x.node for x in job.gpus})},
            f"{g.where}{named} runs at {stretch.mean + t['imbalance_ratio'] * median:.0f}% while the job's other "
            f"GPUs run at {median:.0f}% (median): a straggler or an idle rank holds the others back. Check its "
            f"data shard, its node ({g.node}) and its rank's logs."))
    return found


def held_back(job: JobView, t: Settings) -> list[Finding]:
    """Most of a job's GPUs low (two thirds or more) while a few run busy: the few hold the others
    back -- a slow node, a straggling rank the others wait for at every collective. One job-wide
    flag that names the place and how many GPUs wait, instead of a low-use flag on each waiting GPU
    (it explains those: `registry.EXPLAINS`)."""
    if len(job.gpus) < 3:
        return []
    level = working_level(job)
    waiting = [(g, found) for g in job.gpus
               if (found := low_stretch(g, t) or (trailing(judged_blocks(g, t), effective(g, t, level), t,
                                                           below=t["low_percent"]) if _spinning(g, t, level) else None))
               is not None]
    if len(waiting) * 3 < len(job.gpus) * 2:
        return []
    low = {g.key for g, _ in waiting}
    busy = [(g, found) for g in job.gpus if g.key not in low
            and (found := trailing(judged_blocks(g, t), effective(g, t, level), t,
                                   at_least=t["imbalance_busy_percent"])) is not None]
    if not busy or len(busy) + len(waiting) < len(job.gpus) or len(busy) * 3 > len(job.gpus):
        return []
    nodes = {g.node for g, _ in busy}
    whole_node = len(nodes) == 1 and {g.key for g in job.gpus if g.node in nodes} == {g.key for g, _ in busy}
    place = f"node {next(iter(nodes))}" if whole_node and len(busy) > 1 else ", ".join(g.where for g, _ in busy)
    wait_mean = statistics.fmean(found.mean for _, found in waiting)
    busy_mean = statistics.fmean(found.mean for _, found in busy)
    since = max(min(found.since for _, found in waiting), min(found.since for _, found in busy))
    spin = any(_spinning(g, t, level) for g, _ in waiting)
    metric = (f"{job.gpus[0].metric} x power drawn / the job's working level ({level:.0f} W)" if spin and level
              else job.gpus[0].metric)
    return [Finding("", since,
                    {"holding_back": [g.where for g, _ in busy], "waiting_gpus": len(waiting),
                     "waiting_mean_percent": rounded(wait_mean), "busy_mean_percent": rounded(busy_mean),
                     "metric": metric, "gpus": [g.key for g, _ in waiting]},
                    f"{place} runs at {busy_mean:.0f}% while the job's other {len(waiting)} GPUs wait at "
                    f"{wait_mean:.0f}%: it holds the whole job back. Check {place} (a slow or throttled node, "
                    f"a larger data shard, a rank doing extra work such as logging or checkpointing) and, for "
                    f"a slow node, resubmit excluding it (--exclude).")]


def _pipelines(job: JobView, settings_of: SettingsOf) -> list[bool]:
    """The process minutes are read for a job with an underused GPU: is its rank's pipeline saturated?"""
    return [True] if any(g.reporting and underused(g, settings_of(g)) for g in job.gpus) else []


READS = (IDLE_HISTORY, Read("processes", _pipelines))
"""An idle GPU's history (an idle stretch older than the window); the process minutes of jobs with
an underused GPU (input_bound)."""

_MEANS = ("blocks", "first_ts", "last_ts", "job_start")
_EVIDENCE = ("window_minutes", "evidence_minutes", "evidence_z", "warmup_minutes", "warmup_max_minutes")
RULES = (
    Rule("idle_gpu", "gpu", "code", "warning", "a GPU idle in idle_share of its samples for idle_minutes",
         ("blocks", "last_ts", "idle_before", "last_mem_mib"), ("idle_minutes", "idle_share"), gpu_check=idle_gpu),
    Rule("input_bound", "gpu", "code", "warning", "an underused GPU whose rank's data pipeline is saturated",
         (*_MEANS, "procs"), (*_EVIDENCE, "stall_share", "low_percent", "idle_share", "sparse_idle_share",
                              "idle_minutes", "cpu_saturated_percent"),
         gpu_check=input_bound),
    Rule("low_utilization", "gpu", "code", "warning", "a GPU's mean activity surely below low_percent",
         _MEANS, (*_EVIDENCE, "low_percent", "idle_share", "sparse_idle_share", "idle_minutes"),
         gpu_check=low_utilization),
    Rule("imbalance", "gpu", "code", "warning", "a GPU far below the job's other GPUs",
         _MEANS, (*_EVIDENCE, "imbalance_ratio", "imbalance_busy_percent", "idle_share", "hang_power_share"),
         job_check=imbalance),
    Rule("held_back", "job", "code", "warning", "most GPUs low while a few run busy: those few hold the job back",
         _MEANS, (*_EVIDENCE, "low_percent", "idle_share", "sparse_idle_share", "idle_minutes",
                  "imbalance_busy_percent", "hang_power_share"), job_check=held_back),
    Rule("no_tensor_cores", "gpu", "code", "info", "busy SMs without tensor cores (GPM)",
         _MEANS, (*_EVIDENCE, "tensor_busy_percent"), gpu_check=no_tensor_cores),
)
