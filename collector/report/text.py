"""Report: `jobpulse report JOBID` — one job at a glance, running or finished.

Header, then per node and GPU (utilization, SM activity, memory, power), per rank (CPU, GPU
memory), phases from the job's events, the flags with evidence and advice, GPU-hours used vs
allocated, and goodput (the allocation split into productive time and badput by cause). Text with bars for the terminal, or JSON for scripts.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from jobpulse.collector.report import goodput, terminal
from jobpulse.collector.rules.registry import HUNG, HW_THROTTLING, IDLE_GPU, MEMORY_UNDERUSED, NO_TENSOR_CORES
from jobpulse.collector.store.read import job_timeline, reports
from jobpulse.collector.store.read.reports import JobNotFound

__all__ = ["JobNotFound", "capture_lines", "evidence_text", "flag_time", "gather", "goodput_lines", "not_judged",
           "rank_cpu", "runs_line", "text", "trace_headline", "trace_lines", "usage"]


def gather(conn: psycopg.Connection[Any], job_id: str, cluster: str | None) -> dict[str, Any]:
    """The job's report data: what the store holds of it, and its GPU-hours used vs allocated."""
    data = reports.job(conn, job_id, cluster)
    j = data["job"]
    earlier = job_timeline.runs(conn, j["cluster"], j["job_id"])
    if earlier and j["nodes"]:  # a requeued job: the row and its GPUs are the run under way or last
        data["gpus"] = [g for g in data["gpus"] if g["node"] in j["nodes"]]
    used = usage(j, data["gpus"])
    start = job_start(j, data["gpus"])
    end = j["end_time"] or max((g["last_ts"] for g in data["gpus"]), default=None) or datetime.now(UTC)
    productive = (goodput.compute(j, data["flags"], job_timeline.read(conn, j["cluster"], j["job_id"], start, end),
                                  start, end, used["gpu_hours_allocated"]) if start else None)
    return {**data, "usage": used, "goodput": productive, "not_judged": not_judged(j, data["gpus"]),
            "runs": [*(_run(conn, j, data["flags"], r, (earlier[i + 1].start if i + 1 < len(earlier) else start))
                       for i, r in enumerate(earlier)),
                     {"run": j.get("run") or 0, "state": j["state"], "start": start, "end": j["end_time"],
                      "nodes": j["nodes"] or [], "goodput": productive}] if earlier else []}


def _run(conn: psycopg.Connection[Any], job: dict[str, Any], flags: list[dict[str, Any]], r: job_timeline.Run,
         following: datetime | None) -> dict[str, Any]:
    """An earlier run of a requeued job with its own goodput: over its own span (an end never said
    is the next run's start), its own GPUs and end state."""
    end = r.end or following
    gpus = r.gpus_total or len(r.nodes)
    hours = (end - r.start).total_seconds() / 3600 * gpus if r.start and end else 0.0
    own = [f for f in flags if r.start and end and r.start <= f["started_at"] < end]
    g = (goodput.compute({**job, "state": r.state, "gpus_total": gpus}, own,
                         job_timeline.read(conn, job["cluster"], job["job_id"], r.start, end), r.start, end, hours)
         if r.start and end else None)
    return {"run": r.run, "state": r.state, "start": r.start, "end": r.end, "nodes": r.nodes, "exit_code": r.exit_code,
            "goodput": g}


def runs_line(runs: list[dict[str, Any]]) -> str | None:
    """A requeued job's runs in one line: run 1 ended NODE_FAIL on n1,n2 (40% productive); run 2 ..."""
    if not runs:
        return None

    def one(r: dict[str, Any]) -> str:
        share = r["goodput"]["ettr"] if r.get("goodput") else None
        said = (f"ended {r['state'] or 'with no state said'}" if r["end"] or r is not runs[-1] else "running")
        return (f"run {r['run'] + 1} {said} on {','.join(r['nodes']) or 'nodes not known'}"
                + (f" ({share:.0%} productive)" if share is not None else ""))
    return "Runs: " + "; ".join(one(r) for r in runs)


