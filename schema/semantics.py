"""Shared meanings: what idle, busy, activity and hardware throttling mean, and interval bounds.

Agent checks, collector roll-ups, rules, reports and dashboards all import these, so "idle" is one
number everywhere and "activity" is one formula.
"""

from __future__ import annotations

IDLE_PERCENT = 5
"""A GPU at or below this activity (percent) is idle: nothing but a keep-alive runs on it. Not 0,
because drivers and monitoring touch GPUs; not 2, because a process that holds its memory and runs
a tiny kernel now and then (a keep-alive, a polling loop, a waiting NCCL rank) shows 1-4 % on real
cards and is idle in any practical sense; a job doing real work, even badly, is far above it."""

BUSY_PERCENT = 50
"""A GPU at or above this activity (percent) is busy: a training step is running."""

HW_SLOWDOWN_BITS = 0x8 | 0x40 | 0x80
"""NVML clock event reasons that are the hardware's fault: HW slowdown, HW thermal slowdown, HW power
brake (`nvmlClocksEventReasonHwSlowdown`, `...HwThermalSlowdown`, `...HwPowerBrakeSlowdown`)."""

APPLICATION_XIDS: dict[int, str] = {
    13: "graphics engine exception (an illegal instruction or out-of-range access in a kernel)",
    31: "GPU memory page fault (a kernel read or wrote memory it does not own)",
    43: "GPU stopped processing (the application's kernel faulted)",
    45: "preemptive cleanup after an earlier error of the application",
}
"""XIDs NVIDIA's catalogue attributes to the application: the job's code, not the node. Every other
XID (48 double-bit ECC, 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92/94/95 ECC,
119/120 GSP, ...) is the node's hardware or driver."""

INTERVAL_MIN_S = 0.1
INTERVAL_MAX_S = 3600.0
"""Sampling intervals an agent accepts (command line, per-job `#SBATCH` hint, control message)."""


def check_interval(seconds: float) -> float:
    """The interval, or ValueError naming the bounds (NaN and infinities included)."""
    if not INTERVAL_MIN_S <= seconds <= INTERVAL_MAX_S:
        raise ValueError(f"interval must be between {INTERVAL_MIN_S} and {INTERVAL_MAX_S:g} seconds, got {seconds}")
    return seconds


def activity_sql(sm_active: str = "gpm_sm_active", sm_util: str = "sm_util") -> str:
    """Activity of one sample in SQL: SM activity where GPM measured it (the truth), else duty cycle."""
    return f"coalesce({sm_active}, {sm_util})"


def activity_bucket_sql(prefix: str = "") -> str:
    """Mean activity of one roll-up row (plain SQL): GPM sum over GPM samples, else duty cycle."""
    p = prefix
    return f"coalesce({p}sum_sm_active / nullif({p}n_gpm, 0), {p}sum_sm_util / nullif({p}n, 0))"


def activity_mean_sql(prefix: str = "") -> str:
    """Mean activity over roll-up rows (aggregate SQL): GPM sums divide by the GPM sample count,
    duty-cycle sums by the sample count. ``prefix`` qualifies the columns (e.g. ``"r."``)."""
    p = prefix
    return (f"coalesce(sum({p}sum_sm_active) / nullif(sum({p}n_gpm), 0),"
            f" sum({p}sum_sm_util) / nullif(sum({p}n), 0))")


def phase_kind(name: str) -> str | None:
    """What an application phase is by its name: "checkpoints" (checkpoint, ckpt, save...),
    "evaluation" (eval, valid...) or None (training or anything else). A job's other ranks may wait
    in a barrier through either, and neither is training: the hang rule and goodput read it here."""
    low = name.lower()
    if "ckpt" in low or "checkpoint" in low or low.startswith("save"):
        return "checkpoints"
    if "eval" in low or "valid" in low:
        return "evaluation"
    return None
