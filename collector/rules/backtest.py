"""Replay the rules over stored history as if they had run live: cycle by cycle at a simulated
clock, with the same statistics, registry and flag lifecycle (a hit opens or keeps a flag, a cycle
without it closes it, a job's end closes its flags). Admins tune thresholds on last week's jobs
with it; the tests judge labelled scenarios in seconds instead of real time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from jobpulse.collector.rules import inputs
from jobpulse.collector.rules.causes import job_wide
from jobpulse.collector.rules.engine import judge, read_jobs
from jobpulse.collector.rules.registry import JOB_WIDE, cause_of
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.read import rule_reads
from jobpulse.collector.store.state.flags import Hit

FlagKey = tuple[str, str, str, str, str]  # cluster, job, cause (its kinds joined by |), scope, scope_key


@dataclass
class ReplayedFlag:
    """A flag the rules would have raised: when first, for how long, and its last evidence."""

    cluster: str
    job_id: str
    rule_id: str
    severity: str
    category: str
    scope: str
    scope_key: str
    started_at: datetime  # when the evidence says the condition began
    raised_at: datetime  # the first cycle that raised it
    last_hit: datetime  # the last cycle that raised it
    closed_at: datetime | None = None
    cycles: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)
    advice: str = ""
    kinds: list[str] = field(default_factory=list)  # every kind it took, in order (low use, then idle)
    kind_raised: dict[str, datetime] = field(default_factory=dict)  # kind -> the first cycle it took it
    # (a stall noted, then hung: when it became a hang)

    def as_json(self) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            return v.isoformat() if isinstance(v, datetime) else v
        return {k: plain(v) for k, v in self.__dict__.items()}


def cycle_times(start: datetime, end: datetime, step: timedelta) -> Iterator[datetime]:
    t = start
    while t <= end:
        yield t
        t += step


def replay(conn: psycopg.Connection[Any], thresholds: Thresholds, start: datetime, end: datetime,
           step: timedelta, cluster: str | None = None, job: str | None = None) -> list[ReplayedFlag]:
    """Every flag the rules would have raised between ``start`` and ``end`` (a cycle every ``step``),
    with the live lifecycle (`store.flags.write`): one flag per cause and place, whose kind follows
    the latest hit, reopened where the cause returns."""
    rule_reads.start_cycle(conn)
    if job is None:
        return _replay(conn, thresholds, start, end, step, cluster, job)
    # One job's reads are small: planning them again each cycle (PostgreSQL prunes partitions at plan
    # time) costs more than running them; a whole cluster's replay reads enough that per-cycle plans
    # pay (`jobpulse rules backtest` times both).
    with rule_reads.planned_once(conn):
        return _replay(conn, thresholds, start, end, step, cluster, job)


def _replay(conn: psycopg.Connection[Any], thresholds: Thresholds, start: datetime, end: datetime,
            step: timedelta, cluster: str | None, job: str | None) -> list[ReplayedFlag]:
    flags: dict[FlagKey, ReplayedFlag] = {}  # by cause: the newest flag of each, open or closed
    # Each cycle reads only what the last one could not know yet, as live cycles do: the blocks and
    # process minutes before a GPU's newest sample less SETTLE are whole in stored data too.
    kept = inputs.Blocks()
    for now in cycle_times(start, end, step):
        views = read_jobs(conn, thresholds, now, kept, replay=True, cluster=cluster, job=job)
        open_wide: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        for f in flags.values():
            if f.closed_at is None and f.scope == "job" and f.rule_id in JOB_WIDE:
                open_wide.setdefault((f.cluster, f.job_id), {})[f.rule_id] = f.evidence
        hits: dict[FlagKey, Hit] = {}
        for (c, j), view in views.items():
            for h in job_wide.carry_on(judge(view, thresholds), open_wide.get((c, j), {})):
                hits[(c, j, "|".join(cause_of(h.rule_id)), h.scope, h.scope_key)] = h
        running = set(views)
        for key, stale in flags.items():
            if key in hits or stale.closed_at is not None:
                continue
            ended = (key[0], key[1]) not in running
            if ended or now - stale.last_hit > thresholds.flag_hold:  # stopped holding, or the job ended
                stale.closed_at = now if ended else stale.last_hit
        for key, h in hits.items():
            if h.scope == "job" and isinstance(h.evidence.get("gpus"), list):
                _absorb(flags, key, h.evidence["gpus"])
            flag = flags.get(key)
            if flag is None:
                flag = flags[key] = ReplayedFlag(key[0], key[1], h.rule_id, h.severity, h.category, h.scope,
                                                 h.scope_key, h.started_at, now, now)
            flag.cycles += 1
            flag.last_hit, flag.closed_at = now, None
            flag.rule_id, flag.severity, flag.category = h.rule_id, h.severity, h.category
            if h.rule_id not in flag.kinds:
                flag.kinds.append(h.rule_id)
                flag.kind_raised[h.rule_id] = now
            flag.evidence, flag.advice = h.evidence, h.advice
    return sorted(flags.values(), key=lambda f: (f.cluster, f.job_id, f.raised_at, f.rule_id))


def _absorb(flags: dict[FlagKey, ReplayedFlag], key: FlagKey, gpus: list[str]) -> None:
    """A job-wide hit takes over the open per-GPU flags of its cause on its GPUs, as the live store does
    (`store.state.flags.write`): the oldest becomes the job-wide flag where the job has none of that
    cause yet, the others go."""
    c, j, cause, scope, scope_key = key
    taken = sorted((k for k in {(c, j, cause, "gpu", g) for g in gpus} if k in flags and flags[k].closed_at is None),
                   key=lambda k: (flags[k].raised_at, k))
    if taken and key not in flags:
        heir = flags.pop(taken.pop(0))
        heir.scope, heir.scope_key = scope, scope_key
        flags[key] = heir
    for k in taken:
        del flags[k]


def text(replayed: list[ReplayedFlag], stored: list[tuple[Any, ...]], start: datetime, end: datetime,
         evidence: dict[tuple[Any, ...], list[str]] | None = None) -> str:
    """The replay next to the live flags; ``evidence``: what the live flags' captures found, by flag key."""
    lines = [f"backtest {start.isoformat()} .. {end.isoformat()}: {len(replayed)} flags would have been raised"
             f" ({len(stored)} stored by the live rules in that range)", ""]
    stored_keys = {(c, j, r, s, k) for c, j, r, s, k, *_ in stored}
    lines.append(f"{'job':>10}  {'rule':18} {'where':28} {'raised':25} {'after onset':>11}  {'cycles':>6}  "
                 f"{'at end':6}  live")
    for f in replayed:
        delay = (f.raised_at - f.started_at).total_seconds()
        held = f"{f.cycles:6d}  {'open' if f.closed_at is None else 'closed':6}"
        live = "yes" if (f.cluster, f.job_id, f.rule_id, f.scope, f.scope_key) in stored_keys else "no"
        lines.append(f"{f.job_id:>10}  {f.rule_id:18} {f.scope_key or '(job)':28} {f.raised_at.isoformat():25} "
                     f"{delay:10.0f}s  {held}  {live}")
        lines += [f"{'':12}{line}" for line in (evidence or {}).get((f.cluster, f.job_id, f.rule_id, f.scope,
                                                                     f.scope_key), [])]
    missing = stored_keys - {(f.cluster, f.job_id, f.rule_id, f.scope, f.scope_key) for f in replayed}
    for c, j, r, sc, k in sorted(missing):
        lines.append(f"{j:>10}  {r:18} {k or '(job)':28} {'(stored, not replayed)':25}")
        lines += [f"{'':12}{line}" for line in (evidence or {}).get((c, j, r, sc, k), [])]
    return "\n".join(lines)
