"""Rules on what a job asked for against what it used: GPU memory, and GPUs never used."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from jobpulse.collector.rules import mig
from jobpulse.collector.rules.evidence import IDLE_HISTORY, idle_stretch, warmup_end
from jobpulse.collector.rules.model import Finding, GpuStats, JobView, Rule, Settings, rounded


def never_used(g: GpuStats, t: Settings) -> bool:
    """Not one busy sample since the job started, and idle for idle_minutes: a GPU the job holds
    and does not use (not a GPU that went idle: that is idle_gpu)."""
    found = idle_stretch(g, t)
    return (g.ever_busy is False and found is not None
            and g.last_ts - found[0] >= timedelta(minutes=t["idle_minutes"]))


def over_allocation(job: JobView, t: Settings) -> list[Finding]:
    """GPUs of the job never busy since it started, decided once they idled for idle_minutes, while
    it uses others. A job that used none of its GPUs is idle (idle_gpu says so), not over-allocated:
    asking it for fewer GPUs (zero) would be no advice."""
    unused = [g for g in job.gpus if never_used(g, t)]
    if not unused or len(unused) == len(job.gpus):
        return []
    used = len(job.gpus) - len(unused)
    return [Finding("", min(g.start for g in job.gpus),
                    {"gpus_seen": len(job.gpus), "gpus_used": used, "never_used": [g.where for g in unused],
                     "gpus": [g.key for g in unused]},
                    f"The job holds {len(job.gpus)} GPUs and has used {used} so far "
                    f"({', '.join(g.where for g in unused)} never busy): request --gres=gpu:{used} "
                    f"(or make the code use all of them: torchrun --nproc-per-node, DistributedDataParallel).")]


def _activity(g: GpuStats) -> float | None:
    """Mean activity over the GPU's blocks (percent), weighted by their samples."""
    blocks = [b for b in g.blocks if b.act is not None and b.n]
    n = sum(b.n for b in blocks)
    return sum(float(cast(float, b.act)) * b.n for b in blocks) / n if n else None  # act: not None, as filtered


def _slice_for(working: list[GpuStats]) -> str | None:
    """The one MIG profile that holds every working GPU's peak memory and compute, if smaller than
    what each was given (a whole GPU, or its slice)."""
    found = {mig.fitting(g.model, g.mig.profile if g.mig else None, g.peak_mem_mib or 0, _activity(g))
             for g in working}
    return found.pop().name if len(found) == 1 and None not in found else None  # type: ignore[union-attr]


def worked_minutes(g: GpuStats, t: Settings) -> float:
    """Minutes of whole blocks after the GPU's warm-up in which it worked (idle in under half the
    samples): memory is judged on a GPU that works, never on an idle prelude or a loading phase."""
    after = warmup_end(g, t)
    blocks = sum(1 for m in g.full_blocks if m.start >= after and m.idle * 2 < m.n)
    return blocks * float(t["evidence_block_seconds"]) / 60


def memory_underused(job: JobView, t: Settings) -> list[Finding]:
    """The peak memory share of every working GPU whose memory was measured below memory_share,
    decided once each has worked memory_busy_minutes after its warm-up where the peak is under half
    the bar (a few busy minutes show it), twice that nearer the bar (a larger stage may follow); a
    prelude of CPU work is no work. Idle GPUs hold little memory because they are idle: not judged
    here; nor a GPU without a memory reading (a recording without the column): not measured is not
    zero. Where a MIG profile holds what each GPU used (memory and compute), the advice names it."""
    measured = [(g, peak, g.fb_total_mib) for g in job.gpus
                if worked_minutes(g, t) >= t["memory_busy_minutes"]
                for peak in (g.peak_mem_mib,) if peak is not None and g.fb_total_mib]
    working = [g for g, _, _ in measured]
    shares = [peak / total for _, peak, total in measured]
    if not shares or max(shares) >= t["memory_share"]:
        return []
    worked = min(worked_minutes(g, t) for g in working)
    if max(shares) >= t["memory_share"] / 2 and worked < 2 * t["memory_busy_minutes"]:
        return []  # near the bar: a later, larger stage may still fill it; twice the work decides
    peak = max(peak for _, peak, _ in measured)
    profile = _slice_for(working)
    smaller = (f"a MIG slice would do: --gres=gpu:{profile}:{len(working)} holds its memory and compute"
               if profile else "a smaller GPU or MIG slice would do")
    return [Finding("", min(g.start for g in job.gpus),
                    {"peak_share": rounded(max(shares), 3), "peak_mib": peak, "threshold": t["memory_share"],
                     "worked_minutes": rounded(worked),
                     "gpus": [g.key for g in working], **({"mig_profile": profile} if profile else {})},
                    f"The job never used more than {max(shares):.0%} of GPU memory ({peak} MiB): a larger batch "
                    f"would use the GPUs better, or {smaller}.")]


READS = (IDLE_HISTORY,)
"""over_allocation asks whether a GPU idle for idle_minutes was ever busy since the job started."""

RULES = (
    Rule("over_allocation", "job", "code", "warning", "GPUs held but never busy since the job started",
         ("ever_busy", "blocks", "last_ts", "idle_before"), ("idle_minutes", "idle_share"),
         job_check=over_allocation),
    Rule("memory_underused", "job", "code", "info", "peak GPU memory far below what the GPUs have",
         ("blocks", "fb_total_mib", "first_ts", "last_ts", "job_start", "model", "mig"),
         ("memory_share", "memory_busy_minutes", "evidence_block_seconds", "warmup_minutes", "warmup_max_minutes"),
         job_check=memory_underused),
)
