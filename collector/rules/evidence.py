"""When a rule may decide: one evidence rule for every mean, and the run length for idleness.

A mean is judged over a *trailing stretch* of whole blocks (minutes by default) after the GPU's
warm-up: the longest stretch ending now whose confidence bound (mean +- z standard errors of its
block means) lies on the flagged side of the threshold, and at least ``evidence_minutes`` long. A
clear signal decides within minutes; a noisy one waits until it is clear; a job that changes its
behaviour is judged on what it does now; and the stretch's first block is when the condition began
(the flag's "since").

Idleness is the share of samples idle over a trailing stretch, not the time since the last busy
sample, so a burst of a few seconds every few minutes does not reset it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar, cast

from jobpulse.collector.rules.model import Block, GpuStats, JobView, Read, Settings, SettingsOf
from jobpulse.schema.semantics import BUSY_PERCENT

R = TypeVar("R")


class _Memoed(Protocol):
    @property
    def memo(self) -> dict[str, tuple[Settings, Any]]: ...


S = TypeVar("S", bound=_Memoed)


def _memoised(derive: Callable[[S, Settings], R]) -> Callable[[S, Settings], R]:
    """Derive once per subject (a GPU's stats, a job's view) and thresholds: several rules ask for
    the same thing in one cycle. The memo keeps the thresholds it was derived under, so their
    identity cannot be reused."""
    @functools.wraps(derive)
    def derived(subject: S, t: Settings) -> R:
        found = subject.memo.get(derive.__qualname__)
        if found is None or found[0] is not t:
            found = subject.memo[derive.__qualname__] = (t, derive(subject, t))
        return found[1]
    return derived


per_gpu = _memoised
"""What a rule derives from one GPU's stats."""
per_job = _memoised
"""What a family derives from a job's view once every read has landed (its rules then share it: a
family is judged once a job and cycle)."""


