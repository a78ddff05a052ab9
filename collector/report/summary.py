"""Summary: a job's end in at most 25 lines (and as JSON) -- what a researcher reads in the job-end
mail or from `jobpulse summary`: how busy each GPU was, GPU-hours held, used and wasted by cause,
goodput (productive time and badput by cause), each flag with its advice, and `#SBATCH` lines to
paste into the next run.

Built from the same figures as `jobpulse report` (`text.gather`), once the job's rules are final.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Any

import psycopg
import structlog

from jobpulse.collector.report import terminal
from jobpulse.collector.report.text import (
    capture_lines,
    duration,
    gather,
    goodput_lines,
    job_start,
    runs_line,
    trace_headline,
)
from jobpulse.collector.rules.registry import (
    HELD_BACK,
    IDLE_GPU,
    IMBALANCE,
    INPUT_BOUND,
    LOW_UTILIZATION,
    MEMORY_UNDERUSED,
    OVER_ALLOCATION,
)
from jobpulse.collector.store.state import summaries

log = structlog.get_logger("jobpulse.summary")

MAX_LINES = 25
MAX_GPUS = 8  # GPU lines shown; more are counted
MAX_FLAGS = 5

CAUSES: dict[str, str] = {
    IDLE_GPU: "idle", OVER_ALLOCATION: "idle", INPUT_BOUND: "input pipeline", LOW_UTILIZATION: "low use",
    IMBALANCE: "stragglers", HELD_BACK: "stragglers",
}
"""The cause a flag's rule charges wasted GPU-hours to; other rules (hardware, memory) charge none."""


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _hours(f: dict[str, Any], end: datetime) -> float:
    return max(((f["ended_at"] or end) - f["started_at"]).total_seconds(), 0.0) / 3600


def wasted(flags: list[dict[str, Any]], end: datetime, idle_hours: float) -> dict[str, float]:
    """GPU-hours wasted by cause: a flagged GPU's unused share over the flag's time (all of it when
    idle, 1 - its mean when low; the GPUs a job-wide flag names), capped at what the job left idle;
    the rest of the idle GPU-hours is "unflagged"."""
    out: dict[str, float] = {}
    for f in flags:
        cause = CAUSES.get(f["rule_id"])
        if cause is None:
            continue
        ev = f["evidence"] or {}
        gpus = len(ev.get("gpus") or ()) if f["scope"] == "job" else 1
        mean = ev.get("waiting_mean_percent", ev.get("mean_percent"))
        unused = 1.0 if cause == "idle" or mean is None else max(0.0, 1 - float(mean) / 100)
        out[cause] = out.get(cause, 0.0) + _hours(f, end) * gpus * unused
    total = sum(out.values())
    if total > idle_hours > 0:  # flags overlap in time: never charge more than was left idle
        out = {k: v * idle_hours / total for k, v in out.items()}
    rest = idle_hours - sum(out.values())
    if rest > 0.005:
        out["unflagged"] = rest
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


MIN_SAMPLES = 10
"""Process sample times a node needs before its CPU and memory use is advice."""


def allocation(data: dict[str, Any], gpus: int) -> dict[str, Any]:
    """What the job held besides GPUs (CPUs per GPU, memory per node, where the controller said) and
    what its processes used of it: CPU cores per GPU (the 95th percentile of the busiest node) and
    the peak memory (RSS) of the busiest node."""
    j = data["job"]
    held_gpus = j.get("gpus_total") or gpus  # GPUs it held, reporting or not
    per_node: dict[str, int] = {}
    for g in data["gpus"]:
        per_node[g["node"]] = per_node.get(g["node"], 0) + 1
    nodes = len(j["nodes"]) if j.get("nodes") else len(per_node)
    used = [r for r in data.get("resources", []) if r["samples"] >= MIN_SAMPLES and r["node"] in per_node]
    cores = max((r["cores_p95"] / per_node[r["node"]] for r in used), default=None)
    rss = max((r["rss_peak_mib"] for r in used if r["rss_peak_mib"] is not None), default=None)
    return {"gpus": gpus, "nodes": nodes,
            "cpus_per_gpu": round(j["cpus"] / held_gpus, 2) if j.get("cpus") and held_gpus else None,
            "mem_per_node_mib": round(j["mem_mib"] / nodes) if j.get("mem_mib") and nodes else None,
            "cores_per_gpu_used": None if cores is None else round(cores, 2),
            "mem_per_node_used_mib": rss}