def not_judged(job: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, str]:
    """Rules that could not judge this job, and why: what they read was not measured (a recording
    without the column, a GPU that does not report it). Not measured is never read as zero."""
    found: dict[str, str] = {}
    if gpus and any(g["peak_mem_mib"] is None or not g["mem_total_mib"] for g in gpus):
        found[MEMORY_UNDERUSED] = "GPU memory used or total not measured"
    if gpus and all(g["sm_active"] is None for g in gpus):
        found[NO_TENSOR_CORES] = "no SM and tensor-core activity (GPM or DCGM profiling)"
    lacks = (job.get("tags") or {}).get("not_measured", "")
    if "throttle reasons" in lacks:
        found[HW_THROTTLING] = "no clock event (throttle) reasons"
    return found


def job_start(job: dict[str, Any], gpus: list[dict[str, Any]]) -> datetime | None:
    """The job's start (Slurm's, else its first sample): what flag times are relative to."""
    return job["start_time"] or min((g["first_ts"] for g in gpus), default=None)


def usage(job: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """GPU-hours allocated (GPUs x wall time) vs busy (each GPU's activity x the time it ran). A GPU
    counts as the ``share`` of it the job holds: a MIG slice its compute slices of the GPU's, an MPS
    job the share Slurm gave it; its activity is of its ``scale`` (the slice; a shared GPU's job row is
    already its own part of the whole GPU). GPUs Slurm gave that sent nothing count whole."""
    start = job_start(job, gpus)
    end = job["end_time"] or max((g["last_ts"] for g in gpus), default=None) or datetime.now(UTC)
    hours = (end - start).total_seconds() / 3600 if start else 0.0
    allocated = hours * (sum(g["share"] for g in gpus) + max((job["gpus_total"] or 0) - len(gpus), 0))
    busy = sum(((g["sm_active"] if g["sm_active"] is not None else g["util"] or 0) / 100) * g["scale"]
               * (g["last_ts"] - g["first_ts"]).total_seconds() / 3600 for g in gpus)
    return {"wall_hours": round(hours, 3), "gpu_hours_allocated": round(allocated, 3),
            "gpu_hours_busy": round(busy, 3), "efficiency": round(busy / allocated, 3) if allocated else None}


def goodput_lines(g: dict[str, Any] | None) -> list[str]:
    """The goodput line, with the start-up advice and what failure lost where there is one."""
    if not g:
        return []
    return ([goodput.line(g)] + ([f"  {g['advice']}"] if g.get("advice") else [])
            + ([f"  work lost to failure: {g['lost_to_failure']}"] if g.get("lost_to_failure") else []))


def bar(percent: float | None, width: int = 20) -> str:
    if percent is None:
        return " " * width + "   n/a"
    filled = round(max(0.0, min(100.0, percent)) / 100 * width)
    return "█" * filled + "░" * (width - filled) + f" {percent:5.1f}%"


def duration(seconds: float) -> str:
    """A signed offset or length: +17s, +3m17s, +2h03m05s, +1d02h03m."""
    sign, s = ("-" if seconds < 0 else "+"), round(abs(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{sign}{d}d{h:02d}h{m:02d}m"
    if h:
        return f"{sign}{h}h{m:02d}m{s:02d}s"
    return f"{sign}{m}m{s:02d}s" if m else f"{sign}{s}s"


def flag_time(f: dict[str, Any], start: datetime | None) -> str:
    """When a flag's condition held: since when (absolute, UTC, and relative to the job's start) and,
    once it ended, until when and for how long."""
    began, ended = f["started_at"], f["ended_at"]

    def at(ts: datetime, day: bool = True) -> str:
        ts = ts.astimezone(UTC)
        rel = f" (job {duration((ts - start).total_seconds())})" if start else ""
        return f"{ts:%Y-%m-%d %H:%M:%S} UTC{rel}" if day else f"{ts:%H:%M:%S} UTC{rel}"

    if ended is None:
        return f"since {at(began)}, still open"
    same_day = began.astimezone(UTC).date() == ended.astimezone(UTC).date()
    return (f"from {at(began)} until {at(ended, not same_day)}, "
            f"held {duration((ended - began).total_seconds())[1:]}")


def _value(v: Any) -> str:
    if isinstance(v, list):
        return ",".join(_value(x) for x in v)
    if isinstance(v, dict):
        return ",".join(f"{k}:{_value(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def evidence_text(evidence: dict[str, Any]) -> str:
    """A flag's evidence as key=value pairs; what holds nothing (null, [], {}, "") is left out, and so
    is a job-wide flag's ``per_gpu`` (each GPU's own evidence, a page on a large job: its advice names
    every GPU's level; the JSON report keeps it)."""
    return ", ".join(f"{k}={_value(v)}" for k, v in evidence.items() if v is not None and v != [] and v != {}
                     and v != "" and k != "per_gpu")


def capture_lines(capture: dict[str, Any] | None) -> list[str]:
    """What sampling the flagged rank's stacks found: the heaviest call paths of its main process and of
    its data-loader workers, or why nothing was found."""
    if capture is None:
        return []
    if capture["state"] in ("pending", "sent"):
        return ["stacks: being sampled on " + capture["node"]]
    found = capture["result"] or {}
    if capture["state"] == "failed":
        return [f"stacks: none ({capture['reason']})"]
    samples = found.get("samples", {})
    head = (f"stacks ({found.get('seconds', 0):.0f} s on {capture['node']}, "
            + ", ".join(f"{role} {n} samples" for role, n in samples.items() if n) + "):")
    whose = {"main": "main process's", "workers": "data-loader workers'"}
    lines = [head] + [f"  {s['share']:.0%} of the {whose.get(s['role'], s['role'])} time in {s['frames']}"
                      for s in found.get("top", [])]
    if capture["reason"]:
        lines.append(f"  not sampled: {capture['reason']}")
    return lines


def trace_headline(s: dict[str, Any]) -> str:
    """A trace summary in one line: how idle the GPU was and why, and what ran."""
    overlap = ("" if s.get("overlap_percent") is None
               else f" ({s['overlap_percent']:.0f}% of all communication overlapped computation)")
    return (f"GPU idle {s['idle_percent']:.0f}% of {s['span_s']:.3g} s ({s['steps']} steps; of the streams' idle "
            f"time {s['host_wait_percent']:.0f}% waiting on the host, {s['launch_gap_percent']:.0f}% launch gaps, "
            f"{s['other_wait_percent']:.0f}% on other streams), computing {s['compute_percent']:.0f}%, "
            f"communication alone {s['communication_percent']:.0f}%{overlap}, memcpy/memset "
            f"{s['memory_percent']:.0f}%")


def trace_lines(trace: dict[str, Any] | None) -> list[str]:
    """What the flagged rank's profiler trace showed (where the job allowed one), or why there is none."""
    if trace is None:
        return []
    if trace["state"] in ("pending", "sent"):
        return [f"trace: asked of the rank's client on {trace['node']} ({trace['steps']} steps)"]
    if trace["state"] == "failed":
        return [f"trace: none ({trace['reason']})"]
    s = (trace["result"] or {}).get("summary") or {}
    kept = (f"capture {trace['id']}, {trace['trace_bytes'] / 2**20:.1f} MiB kept" if trace["trace_kept"]
            else trace["reason"] or "the trace itself is no longer kept")
    lines = [f"trace ({trace['node']}, {kept}):", f"  {trace_headline(s)}"]
    lines += [f"  {k['percent']:.0f}% of kernel time in {k['name']}" for k in s.get("top_kernels", [])[:3]]
    return lines


def rank_cpu(k: dict[str, Any]) -> str:
    """A rank's CPU: its processes' sum, with the main process's own share and its workers."""
    if k["cpu_percent"] is None:
        return "n/a"
    workers = k["workers"] or 0
    parts = [f"main {k['main_cpu_percent']:.0f} %" if k["main_cpu_percent"] is not None else "no GPU process",
             f"{workers} worker{'s' if workers != 1 else ''}"
             + (f" (up to {k['max_workers']})" if (k["max_workers"] or 0) > workers else "")]
    return f"{k['cpu_percent']:.0f} % ({', '.join(parts)})"


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x} MiB"


def text(r: dict[str, Any]) -> str:
    j, u = r["job"], r["usage"]
    state = j["state"] or ("RUNNING" if j["end_time"] is None else "ENDED")
    start = job_start(j, r["gpus"])
    seen = len(r["gpus"])
    gpus = f"{seen}" + (f" seen of {j['gpus_total']} allocated" if j["gpus_total"] and j["gpus_total"] != seen else "")
    lines = [f"Job {j['job_id']} ({j['cluster']})  {j['job_name'] or ''}".rstrip(),
             f"  user {j['user_name'] or '?'}  account {j['account'] or '-'}  partition {j['partition'] or '-'}"
             f"  state {state}" + (f"  exit {j['exit_code']}" if j["exit_code"] is not None else ""),
             f"  nodes {', '.join(j['nodes'] or sorted({g['node'] for g in r['gpus']}))}  GPUs {gpus}"
             + (f"  start {j['start_time']:%Y-%m-%d %H:%M:%S} UTC" if j["start_time"] else "  (no start time)")
             + (f"  end {j['end_time']:%Y-%m-%d %H:%M:%S} UTC" if j["end_time"] else ""),
             f"  tags {', '.join(f'{k}={v}' for k, v in j['tags'].items())}" if j["tags"] else None,
             "",
             f"GPU-hours: {u['gpu_hours_busy']:.2f} busy of {u['gpu_hours_allocated']:.2f} allocated"
             + (f" ({u['efficiency']:.0%})" if u["efficiency"] is not None else "")
             + f" over {u['wall_hours']:.2f} h", *goodput_lines(r.get("goodput")),
             *filter(None, [runs_line(r.get("runs", []))]), "",
             "GPUs (mean utilization, SM activity where measured):"]
    for g in r["gpus"]:
        mem = f"{g['peak_mem_mib'] if g['peak_mem_mib'] is not None else '?'}/{g['mem_total_mib'] or '?'} MiB"
        power = f"{g['power_w']:.0f}/{g['power_limit_w']:.0f} W" if g["power_w"] and g["power_limit_w"] else ""
        lines.append(f"  {g['where']}  util {bar(g['util'])}  SM {bar(g['sm_active'], 10)}"
                     f"  peak mem {mem}  {power}".rstrip())
    if r["ranks"]:
        lines += ["", "Ranks (CPU: all the rank's processes, % of one core):"]
        for k in r["ranks"]:
            pids = k["main_pids"] or k["pids"]
            lines.append(f"  rank {k['rank']:>3} on {k['node']}  pid {','.join(map(str, pids))}  CPU {rank_cpu(k)}"
                         f"  GPU mem {_mib(k['gpu_mem_mib'])}  RSS {_mib(k['rss_mib'])}")
    if r["phases"]:
        lines += ["", "Phases:"]
        for p in r["phases"]:
            mean = f"{p['mean_s']:.1f} s" if p["mean_s"] is not None else "running"
            lines.append(f"  {p['phase']:<16} x{p['times']:<4} ranks {p['ranks']:<3} mean {mean}"
                         + (f"  ({p['running']} still running)" if p["running"] else ""))
    for kind, title in ((IDLE_GPU, "Idle-GPU policy:"), (HUNG, "Hung-job policy:")):
        acted = [a for a in r.get("policy") or () if a.get("policy", IDLE_GPU) == kind]
        if acted:
            lines += ["", title]
            lines += [f"  {a['at']:%Y-%m-%d %H:%M:%S} UTC  {a['action']}: {a['reason']}" for a in acted]
    if r.get("not_judged"):
        lines += ["", "Not judged (not measured, never read as zero):"]
        lines += [f"  {rule}: {why}" for rule, why in r["not_judged"].items()]
    lines += ["", "Flags:" if r["flags"] else "Flags: none"]
    for f in r["flags"]:
        status = "open" if f["ended_at"] is None else "closed"
        where = f" {f['scope_key']}" if f["scope_key"] else ""
        lines.append(f"  [{f['severity']}/{f['category']}] {f['rule_id']}{where} ({status})")
        lines.append(f"      {flag_time(f, start)}")
        evidence = evidence_text(f["evidence"])
        if evidence:
            lines.append(f"      evidence: {evidence}")
        lines += [f"      {line}" for line in capture_lines(f.get("capture")) + trace_lines(f.get("trace"))]
        if f["advice"]:
            lines.append(f"      advice: {f['advice']}")
    return terminal.lines(lines)
