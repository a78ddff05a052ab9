"""Rules on what a job asked for against what it used: GPU memory, and GPUs never used."""

from __future__ import annotations

from datetime import timedelta

from jobpulse.collector.rules.model import Finding, JobView, Rule, Settings, rounded


def _long_enough(job: JobView, t: Settings) -> bool:
    runtime = max(g.last_ts for g in job.gpus) - min((g.job_start or g.first_ts) for g in job.gpus)
    return runtime >= timedelta(minutes=t["min_runtime_minutes"])


def memory_underused(job: JobView, t: Settings) -> list[Finding]:
    """Peak memory share of every GPU below memory_share for a job that ran long enough."""
    shares = [g.peak_mem_share for g in job.gpus if g.peak_mem_share is not None]
    if not shares or not _long_enough(job, t) or max(shares) >= t["memory_share"]:
        return []
    peak = max(g.peak_mem_mib or 0 for g in job.gpus)
    return [Finding("", min(g.first_ts for g in job.gpus),
                    {"peak_share": rounded(max(shares), 3), "peak_mib": peak, "threshold": t["memory_share"]},
                    f"The job never used more than {max(shares):.0%} of GPU memory ({peak} MiB): a larger batch "
                    f"would use the GPUs better, or a smaller GPU or MIG slice would do.")]


def over_allocation(job: JobView, t: Settings) -> list[Finding]:
    """Fewer GPUs busy since the job started than it requested."""
    requested = max(job.gpus_requested or 0, len(job.gpus))
    used = job.gpus_ever_used
    if not _long_enough(job, t) or used is None or used >= requested:
        return []
    never = [g.where for g in job.gpus if g.last_busy is None]
    return [Finding("", min(g.first_ts for g in job.gpus),
                    {"gpus_requested": requested, "gpus_used": used, "never_used": never},
                    f"The job asked for {requested} GPUs and has used {used} so far"
                    + (f" ({', '.join(never)} never busy)" if never else "")
                    + f": request --gres=gpu:{max(used, 1)} per job (or make the code use all of "
                      f"them: torchrun --nproc-per-node, DistributedDataParallel).")]


RULES = (
    Rule("memory_underused", "job", "code", "info", "peak GPU memory far below what the GPUs have",
         ("peak_mem_share", "peak_mem_mib", "first_ts", "last_ts", "job_start"),
         ("memory_share", "min_runtime_minutes"), job_check=memory_underused),
    Rule("over_allocation", "job", "code", "warning", "GPUs requested but never busy",
         ("gpus_requested", "gpus_ever_used", "last_busy"), ("min_runtime_minutes",), job_check=over_allocation),
)
