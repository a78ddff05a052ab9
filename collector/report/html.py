"""Report: `jobpulse report JOBID --format html` — one self-contained file (inline SVG, no
scripts, no network) with each GPU's utilization, SM activity and memory over time, the flags
shaded where and when they held, and the job's phases marked underneath. Every user-written text is
escaped for HTML and its control characters shown as escapes (`terminal.printable`), so a job name
carrying ESC or BEL reaches neither the page nor a terminal that prints it."""

from __future__ import annotations

import html as _html
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from jobpulse.collector.report.terminal import printable
from jobpulse.collector.report.text import (
    bar,
    capture_lines,
    evidence_text,
    flag_time,
    goodput_lines,
    job_start,
    trace_lines,
)
from jobpulse.collector.store.read import reports

POINTS = 600  # at most this many time steps per plot
W, H, LEFT, TOP, PHASE_H = 920, 170, 44, 10, 16
SERIES = (("sm_util", "GPU utilization %", "#1f77b4"), ("sm_active", "SM activity % (GPM)", "#2ca02c"),
          ("mem", "memory used %", "#ff7f0e"))
SEVERITY = {"critical": "#d62728", "warning": "#e6a100", "info": "#7f7f7f"}


def escape(text: str) -> str:
    """Text for an HTML page: control characters as visible escapes, then markup escaped."""
    return _html.escape(printable(text))


def series(conn: psycopg.Connection[Any], r: dict[str, Any]) -> dict[str, Any]:
    """Per-GPU time series over the job's life (raw or roll-ups, by `jobpulse.gpu_series`) and phases."""
    job, gpus = r["job"], r["gpus"]
    start = job["start_time"] or min((g["first_ts"] for g in gpus), default=None)
    end = job["end_time"] or max((g["last_ts"] for g in gpus), default=None) or datetime.now(UTC)
    if start is None or not gpus:
        return {"start": None, "end": None, "gpus": {}, "phases": []}
    end = max(end, start + timedelta(seconds=1))
    step = max(1, int((end - start).total_seconds() / POINTS) + 1)
    gpus_rows, phases, source = reports.series(conn, job["cluster"], job["job_id"], start, end, step)
    return {"start": start, "end": end, "step_s": step, "gpus": gpus_rows, "phases": phases, "source": source}


def render(r: dict[str, Any], s: dict[str, Any]) -> str:
    j, u = r["job"], r["usage"]
    e = escape
    title = f"Job {j['job_id']} ({j['cluster']})" + (f" — {j['job_name']}" if j["job_name"] else "")
    state = j["state"] or ("RUNNING" if j["end_time"] is None else "ENDED")
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)} · jobpulse</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
             "<p class='meta'>" + " · ".join(e(str(x)) for x in (
                 f"user {j['user_name'] or '?'}", f"account {j['account'] or '-'}", f"partition {j['partition'] or '-'}",
                 f"state {state}", f"nodes {', '.join(j['nodes'] or sorted({g['node'] for g in r['gpus']}))}",
                 f"{len(r['gpus'])} GPUs", f"start {j['start_time']:%Y-%m-%d %H:%M:%S} UTC" if j["start_time"] else "",
                 f"end {j['end_time']:%Y-%m-%d %H:%M:%S} UTC" if j["end_time"] else "running") if x) + "</p>"]
    eff = f" ({u['efficiency']:.0%})" if u["efficiency"] is not None else ""
    parts.append(f"<p class='usage'>GPU-hours: <b>{u['gpu_hours_busy']:.2f}</b> busy of "
                 f"<b>{u['gpu_hours_allocated']:.2f}</b> allocated{eff} over {u['wall_hours']:.2f} h</p>")
    parts += [f"<p class='usage'>{e(x.strip())}</p>" for x in goodput_lines(r.get("goodput"))]
    start = job_start(j, r["gpus"])
    names = {f"{g['node']}/{g['gpu_uuid']}": g["where"] for g in r["gpus"]}
    parts.append("<h2>Flags</h2>" + ("<ul class='flags'>" + "".join(_flag(f, start, r["gpus"], names)
                                                                    for f in r["flags"]) + "</ul>"
                                     if r["flags"] else "<p>none</p>"))
    if r.get("not_judged"):
        parts.append("<p class='meta'>Not judged (not measured, never read as zero): " + "; ".join(
            f"{e(rule)}: {e(why)}" for rule, why in r["not_judged"].items()) + "</p>")
    parts.append("<h2>GPUs</h2><p class='legend'>" + "".join(
        f"<span style='color:{c}'>━ {e(label)}</span>" for _, label, c in SERIES)
        + "<span class='flagkey'>▇ flag held</span><span class='phasekey'>▇ phase</span>"
        + (f"<span class='src'>{s['step_s']} s steps from {e(s['source'] or '')}</span>" if s["start"] else "")
        + "</p>")
    for g in r["gpus"]:
        key = f"{g['node']}/{g['gpu_uuid']}"
        parts.append(f"<section class='gpu'><h3>{e(g['where'])} <small>{e(g['gpu_uuid'])}</small>"
                     f"</h3><pre>util {bar(g['util'])}   SM {bar(g['sm_active'], 10)}   peak mem "
                     f"{g['peak_mem_mib'] or 0}/{g['mem_total_mib'] or '?'} MiB</pre>"
                     + _plot(key, s, [f for f in r["flags"] if shades(f, g)])
                     + "</section>")
    if r["ranks"]:
        parts.append("<h2>Ranks</h2><p class='legend'>CPU: the sum over the rank's processes (its main process on "
                     "the GPU and its data-loader workers), mean over the job, % of one core</p><table><tr>"
                     "<th>rank</th><th>node</th><th>main PID</th><th>CPU %</th><th>main CPU %</th><th>workers</th>"
                     "<th>GPU memory MiB</th><th>main RSS MiB</th></tr>" + "".join(
                         f"<tr data-rank='{k['rank']}'><td>{k['rank']}</td><td>{e(k['node'])}</td>"
                         f"<td>{e(','.join(map(str, k['main_pids'] or [])))}</td>"
                         f"<td class='cpu'>{_num(k['cpu_percent'], 0)}</td><td class='main'>"
                         f"{_num(k['main_cpu_percent'], 0)}</td><td class='workers'>{k['workers'] or 0}"
                         + (f" (up to {k['max_workers']})" if (k["max_workers"] or 0) > (k["workers"] or 0) else "")
                         + f"</td><td>{_int(k['gpu_mem_mib'])}</td><td>{_int(k['rss_mib'])}</td></tr>"
                         for k in r["ranks"])
                     + "</table>")
    if r["phases"]:
        parts.append("<h2>Phases</h2><table><tr><th>phase</th><th>times</th><th>ranks</th><th>mean s</th>"
                     "<th>max s</th></tr>" + "".join(
                         f"<tr><td>{e(p['phase'] or '')}</td><td>{p['times']}</td><td>{p['ranks']}</td>"
                         f"<td>{_num(p['mean_s'])}</td><td>{_num(p['max_s'])}</td></tr>" for p in r["phases"])
                     + "</table>")
    parts.append(f"<p class='foot'>jobpulse report, generated {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"
                 "</p></body></html>")
    return "\n".join(parts)


