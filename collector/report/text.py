"""Report: `jobpulse report JOBID` — one job at a glance, running or finished.

Header, then per node and GPU (utilization, SM activity, memory, power), per rank (CPU, GPU
memory), phases from the job's events, the flags with evidence and advice, and GPU-hours
used vs allocated. Text with bars for the terminal, or JSON for scripts.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import psycopg

from jobpulse.collector.report.terminal import printable
from jobpulse.collector.store import reports
from jobpulse.collector.store.reports import JobNotFound

__all__ = ["JobNotFound", "gather", "text", "usage"]


def gather(conn: psycopg.Connection[Any], job_id: str, cluster: str | None) -> dict[str, Any]:
    """The job's report data: what the store holds of it, and its GPU-hours used vs allocated."""
    data = reports.job(conn, job_id, cluster)
    return {**data, "usage": usage(data["job"], data["gpus"])}


def usage(job: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """GPU-hours allocated (GPUs x wall time) vs busy (each GPU's activity x the time it ran)."""
    start = job["start_time"] or min((g["first_ts"] for g in gpus), default=None)
    end = job["end_time"] or max((g["last_ts"] for g in gpus), default=None) or datetime.now(timezone.utc)
    hours = (end - start).total_seconds() / 3600 if start else 0.0
    allocated = hours * max(len(gpus), job["gpus_total"] or 0)
    busy = sum(((g["sm_active"] if g["sm_active"] is not None else g["util"] or 0) / 100)
               * (g["last_ts"] - g["first_ts"]).total_seconds() / 3600 for g in gpus)
    return {"wall_hours": round(hours, 3), "gpu_hours_allocated": round(allocated, 3),
            "gpu_hours_busy": round(busy, 3), "efficiency": round(busy / allocated, 3) if allocated else None}


def bar(percent: float | None, width: int = 20) -> str:
    if percent is None:
        return " " * width + "   n/a"
    filled = round(max(0.0, min(100.0, percent)) / 100 * width)
    return "█" * filled + "░" * (width - filled) + f" {percent:5.1f}%"


def text(r: dict[str, Any]) -> str:
    j, u = r["job"], r["usage"]
    state = j["state"] or ("RUNNING" if j["end_time"] is None else "ENDED")
    lines = [f"Job {j['job_id']} ({j['cluster']})  {j['job_name'] or ''}".rstrip(),
             f"  user {j['user_name'] or '?'}  account {j['account'] or '-'}  partition {j['partition'] or '-'}"
             f"  state {state}" + (f"  exit {j['exit_code']}" if j["exit_code"] is not None else ""),
             f"  nodes {', '.join(j['nodes'] or sorted({g['node'] for g in r['gpus']}))}  GPUs {len(r['gpus'])}"
             f"  start {j['start_time']:%Y-%m-%d %H:%M:%S}" if j["start_time"] else "  (no start time)",
             f"  tags {', '.join(f'{k}={v}' for k, v in j['tags'].items())}" if j["tags"] else None,
             "",
             f"GPU-hours: {u['gpu_hours_busy']:.2f} busy of {u['gpu_hours_allocated']:.2f} allocated"
             + (f" ({u['efficiency']:.0%})" if u["efficiency"] is not None else "")
             + f" over {u['wall_hours']:.2f} h", "", "GPUs (mean utilization, SM activity where measured):"]
    for g in r["gpus"]:
        mem = f"{g['peak_mem_mib'] or 0}/{g['mem_total_mib'] or '?'} MiB"
        power = f"{g['power_w']:.0f}/{g['power_limit_w']:.0f} W" if g["power_w"] and g["power_limit_w"] else ""
        lines.append(f"  {g['node']}/GPU{g['gpu_index']}  util {bar(g['util'])}  SM {bar(g['sm_active'], 10)}"
                     f"  peak mem {mem}  {power}".rstrip())
    if r["ranks"]:
        lines += ["", "Ranks:"]
        for k in r["ranks"]:
            cpu = f"{k['cpu_percent']:.0f}%" if k["cpu_percent"] is not None else "n/a"
            lines.append(f"  rank {k['rank']:>3} on {k['node']}  pid {','.join(map(str, k['pids']))}  CPU {cpu}"
                         f"  GPU mem {k['gpu_mem_mib'] or 0} MiB  RSS {k['rss_mib'] or 0} MiB")
    if r["phases"]:
        lines += ["", "Phases:"]
        for p in r["phases"]:
            mean = f"{p['mean_s']:.1f} s" if p["mean_s"] is not None else "running"
            lines.append(f"  {p['phase']:<16} x{p['times']:<4} ranks {p['ranks']:<3} mean {mean}"
                         + (f"  ({p['running']} still running)" if p["running"] else ""))
    lines += ["", "Flags:" if r["flags"] else "Flags: none"]
    for f in r["flags"]:
        status = "open" if f["ended_at"] is None else "closed"
        where = f" {f['scope_key']}" if f["scope_key"] else ""
        lines.append(f"  [{f['severity']}/{f['category']}] {f['rule_id']}{where} ({status})")
        lines.append(f"      evidence: {', '.join(f'{k}={v}' for k, v in f['evidence'].items())}")
        lines.append(f"      advice: {f['advice']}")
    return printable("\n".join(line for line in lines if line is not None))
