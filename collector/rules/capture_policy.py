"""Which flags ask their job for evidence: a flag that says a rank's GPU waits (`input_bound`,
`low_utilization`, `imbalance`) asks the rank's node agent to sample the Python stacks of the rank's
main process and its data-loader workers for a few seconds (agent/capture/stacks.py), so the flag can say
where the time went, not only that it was lost. Where the job allowed it, the rank's in-job client is
also asked for a profiler trace of a few steps (agent/capture/trace.py): where the GPU time went.

Bounded by construction: one capture of each kind per flag (the table's unique key), a site-wide number
per hour of each,
none for a job that opted out (`capture=off` in its comment) or for a flag whose rank has no process
seen; a capture its agent does not answer fails with that reason and leaves the flag as it was."""

from __future__ import annotations

from typing import Any

import psycopg
import structlog

from jobpulse.collector.settings import CapturePolicy
from jobpulse.collector.store.state import captures

log = structlog.get_logger("jobpulse.collector.captures")
RULES = ("input_bound", "low_utilization", "imbalance")


def _where(flag: dict[str, Any]) -> tuple[str, str | None, int | None]:
    """(node, GPU uuid, pid) the flag names: scope keys are NODE/GPU-UUID or NODE/pidPID; a job-wide
    flag of one cause on several GPUs (`rules.causes.job_wide`) is asked of its first GPU's rank."""
    evidence = flag["evidence"] if isinstance(flag["evidence"], dict) else {}
    key = flag["scope_key"]
    if flag["scope"] == "job":
        gpus, per_gpu = evidence.get("gpus") or [""], evidence.get("per_gpu") or [{}]
        key, evidence = str(gpus[0]), per_gpu[0] if isinstance(per_gpu[0], dict) else {}
    node, _, rest = key.partition("/")
    if flag["scope"] == "rank" and rest.startswith("pid") and rest[3:].isdigit():
        return node, None, int(rest[3:])
    pid = evidence.get("pid")
    return node, rest or None, pid if isinstance(pid, int) else None


def ask_for_new_flags(conn: psycopg.Connection[Any], policy: CapturePolicy) -> int:
    """Captures (stacks, and traces where the job allowed them) for the flags opened since the last
    cycle, within the site's hourly numbers; returns how many were asked for."""
    captures.expire(conn, policy.answer_s)  # (also when captures were just turned off)
    asked = _ask(conn, "stacks", policy.per_hour, policy.seconds)
    return asked + _ask(conn, "trace", policy.traces_per_hour, policy.trace_wait_s, policy.trace_steps,
                        policy.trace_max_bytes)


def _ask(conn: psycopg.Connection[Any], kind: str, per_hour: int, seconds: float, steps: int = 0,
         max_bytes: int = 0) -> int:
    if per_hour <= 0:
        return 0
    room = per_hour - captures.asked_since(conn, 1.0, kind)
    asked = 0
    for flag in captures.new_flags(conn, RULES, kind):
        if asked >= room:
            log.info("capture rate reached: flags left without evidence", kind=kind, per_hour=per_hour)
            break
        node, gpu, pid = _where(flag)
        pids = captures.rank_pids(conn, flag["cluster"], flag["job_id"], node, gpu, pid)
        if not pids:
            captures.refuse(conn, flag, node, "no process of this rank seen on its node in the last ten minutes", kind)
            continue
        if captures.ask(conn, flag, node, pids, seconds, kind, steps, max_bytes):
            asked += 1
    return asked