def _num(x: float | None, digits: int = 1) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def _int(x: int | None) -> str:
    return "" if x is None else str(x)


def shades(f: dict[str, Any], g: dict[str, Any]) -> bool:
    """Whether a flag concerns this GPU, so its plot shows the flag: the flag is the GPU's (scope key
    NODE/GPU-UUID), or its evidence lists the GPU in "gpus"; a flag keyed by a node concerns that node's
    GPUs (those in "gpus" where it lists them); a rank's flag (NODE/pidPID) the GPU its evidence "gpu"
    names. A job-wide flag that names no GPU concerns none: the flags list shows it."""
    key, node = f"{g['node']}/{g['gpu_uuid']}", g["node"]
    evidence = f["evidence"] if isinstance(f["evidence"], dict) else {}
    listed = evidence.get("gpus")
    listed = set(map(str, listed)) if isinstance(listed, list) else None
    scope_key = f["scope_key"] or ""
    if scope_key == key or (listed is not None and key in listed):
        return True
    if f["scope"] == "rank" or "/pid" in scope_key:
        return evidence.get("gpu") in (key, f"{node}/GPU{g['gpu_index']}")
    return scope_key == node and listed is None


def _flag(f: dict[str, Any], start: datetime | None, gpus: list[dict[str, Any]], names: dict[str, str]) -> str:
    e = escape
    status = "open" if f["ended_at"] is None else "closed"
    evidence = evidence_text(f["evidence"])
    on = [names[f"{g['node']}/{g['gpu_uuid']}"] for g in gpus if shades(f, g)]
    where = f"{f['scope']} {f['scope_key']}" if f["scope_key"] else f["scope"]
    return (f"<li data-rule='{e(f['rule_id'])}'><span class='sev' style='background:"
            f"{SEVERITY.get(f['severity'], '#999')}'>{e(f['severity'])}</span> <b>{e(f['rule_id'])}</b> <small>"
            f"{e(f['category'])} · {e(where)} · {status}</small><div class='when'>{e(flag_time(f, start))}</div>"
            + (f"<div class='ev'>{e(evidence)}</div>" if evidence else "")
            + "".join(f"<div class='stacks'>{e(line)}</div>" for line in capture_lines(f.get("capture"))
                      + trace_lines(f.get("trace")))
            + f"<div class='on'>{'shaded on ' + e(', '.join(on)) if on else 'concerns the whole job: no GPU plot'}"
            f"</div>" + (f"<div class='advice'>{e(f['advice'])}</div>" if f["advice"] else "") + "</li>")