def sbatch_lines(data: dict[str, Any], elapsed: timedelta | None, alloc: dict[str, Any]) -> list[str]:
    """Lines for the next run's batch script, from the job's own figures: the GPUs it used, a MIG
    profile that held its memory and compute, CPUs and memory where it held twice what it used (or
    ran out), and a time limit with a quarter to spare."""
    lines: list[str] = []
    by_rule = {f["rule_id"]: f["evidence"] or {} for f in data["flags"]}
    if OVER_ALLOCATION in by_rule and by_rule[OVER_ALLOCATION].get("gpus_used"):
        lines.append(f"#SBATCH --gres=gpu:{by_rule[OVER_ALLOCATION]['gpus_used']}")
    elif by_rule.get(MEMORY_UNDERUSED, {}).get("mig_profile"):
        ev = by_rule[MEMORY_UNDERUSED]
        lines.append(f"#SBATCH --gres=gpu:{ev['mig_profile']}:{len(ev.get('gpus') or [1])}")
    state = data["job"]["state"]
    ran_through = state in ("COMPLETED", "TIMEOUT")  # a job that failed early never reached its peak
    held, used = alloc["cpus_per_gpu"], alloc["cores_per_gpu_used"]
    if held and used is not None:
        if INPUT_BOUND in by_rule and used >= 0.8 * held:  # its loaders waited for CPUs it did not have
            lines.append(f"#SBATCH --cpus-per-gpu={math.ceil(held * 1.5)}")
        elif INPUT_BOUND not in by_rule and ran_through and (want := max(1, math.ceil(used * 1.25))) * 2 <= held:
            lines.append(f"#SBATCH --cpus-per-gpu={want}")
    held, used = alloc["mem_per_node_mib"], alloc["mem_per_node_used_mib"]
    if held and state == "OUT_OF_MEMORY":
        lines.append(f"#SBATCH --mem={math.ceil(held * 1.5 / 1024)}G")
    elif held and used is not None and ran_through and (gib := max(1, math.ceil(used * 1.25 / 1024))) * 2048 <= held:
        lines.append(f"#SBATCH --mem={gib}G")
    if elapsed and state == "COMPLETED":
        quarters = math.ceil(elapsed.total_seconds() * 1.25 / 900)
        minutes = max(quarters * 15, 15)
        lines.append(f"#SBATCH --time={minutes // 60:02d}:{minutes % 60:02d}:00")
    return lines


def _advised(line: str) -> tuple[str, str] | None:
    """(option, value) of an advice line this checks: ``--gres=gpu:N`` (a GPU count), ``--time``,
    ``--cpus-per-gpu`` or ``--mem``."""
    m = re.fullmatch(r"#SBATCH --(gres=gpu|time|cpus-per-gpu|mem)[:=](\S+)", line)
    return (m.group(1), m.group(2)) if m else None


def _seconds(limit: str) -> int | None:
    parts = limit.split(":")
    return int(parts[0]) * 3600 + int(parts[1]) * 60 + int(parts[2]) if len(parts) == 3 and limit.replace(":", "").isdigit() else None


def _toward(advised: float, before: float | None, now: float | None) -> bool | None:
    """Whether this run's value is on the advised side of the last run's (fewer, or more where more
    was advised); None where either run's value is not known."""
    if before is None or now is None:
        return None
    return now <= advised if advised <= before else now >= advised


def advice_check(previous: dict[str, Any], job: dict[str, Any], alloc: dict[str, Any],
                 elapsed_h: float | None) -> dict[str, Any]:
    """Whether this run followed the advice the last run of the same work was given, line by line
    (True, False, or None where it cannot be told, e.g. a MIG profile), and the GPU-hours it saved:
    the GPUs it no longer held, over its own elapsed time."""
    lines, followed = [], 0
    saved = 0.0
    gpus, before = alloc["gpus"], previous.get("allocation") or {}
    for line in previous.get("sbatch", []):
        option = _advised(line)
        verdict: bool | None = None
        if option and option[0] == "gres=gpu" and option[1].isdigit():
            verdict = gpus <= int(option[1])
            held_before = previous["gpu_hours"]["gpus"]
            if verdict and elapsed_h and held_before > gpus:
                saved += (held_before - gpus) * elapsed_h
        elif option and option[0] == "time" and _seconds(option[1]) and job.get("time_limit_s"):
            verdict = job["time_limit_s"] <= (_seconds(option[1]) or 0)
        elif option and option[0] == "cpus-per-gpu" and option[1].isdigit():
            verdict = _toward(int(option[1]), before.get("cpus_per_gpu"), alloc["cpus_per_gpu"])
        elif option and option[0] == "mem" and option[1].endswith("G") and option[1][:-1].isdigit():
            verdict = _toward(int(option[1][:-1]) * 1024, before.get("mem_per_node_mib"), alloc["mem_per_node_mib"])
        followed += verdict is True
        lines.append({"line": line, "followed": verdict})
    return {"job_id": previous["job"]["job_id"], "advice": lines, "followed": followed,
            "gpu_hours_saved": round(saved, 2)}


