"""`jobpulse validate report`: which nodes fail which checks, and which deviate from the
majority of their cluster (consistency even without an expect file)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from jobpulse.collector.report import terminal


def summarize(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    nodes: dict[tuple[str, str], dict[str, Any]] = {}
    values: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for cluster, node, check, status, observed, expected, message, gpu in rows:
        n = nodes.setdefault((cluster, node), {"cluster": cluster, "node": node, "checks": 0, "failed": [],
                                               "warned": [], "deviations": []})
        n["checks"] += 1
        if status in ("fail", "warn"):
            n["failed" if status == "fail" else "warned"].append(
                {"check": check, "gpu_uuid": gpu, "observed": observed, "expected": expected, "message": message})
        values[(cluster, check)][node].append(observed)
    for (cluster, check), per_node in values.items():
        shapes = {node: " / ".join(sorted(obs)) for node, obs in per_node.items()}
        if len(shapes) < 2:
            continue
        majority, count = Counter(shapes.values()).most_common(1)[0]
        if count * 2 <= len(shapes):
            continue  # no majority to compare with
        for node, shape in shapes.items():
            if shape != majority:
                nodes[(cluster, node)]["deviations"].append({"check": check, "observed": shape, "majority": majority})
    return {"nodes": list(nodes.values()),
            "ok": all(not n["failed"] and not n["deviations"] for n in nodes.values())}


def text(summary: dict[str, Any]) -> str:
    if not summary["nodes"]:
        return "no validation results yet: run `jobpulse-agent validate --collector URL` on the nodes"
    lines = []
    for n in summary["nodes"]:
        state = "FAIL" if n["failed"] else "DEVIATES" if n["deviations"] else "ok"
        lines.append(f"{n['cluster']}/{n['node']}: {state} ({n['checks']} checks, {len(n['failed'])} failed, "
                     f"{len(n['warned'])} warned)")
        for f in n["failed"]:
            where = f" [{f['gpu_uuid']}]" if f["gpu_uuid"] else ""
            lines.append(f"  fail {f['check']}{where}: observed {f['observed']}, expected {f['expected']}")
        for d in n["deviations"]:
            lines.append(f"  deviates {d['check']}: {d['observed']} (most nodes: {d['majority']})")
    return terminal.lines(lines)
