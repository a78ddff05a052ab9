"""Goodput: a job's allocated GPU-time split into productive time and badput by cause, the parts
summing to the whole (what fleet operators call the effective training time ratio, ETTR).

Bucket by bucket (10 s while kept, else 5 minutes), each GPU's time goes to one cause, in this
precedence: hung (a `hung` flag's span: every GPU the job holds, reporting or not), start-up (before
the first step; without steps, before the first three minutes in which most GPUs worked: a short GPU
check before a long load is start-up), then its idle share to input stalls (an `input_bound` flag's
span) or idle; the rest is work: checkpoints or evaluation within the job's own phases, else
productive, or, for a job that sends steps, "no progress" where no step came for a while
(`PATIENCE`). A phase name moves time between the kinds of work only, never out of idle. A job that
ends FAILED, NODE_FAIL or TIMEOUT loses the work since its last completed checkpoint, phases
included. GPU-time no sample covers (a node that fell silent) is "not measured"; the buckets are
the stored samples' whether or not the leader has folded them yet (`job_timeline.read`), so the
same rows give the same figures at any moment. Jobs that send steps are judged from
them (``basis``); others from GPU activity, and say so. The scheduler's time is apart, neither
badput nor productive (`SCHEDULER`): the stretches Slurm held the job suspended, and the work a run
requeued or preempted lost since its last checkpoint; the productive share (ETTR) is of the rest.
A requeued job's runs are each computed over their own span (`report.text.gather`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from jobpulse.collector.rules.registry import HUNG, INPUT_BOUND
from jobpulse.collector.store.read.job_timeline import Parts
from jobpulse.schema.semantics import phase_kind

CAUSES = ("start-up", "idle", "input stalls", "no progress", "checkpoints", "evaluation", HUNG,
          "lost to failure", "not measured")
"""Badput by cause, in the order reports list them."""
FAILED = ("FAILED", "NODE_FAIL", "TIMEOUT")
"""End states that lose what a job did since its last checkpoint."""
SCHEDULER = ("suspended", "requeued")
"""The scheduler's time, neither the job's waste nor its work: suspended (Slurm held the job, its
processes stopped), and the work since the last checkpoint of a run Slurm requeued (preempted, or
requeued by an admin) or preempted."""
REQUEUED = ("REQUEUED", "PREEMPTED")
"""End states of a run the scheduler took away."""
LONG_START = timedelta(minutes=10)
"""A start-up this long is told as such, with advice (not as low use)."""


SUSTAINED = timedelta(minutes=3)
"""Work that lasts this long ends the start-up (a short GPU check before a long load does not)."""


def _sustained(parts: Parts, end: datetime) -> datetime:
    """The start of the first stretch of SUSTAINED in which most of the reporting GPUs worked bucket
    after bucket, or of a stretch of work that lasts to the job's last sample (a short job that works
    from its start is work, not start-up); the job's end where there is none."""
    since: datetime | None = None
    for b in parts.buckets:
        if b.gpus - b.idle < b.gpus / 2:
            since = None
            continue
        since = since or b.start
        if b.start + timedelta(seconds=b.width_s) - since >= SUSTAINED:
            return since
    return since or end


PATIENCE = 3
"""Without a step for this many typical gaps between steps (and at least 3 minutes) either side, a
working GPU of a job that sends steps makes no progress."""