def _heaviest(capture: dict[str, Any] | None) -> str | None:
    """The heaviest call path the flag's capture found (as the report words it), if it found any."""
    lines = capture_lines(capture) if capture and capture["state"] == "done" else []
    return lines[1].strip() if len(lines) > 1 and not lines[1].strip().startswith("not sampled") else None


def _trace(trace: dict[str, Any] | None) -> str | None:
    """Where the GPU time went, from the flag's profiler trace, if one was taken."""
    summary = (trace["result"] or {}).get("summary") if trace and trace["state"] == "done" else None
    return trace_headline(summary) if summary else None


def build(data: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary of one ended job from its report data (`text.gather`): JSON, with its text."""
    j, u = data["job"], data["usage"]
    start = job_start(j, data["gpus"])
    end = j["end_time"] or max((g["last_ts"] for g in data["gpus"]), default=start)
    elapsed = end - start if start and end else None
    held, used = u["gpu_hours_allocated"], u["gpu_hours_busy"]
    waste = wasted(data["flags"], end, max(held - used, 0.0)) if end else {}
    gpus = []
    for g in data["gpus"]:
        busy = g["sm_active"] if g["sm_active"] is not None else g["util"]
        hours = (g["last_ts"] - g["first_ts"]).total_seconds() / 3600
        gpus.append({"where": g["where"], "busy_percent": None if busy is None else round(busy, 1),
                     "metric": "SM activity" if g["sm_active"] is not None else "utilization",
                     "memory_peak_mib": g["peak_mem_mib"], "memory_total_mib": g["mem_total_mib"],
                     "energy_kwh": round(g["power_w"] * hours / 1000, 3) if g["power_w"] else None})
    names = {f"{g['node']}/{g['gpu_uuid']}": g["where"] for g in data["gpus"]}
    flags = [{"rule": f["rule_id"], "where": names.get(f["scope_key"], f["scope_key"]) or "job", "severity": f["severity"],
              "category": f["category"], "since": _iso(f["started_at"]), "until": _iso(f["ended_at"]),
              "advice": f["advice"], "stacks": _heaviest(f.get("capture")), "trace": _trace(f.get("trace"))}
             for f in data["flags"]]
    alloc = allocation(data, len(data["gpus"]))
    summary = {
        "job": {"cluster": j["cluster"], "job_id": j["job_id"], "name": j["job_name"], "user": j["user_name"],
                "account": j["account"], "partition": j["partition"], "state": j["state"],
                "start": _iso(start), "end": _iso(end), "elapsed_s": elapsed.total_seconds() if elapsed else None,
                "script_hash": j.get("script_hash")},
        "gpu_hours": {"gpus": len(data["gpus"]), "held": round(held, 2), "used": round(used, 2),
                      "wasted": waste},
        "goodput": data.get("goodput"),
        "runs": [{"run": r["run"], "state": r["state"], "start": _iso(r["start"]), "end": _iso(r["end"]),
                  "nodes": r["nodes"], "goodput": r["goodput"]} for r in data.get("runs", [])],
        "allocation": alloc,
        "gpus": gpus, "flags": flags, "not_judged": data.get("not_judged", {}),
        "sbatch": sbatch_lines(data, elapsed, alloc),
    }
    if previous is not None:
        summary["advice_check"] = advice_check(previous, j, alloc, elapsed.total_seconds() / 3600 if elapsed else None)
    summary["text"] = text(summary)
    return summary


def _resources(a: dict[str, Any]) -> str:
    """What the job used of its CPUs and memory, where measured (and of how much, where known)."""
    parts = []
    if a.get("cores_per_gpu_used") is not None:
        parts.append(f"{a['cores_per_gpu_used']:.1f}" + (f" of {a['cpus_per_gpu']:g}" if a.get("cpus_per_gpu") else "")
                     + " cores per GPU (95th percentile)")
    if a.get("mem_per_node_used_mib") is not None:
        parts.append(f"memory peak {a['mem_per_node_used_mib'] / 1024:.1f}"
                     + (f" of {a['mem_per_node_mib'] / 1024:.0f}" if a.get("mem_per_node_mib") else "")
                     + " GiB per node")
    return ", ".join(parts)


def _short(advice: str, width: int = 160) -> str:
    advice = one_line(advice)
    return advice if len(advice) <= width else advice[:width - 1].rsplit(" ", 1)[0] + " …"


def one_line(value: object) -> str:
    """A value on one line: what a job's owner wrote (its name, its tags) may hold line breaks, which
    would otherwise start lines of their own in a mail."""
    return " ".join(str(value).split())


def text(s: dict[str, Any]) -> str:
    """At most MAX_LINES lines: the job, GPU-hours, its GPUs, its flags with advice, next-run lines."""
    j, h = s["job"], s["gpu_hours"]
    nodes = sorted({g["where"].split("/")[0] for g in s["gpus"]})
    lines = [f"jobpulse: job {j['job_id']} ({j['cluster']}) {one_line(j['name'] or '')[:80]}".rstrip()
             + f", {j['state'] or 'ENDED'}"
             + (f" after {duration(j['elapsed_s']).lstrip('+')}" if j["elapsed_s"] is not None else "")
             + f" on {h['gpus']} GPU{'s' * (h['gpus'] != 1)}" + (f" ({', '.join(nodes[:3])}"
                                                                + (", ..." if len(nodes) > 3 else "") + ")"
                                                                if nodes else "")]
    share = f" ({h['used'] / h['held']:.0%})" if h["held"] else ""
    waste = ", ".join(f"{cause} {hours:.2f}" for cause, hours in h["wasted"].items())
    lines.append(f"GPU-hours: {h['held']:.2f} held, {h['used']:.2f} used{share}"
                 + (f"; wasted: {waste}" if waste else ""))
    lines += goodput_lines(s.get("goodput"))
    lines += filter(None, [runs_line(s.get("runs", []))])
    for g in s["gpus"][:MAX_GPUS]:
        mem = (f", memory peak {g['memory_peak_mib'] / 1024:.1f}/{g['memory_total_mib'] / 1024:.0f} GiB"
               if g["memory_peak_mib"] is not None and g["memory_total_mib"] else "")
        energy = f", {g['energy_kwh']:.2f} kWh" if g["energy_kwh"] else ""
        busy = f"{g['busy_percent']:.0f}% busy" if g["busy_percent"] is not None else "busy n/a"
        lines.append(f"  {g['where']}: {busy}{mem}{energy}")
    if len(s["gpus"]) > MAX_GPUS:
        lines.append(f"  ... and {len(s['gpus']) - MAX_GPUS} more GPUs (jobpulse report {j['job_id']})")
    if (used := _resources(s.get("allocation") or {})):
        lines.append(f"CPU and memory: {used}")
    lines.append("Flags:" if s["flags"] else "Flags: none")
    for f in s["flags"][:MAX_FLAGS]:
        lines.append(f"  {f['rule']} ({f['where']}): {_short(f['advice'])}")
        if f.get("stacks"):
            lines.append(f"    stacks: {f['stacks']}")
        if f.get("trace"):
            lines.append(f"    trace: {f['trace']}")
    if len(s["flags"]) > MAX_FLAGS:
        lines.append(f"  ... and {len(s['flags']) - MAX_FLAGS} more")
    if s["not_judged"]:
        lines.append(f"Not judged (not measured): {', '.join(s['not_judged'])}")
    if s.get("advice_check"):
        c = s["advice_check"]
        told = ", ".join(f"{a['line'].removeprefix('#SBATCH ')} "
                         + {True: "followed", False: "not followed", None: "not checked"}[a["followed"]]
                         for a in c["advice"])
        lines.append(f"Advice from job {c['job_id']}: {told}"
                     + (f"; saved {c['gpu_hours_saved']:.2f} GPU-hours" if c["gpu_hours_saved"] else ""))
    if s["sbatch"]:
        lines.append("Next time:")
        lines += [f"  {line}" for line in s["sbatch"]]
    lines.append(f"Details: jobpulse report {j['job_id']} --cluster {j['cluster']}")
    return terminal.lines(lines[:MAX_LINES])  # a job's own text (name, phase) cannot break or fake a line


def write_pending(conn: psycopg.Connection[Any]) -> int:
    """Summarize every ended job whose rules are final and that has no summary yet; one job whose
    data breaks the summary is logged and left for the next run, never stops the others."""
    written = 0
    for cluster, job_id in summaries.pending(conn):
        try:
            with conn.transaction():
                data = gather(conn, job_id, cluster)
                j = data["job"]
                previous = summaries.previous_run(conn, cluster, j["user_name"], j["job_name"], j.get("script_hash"),
                                                  job_start(j, data["gpus"]))
                summaries.write(conn, build(data, previous))
            written += 1
        except Exception as exc:  # noqa: BLE001 - one job's bad data must not stop the others' summaries
            log.warning("job summary failed", cluster=cluster, job=job_id, error=repr(exc)[:300])
    return written