def working_level(job: JobView) -> float | None:
    """The power the job's GPUs draw when they work: the highest of its GPUs' median power over their
    busy blocks (one straggler among 23 waiting GPUs still sets it; None: power not measured, or no
    GPU with 3 busy blocks)."""
    levels = []
    for g in job.gpus:
        drawn = sorted(m.power for m in g.full_blocks
                       if m.power is not None and m.act is not None and m.act >= BUSY_PERCENT)
        if len(drawn) >= 3:
            levels.append(drawn[len(drawn) // 2])
    return max(levels, default=None)


def spins(duty: float | None, power: float | None, t: Settings, level: float | None,
          busy: float = BUSY_PERCENT) -> bool:
    """A block busy by its duty cycle (``busy`` percent or more) that draws under ``hang_power_share``
    of the job's working ``level``: a kernel resident and waiting, no work (a rank spinning in a
    collective for a straggler, the survivors of a failed rank). Without a level only the look
    decides. The one definition of spinning: the hang and the usage rules both ask it."""
    return (duty is not None and duty >= busy and power is not None
            and (level is None or power < t["hang_power_share"] * level))


@dataclass(frozen=True)
class Stretch:
    """Trailing blocks of one GPU and what a value did over them."""

    blocks: tuple[Block, ...]
    mean: float
    low: float  # lower confidence bound of the mean
    high: float  # upper confidence bound

    @property
    def since(self) -> datetime:
        return self.blocks[0].start

    @property
    def starts(self) -> list[datetime]:
        return [m.start for m in self.blocks]

    @property
    def idle_share(self) -> float:
        return idle_share(self.blocks)

    @property
    def busy_share(self) -> float:
        n = sum(m.n for m in self.blocks)
        return sum(m.busy for m in self.blocks) / n if n else 0.0


def idle_share(blocks: Sequence[Block]) -> float:
    n = sum(b.n for b in blocks)
    return sum(b.idle for b in blocks) / n if n else 0.0


FILLED, RELEASED = 0.9, 0.1
"""Shares of the GPU's peak memory: at FILLED the model is loaded; below RELEASED after that, the
rank's process has gone (crashed, restarted) and the next load is a warm-up again."""


def warmup_start(g: GpuStats) -> datetime:
    """When the current run on this GPU began: the job's start, or the first block after the GPU's
    memory was released once it had been filled (a rank restarted by its launcher)."""
    start, peak, filled = g.start, g.peak_mem_mib, False
    for m in g.blocks:
        if not peak or m.fb_max is None:
            continue
        if m.fb_max >= FILLED * peak:
            filled = True
        elif filled and m.fb_max < RELEASED * peak:
            start, filled = m.start, False
    return start


@per_gpu
def warmup_end(g: GpuStats, t: Settings) -> datetime:
    """The end of the warm-up on this GPU: ``warmup_minutes`` after its run started, longer while
    GPU memory still grows toward its peak (loading a model, compiling, filling caches), never
    longer than ``warmup_max_minutes``."""
    start = warmup_start(g)
    end = start + timedelta(minutes=t["warmup_minutes"])
    peak = g.peak_mem_mib
    if peak:
        filled = next((m.start for m in g.blocks if m.start >= start and (m.fb_max or 0) >= FILLED * peak), None)
        if filled is not None:
            end = max(end, filled)
    return min(end, start + timedelta(minutes=t["warmup_max_minutes"]))


@per_gpu
def judged_blocks(g: GpuStats, t: Settings) -> tuple[Block, ...]:
    """The blocks means are judged on: whole, after warm-up, within the last ``window_minutes``."""
    after = max(warmup_end(g, t), g.last_ts - timedelta(minutes=t["window_minutes"]))
    return tuple(m for m in g.full_blocks if m.start >= after)


def bound(values: Sequence[float], weights: Sequence[int], z: float) -> tuple[float, float, float]:
    """Weighted mean of block values and its confidence bounds (z standard errors of the block
    means); one block has no spread to judge, so its bounds are unbounded. Plain floats: the
    standard library's stdev computes in exact fractions, which cost most of a cycle over
    thousands of GPUs."""
    mean = sum(v * w for v, w in zip(values, weights, strict=True)) / sum(weights)
    k = len(values)
    if k < 2:
        return mean, -math.inf, math.inf
    plain = math.fsum(values) / k
    sd = math.sqrt(math.fsum((v - plain) ** 2 for v in values) / (k - 1))
    half = z * sd / math.sqrt(k)
    return mean, mean - half, mean + half


def min_blocks(t: Settings) -> int:
    """How many blocks make ``evidence_minutes``."""
    need: int = max(math.ceil(t["evidence_minutes"] * 60 / t["evidence_block_seconds"] - 1e-9), 1)
    return need


def trailing(blocks: Sequence[Block], value: Callable[[Block], float | None], t: Settings, *,
             below: float | None = None, at_least: float | None = None) -> Stretch | None:
    """The longest trailing stretch of ``evidence_minutes`` or more whose mean of ``value`` is
    surely below ``below`` (upper bound under it) or surely at least ``at_least`` (lower bound at
    or over it). A block without a value ends the stretch. The stretch must hold
    ``evidence_minutes`` of samples: the newest block, still filling, is not a whole one. It begins
    with a block on the flagged side: a strong signal would otherwise carry the bound back over
    the last blocks before the change, and the flag's "since" (and what else is judged over the
    stretch, such as the loader workers' CPU) would reach into a time the condition did not hold."""
    read = list(map(value, blocks))
    if None in read:  # the stretch starts after the newest block without a value
        first = len(read) - read[::-1].index(None)
        blocks, read = blocks[first:], read[first:]
    values = cast("list[float]", read)  # no None left: the stretch starts after the last one
    if not values:
        return None

    def holds(v: float) -> bool:
        return (below is None or v < below) and (at_least is None or v >= at_least)

    # A mean lies between its values: with no block on the flagged side no stretch can hold (most
    # GPUs, for most rules), so the pass below is spent only where one may (builtins, not a loop:
    # a cycle asks this of every GPU for every rule).
    if ((below is not None and min(values) >= below) or (at_least is not None and max(values) < at_least)
            or (below is not None and at_least is not None and not any(map(holds, values)))):
        return None
    tail = list(zip(blocks, values))
    z, need = t["evidence_z"], min_blocks(t)
    enough = 0.9 * need * max((m.n for m, _ in tail), default=0)

    # One pass back from the newest block with running sums (Welford for the spread of the block
    # means): every candidate stretch is judged in constant time, so a cycle stays linear in blocks.
    longest, samples, weighted, plain, m2 = 0, 0, 0.0, 0.0, 0.0
    for k in range(1, len(tail) + 1):
        m, v = tail[-k]
        samples, weighted = samples + m.n, weighted + m.n * v
        d = v - plain
        plain += d / k
        m2 += d * (v - plain)
        if k < need or samples < enough or not samples:
            continue
        mean = weighted / samples
        half = z * math.sqrt(m2 / (k - 1) / k) if k > 1 else math.inf
        if (below is None or mean + half < below) and (at_least is None or mean - half >= at_least):
            longest = k
    if not longest:
        return None
    part = tail[-longest:]
    rest = sum(m.n for m, _ in part)
    while len(part) > need and not holds(part[0][1]) and rest - part[0][0].n >= enough:
        rest -= part[0][0].n
        part = part[1:]
    return Stretch(tuple(m for m, _ in part), *bound([v for _, v in part], [m.n for m, _ in part], z))


@per_gpu
def idle_stretch(g: GpuStats, t: Settings) -> tuple[datetime, float] | None:
    """When the GPU's current idleness began and how idle it has been since (share of samples): the
    start of the longest trailing stretch of blocks whose samples are at least ``idle_share`` idle;
    a stretch that reaches back past the look-back continues from ``idle_before``. None: not idle,
    or not now (the newest block at most half idle: the GPU has started working).
    The first block begins at its first sample, not at its aligned start: a GPU seen for one second
    of a block has not been idle for the whole block."""
    if not g.blocks or g.blocks[-1].idle * 2 < g.blocks[-1].n:
        return None  # working now: a flag raised now would be about a time that has ended
    best, n, idle = None, 0, 0
    for m in reversed(g.blocks):  # one pass back, with running counts
        n, idle = n + m.n, idle + m.idle
        if n and idle / n >= t["idle_share"]:
            best = (m.start, idle / n)
    if best is None or best[0] != g.blocks[0].start:
        return best
    if g.idle_before is not None:
        return min(best[0], g.idle_before), best[1]
    return max(best[0], g.first_ts), best[1]


@per_gpu
def idling(g: GpuStats, t: Settings) -> bool:
    """The GPU has been idle for evidence_minutes or more: the idle rule's to judge (a busy minute
    before the idling must not turn it into a low mean)."""
    found = idle_stretch(g, t)
    return found is not None and g.last_ts - found[0] >= timedelta(minutes=t["evidence_minutes"])


def _idle_long(job: JobView, settings_of: SettingsOf) -> list[tuple[str, str, datetime, float]]:
    """The GPUs idle for idle_minutes or more, whose history is read: ``(node, uuid, start of its
    window, its idle_share)``."""
    asked = []
    for g in job.gpus:
        t = settings_of(g)
        found = idle_stretch(g, t)
        if found and g.last_ts - found[0] >= timedelta(minutes=t["idle_minutes"]):
            asked.append((g.node, g.gpu_uuid, g.blocks[0].start, t["idle_share"]))
    return asked


IDLE_HISTORY = Read("history", _idle_long)
"""Was an idle GPU ever busy since its job started (over-allocation), and since when has it been idle
(an idle stretch older than the window): read for the GPUs idle for idle_minutes."""