def _progress(parts: Parts) -> list[tuple[datetime, datetime]]:
    """The spans a job that sends steps made progress in: around each minute with a step, PATIENCE
    times its typical gap between steps (the median) either side."""
    minutes = parts.step_minutes
    gaps = sorted((b - a).total_seconds() for a, b in zip(minutes, minutes[1:], strict=False))
    typical = gaps[len(gaps) // 2] if gaps else 60.0
    reach = timedelta(seconds=max(PATIENCE * typical, 180.0))
    return [(m - reach, m + timedelta(minutes=1) + reach) for m in minutes]


def _spans(intervals: list[tuple[datetime, datetime]], t: datetime) -> bool:
    return any(a <= t < b for a, b in intervals)


def compute(job: dict[str, Any], flags: list[dict[str, Any]], parts: Parts, start: datetime, end: datetime,
            allocated_gpu_hours: float) -> dict[str, Any]:
    """The job's goodput: GPU-hours productive and by cause, summing to ``allocated_gpu_hours``."""
    held = max(int(job.get("gpus_total") or 0), max((b.gpus for b in parts.buckets), default=0), 1)
    spans = {cause: [(s, e or end) for name, s, e in parts.phases if phase_kind(name) == cause]
             for cause in ("checkpoints", "evaluation")}
    hung = [(f["started_at"], f["ended_at"] or end) for f in flags if f["rule_id"] == HUNG]
    stalls = [(f["started_at"], f["ended_at"] or end) for f in flags if f["rule_id"] == INPUT_BOUND]
    basis = "steps" if parts.first_step is not None else "GPU activity"
    working = parts.first_step or _sustained(parts, end)
    progress = _progress(parts) if parts.step_minutes else None
    seconds = dict.fromkeys(("productive", *CAUSES, *SCHEDULER), 0.0)
    productive_at: list[tuple[datetime, str, float]] = []  # when, which kind of work, GPU-seconds
    for a, b in parts.suspended:  # every GPU the job holds: the scheduler's, whatever the GPUs did
        seconds["suspended"] += held * max((min(b, end) - max(a, start)).total_seconds(), 0.0)
    hung = [(a, b) for a, b in hung if not any(x <= a and b <= y for x, y in parts.suspended)]
    for a, b in hung:  # every GPU the job holds, reporting or not
        seconds[HUNG] += held * max((min(b, end) - max(a, start)).total_seconds(), 0.0)
    for k in parts.buckets:
        lo, hi = max(k.start, start), min(k.start + timedelta(seconds=k.width_s), end)
        if hi <= lo:
            continue
        mid, span = lo + (hi - lo) / 2, (hi - lo).total_seconds()
        gpus = min(k.gpus, held)
        share = gpus / k.gpus
        if _spans(hung, mid) or _spans(parts.suspended, mid):
            continue
        if mid < working:
            seconds["start-up"] += gpus * span
            continue
        # The job's own phase names move working time between the kinds of work only: its idle share
        # stays idle, and what it did after its last checkpoint is lost if it fails.
        idle = k.idle * share * span
        seconds["input stalls" if _spans(stalls, mid) else "idle"] += idle
        kind = next((c for c in ("checkpoints", "evaluation") if _spans(spans[c], mid)), "productive")
        if kind == "productive" and progress is not None and not _spans(progress, mid):  # working, no step came
            seconds["no progress"] += gpus * span - idle
            continue
        seconds[kind] += gpus * span - idle
        productive_at.append((mid, kind, gpus * span - idle))
    lost_note = None
    if (job.get("state") or "") in REQUEUED:  # the scheduler took the run away: its work since the checkpoint
        saved = max((e for name, _, e in parts.phases if e is not None and phase_kind(name) == "checkpoints"), default=None)
        for t, kind, worked in productive_at:
            if saved is None or t > saved:
                seconds[kind] -= worked
                seconds["requeued"] += worked
    elif (job.get("state") or "") in FAILED:
        saved = max((e for name, _, e in parts.phases if e is not None and phase_kind(name) == "checkpoints"), default=None)
        if saved is not None or parts.events:
            for t, kind, worked in productive_at:
                if saved is None or t > saved:
                    seconds[kind] -= worked
                    seconds["lost to failure"] += worked
            lost_note = ("since its last checkpoint" if saved else "no checkpoint was seen: everything") + \
                f" ({job['state']})"
        else:
            lost_note = f"not known ({job['state']}; the job sends no checkpoint events)"
    total = allocated_gpu_hours * 3600
    measured = sum(seconds.values())
    exact = seconds["suspended"]  # from Slurm's own times, not from buckets
    if measured > total > exact:  # buckets reach past the allocation's edges by rounding: scale them down
        seconds = {k: v if k == "suspended" else v * (total - exact) / (measured - exact) for k, v in seconds.items()}
    seconds["not measured"] += max(total - sum(seconds.values()), 0.0)
    hours = {k: v / 3600 for k, v in seconds.items()}
    startup_min = (working - start).total_seconds() / 60 if working > start else 0.0
    own = allocated_gpu_hours - sum(hours[c] for c in SCHEDULER)  # the job's own time: ETTR's whole
    out: dict[str, Any] = {
        "basis": basis, "allocated_gpu_hours": allocated_gpu_hours, "productive_gpu_hours": hours["productive"],
        "ettr": hours["productive"] / own if own > 0 else None,
        "badput_gpu_hours": {c: hours[c] for c in CAUSES if hours[c] > 0},
        "scheduler_gpu_hours": {c: hours[c] for c in SCHEDULER if hours[c] > 0},
        "startup_minutes": round(startup_min, 1),
    }
    if lost_note:
        out["lost_to_failure"] = lost_note
    if working - start >= LONG_START and hours["start-up"] > 0:
        out["advice"] = (f"start-up held {held} GPU{'s' * (held > 1)} idle for {startup_min:.0f} min before the "
                         f"first {'step' if basis == 'steps' else 'work'}: stage the checkpoint and data on local disk "
                         "(or load once per node and broadcast), and run any GPU check inside the job's first minute")
    return out


def line(g: dict[str, Any]) -> str:
    """Goodput in one line: the productive share and the badput by cause, in GPU-hours."""
    causes = ", ".join(f"{c} {h:.2f}" for c, h in sorted(g["badput_gpu_hours"].items(), key=lambda kv: -kv[1])
                       if h >= 0.005)
    share = f"{g['ettr']:.0%}" if g["ettr"] is not None else "n/a"
    theirs = ", ".join(f"{c} {h:.2f}" for c, h in g.get("scheduler_gpu_hours", {}).items() if h >= 0.005)
    own = g["allocated_gpu_hours"] - sum(g.get("scheduler_gpu_hours", {}).values())
    return (f"Goodput: {share} of {own:.2f} GPU-hours productive (from {g['basis']})"
            + (f"; badput: {causes}" if causes else "") + (f"; the scheduler's, apart: {theirs}" if theirs else ""))