def _plot(key: str, s: dict[str, Any], flags: list[dict[str, Any]]) -> str:
    rows = s["gpus"].get(key, [])
    if not s["start"] or not rows:
        return "<p class='nodata'>no samples</p>"
    t0, span = s["start"], max((s["end"] - s["start"]).total_seconds(), 1.0)
    pw, ph = W - LEFT - 8, H - TOP - 22 - PHASE_H

    def x(ts: datetime) -> float:
        return LEFT + max(0.0, min(1.0, (ts - t0).total_seconds() / span)) * pw

    def y(v: float) -> float:
        return TOP + ph - max(0.0, min(100.0, v)) / 100 * ph

    out = [(f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' viewBox='0 0 {W} {H}' "
            f"data-gpu='{escape(key)}' data-points='{len(rows)}' role='img'>"),
           f"<rect x='{LEFT}' y='{TOP}' width='{pw}' height='{ph}' class='area'/>"]
    for f in flags:
        end = f["ended_at"] or s["end"]
        out.append(f"<rect x='{x(f['started_at']):.1f}' y='{TOP}' width='{max(x(end) - x(f['started_at']), 2):.1f}' "
                   f"height='{ph}' fill='{SEVERITY.get(f['severity'], '#999')}' opacity='0.16' "
                   f"data-flag='{escape(f['rule_id'])}' data-since='{f['started_at'].isoformat()}'>"
                   f"<title>{escape(f['rule_id'])}: {escape(flag_time(f, t0))}</title></rect>")
    for v in (0, 50, 100):
        out.append(f"<line x1='{LEFT}' x2='{LEFT + pw}' y1='{y(v):.1f}' y2='{y(v):.1f}' class='grid'/>"
                   f"<text x='{LEFT - 6}' y='{y(v) + 4:.1f}' class='tick' text-anchor='end'>{v}</text>")
    for name, label, color in SERIES:
        segments: list[list[str]] = []
        current: list[str] = []
        for row in rows:
            value = _value(row, name)
            if value is None:
                if current:
                    segments.append(current)
                current = []
            else:
                current.append(f"{x(row['time']):.1f},{y(value):.1f}")
        if current:
            segments.append(current)
        for seg in segments:
            points = " ".join(seg if len(seg) > 1 else seg * 2)
            out.append(f"<polyline points='{points}' fill='none' stroke='{color}' stroke-width='1.5' "
                       f"data-series='{name}'><title>{escape(label)}</title></polyline>")
    py = TOP + ph + 4
    for p in s["phases"]:
        x0, x1 = x(p["started_at"]), x(p["ended_at"])
        out.append(f"<rect x='{x0:.1f}' y='{py}' width='{max(x1 - x0, 2):.1f}' height='{PHASE_H - 4}' class='phase' "
                   f"data-phase='{escape(p['phase'] or '')}'><title>{escape(p['phase'] or '')} "
                   f"(rank {p['rank']}, {escape(p['status'] or '')})</title></rect>")
        if x1 - x0 > 40:
            out.append(f"<text x='{x0 + 3:.1f}' y='{py + PHASE_H - 7}' class='plabel'>"
                       f"{escape((p['phase'] or '')[:20])}</text>")
    for frac in (0, 0.5, 1):
        ts = t0 + timedelta(seconds=span * frac)
        anchor = "start" if frac == 0 else "end" if frac == 1 else "middle"
        out.append(f"<text x='{LEFT + frac * pw:.1f}' y='{H - 4}' class='tick' text-anchor='{anchor}'>"
                   f"{ts:%H:%M:%S}</text>")
    out.append("</svg>")
    return "".join(out)


def _value(row: dict[str, Any], name: str) -> float | None:
    if name == "mem":
        used, total = row["fb_used_mib"], row["fb_total_mib"]
        return None if used is None or not total else used / total * 100
    return row[name]


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:980px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:10px 0 2px}small{color:#777;font-weight:normal}
.meta,.usage{margin:2px 0}.legend span{margin-right:14px;font-size:12px}.src{color:#777}
.flagkey{color:#e6a100}.phasekey{color:#9aa7b8}
.flags{list-style:none;padding:0}.flags li{margin:0 0 10px}.sev{color:#fff;border-radius:3px;padding:0 5px;font-size:12px}
.ev{font:12px monospace;color:#555}.advice{margin-top:2px}.when,.on{font-size:12px;color:#555}
pre{margin:2px 0;font-size:12px}svg .area{fill:#fafafa;stroke:#ccc}svg .grid{stroke:#e4e4e4}
svg .tick{font-size:10px;fill:#777}svg .phase{fill:#9aa7b8;opacity:.6}svg .plabel{font-size:9px;fill:#223}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
.foot{color:#999;font-size:11px;margin-top:24px}
"""
