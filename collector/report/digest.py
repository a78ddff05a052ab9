"""Digest: a week (or any period) of ended jobs per user, account or partition -- GPU-hours used and
wasted by cause, goodput (productive share, badput by cause), the jobs that wasted most, the trend against the period before -- and, for the
admins, GPUs held idle in a partition while jobs waited there for GPUs, and hardware trouble per node with a drain suggestion. Read from the job summaries, so it
answers after raw samples are gone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg

from jobpulse.collector.report import idle_queue
from jobpulse.collector.report.summary import one_line
from jobpulse.collector.rules.registry import ECC_UNCORRECTABLE, GPU_LOST, XID_ERROR
from jobpulse.collector.store.read import queue_reads
from jobpulse.collector.store.state import summaries

DRAIN_RULES = (XID_ERROR, GPU_LOST, ECC_UNCORRECTABLE)
"""Hardware flags that make a node one to drain and inspect (the others: watch it)."""


def build(conn: psycopg.Connection[Any], by: str, since: timedelta, now: datetime,
          cluster: str | None = None) -> dict[str, Any]:
    """The digest of [now - since, now), with each group's share of GPU-hours used in the period
    before for the trend."""
    start, before = now - since, now - 2 * since
    groups = summaries.digest(conn, by, start, now, cluster)
    previous = {g["grp"]: g for g in summaries.digest(conn, by, before, start, cluster)}
    for g in groups:
        g["used_share"] = g["used"] / g["held"] if g["held"] else None
        p = previous.get(g["grp"])
        g["previous_used_share"] = p["used"] / p["held"] if p and p["held"] else None
    nodes: dict[tuple[str, str], dict[str, Any]] = {}
    for row in summaries.hardware(conn, start, now, cluster):
        n = nodes.setdefault((row["cluster"], row["node"]), {"cluster": row["cluster"], "node": row["node"],
                                                            "flags": {}, "jobs": 0, "drain": False})
        n["flags"][row["rule_id"]] = n["flags"].get(row["rule_id"], 0) + row["flags"]
        n["jobs"] += row["jobs"]
        n["drain"] = n["drain"] or row["rule_id"] in DRAIN_RULES
    return {"by": by, "start": start.isoformat(), "end": now.isoformat(), "cluster": cluster, "groups": groups,
            "hardware": list(nodes.values()), "idle_queue": queue_reads.idle_while_waiting(conn, start, now, cluster)}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def group_text(d: dict[str, Any], g: dict[str, Any]) -> list[str]:
    """One group's lines (what a user's own digest mail holds)."""
    trend = ""
    if g["used_share"] is not None and g["previous_used_share"] is not None:
        points = round((g["used_share"] - g["previous_used_share"]) * 100)
        trend = f", {points:+d} points on the period before"
    causes = ", ".join(f"{cause} {hours:.1f}" for cause, hours in sorted(g["wasted"].items(), key=lambda kv: -kv[1]))
    lines = [f"{d['by']} {one_line(g['grp'])}: {g['jobs']} jobs, {g['held']:.1f} GPU-hours held, {g['used']:.1f} used "
             f"({_pct(g['used_share'])}{trend})" + (f"; wasted {g['wasted_total']:.1f}: {causes}" if causes else "")]
    if g.get("goodput_held"):
        badput = ", ".join(f"{cause} {hours:.1f}" for cause, hours in sorted(g["badput"].items(), key=lambda kv: -kv[1])
                           if hours >= 0.05)
        lines.append(f"    goodput {_pct(g['productive'] / g['goodput_held'])} of {g['goodput_held']:.1f} GPU-hours "
                     "productive" + (f"; badput: {badput}" if badput else ""))
    if g.get("advised_runs"):
        lines.append(f"    advice from a previous run followed in {g['followed_runs']} of {g['advised_runs']} runs"
                     + (f", {g['gpu_hours_saved']:.2f} GPU-hours saved" if g["gpu_hours_saved"] else ""))
    for w in g["worst"]:
        lines.append(f"    job {w['job_id']} ({one_line(w['name'] or '')[:60]}) wasted {w['wasted']:.1f} GPU-hours: "
                     f"jobpulse summary {w['job_id']} --cluster {w['cluster']}")
    return lines


def text(d: dict[str, Any], top: int = 20) -> str:
    period = f"{d['start'][:16]} .. {d['end'][:16]} UTC" + (f", cluster {d['cluster']}" if d["cluster"] else "")
    lines = [f"jobpulse digest by {d['by']}, {period}"]
    if not d["groups"]:
        lines.append("  no job ended in this period")
    for g in d["groups"][:top]:
        lines += ["  " + x for x in group_text(d, g)]
    if len(d["groups"]) > top:
        lines.append(f"  ... and {len(d['groups']) - top} more {d['by']}s")
    return "\n".join([*lines, "", *idle_queue.lines(d["idle_queue"]), "", *hardware_text(d)])


def hardware_text(d: dict[str, Any]) -> list[str]:
    """Hardware trouble per node, with a drain command where a flag makes the node suspect (the
    admins' digest)."""
    lines = ["Hardware trouble per node:" if d["hardware"] else "Hardware trouble per node: none"]
    for n in d["hardware"]:
        flags = ", ".join(f"{rule} x{count}" for rule, count in sorted(n["flags"].items()))
        lines.append(f"  {n['cluster']}/{n['node']}: {flags} ({n['jobs']} jobs)")
        if n["drain"]:
            reason = f"jobpulse: {flags}"[:60]
            lines.append(f"    drain: scontrol update NodeName={n['node']} State=DRAIN Reason=\"{reason}\"")
    return lines
