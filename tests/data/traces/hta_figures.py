"""Holistic Trace Analysis' own figures for every trace here, written to hta_figures.json; the tests
check jobpulse's trace summary (collector/report/trace_summary.py) against them.

HTA needs pandas, plotly and more, so it is not a test dependency; run this when a trace is added:

    python -m venv /tmp/hta && /tmp/hta/bin/pip install --no-deps HolisticTraceAnalysis==0.5.0 \\
        && /tmp/hta/bin/pip install numpy pandas networkx plotly pydot
    /tmp/hta/bin/python tests/data/traces/hta_figures.py
"""

from __future__ import annotations

import json
import logging
import math
from importlib.metadata import version
from pathlib import Path

from hta.trace_analysis import TraceAnalysis

HERE = Path(__file__).parent


def figures(trace_dir: Path) -> dict[str, dict[str, float]]:
    """Per rank: HTA's temporal breakdown, idle breakdown (all streams summed) and overlap; over all ranks:
    time by kernel type."""
    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    temporal = analysis.get_temporal_breakdown(visualize=False)
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    kernel_types, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    out: dict[str, dict[str, float]] = {}
    for row in temporal.to_dict("records"):
        rank = int(row["rank"])
        idle, _ = analysis.get_idle_time_breakdown(ranks=[rank], visualize=False)
        by_category = idle.groupby("idle_category")["idle_time"].sum().to_dict()
        pct = float(overlap[overlap["rank"].eq(rank)]["comp_comm_overlap_pctg"].iloc[0])
        out[str(rank)] = {
            "span_us": float(row["kernel_time(us)"]),
            "idle_us": float(row["idle_time(us)"]),
            "compute_us": float(row["compute_time(us)"]),
            "non_compute_us": float(row["non_compute_time(us)"]),
            "host_wait_us": float(by_category.get("host_wait", 0)),
            "kernel_wait_us": float(by_category.get("kernel_wait", 0)),
            "other_wait_us": float(by_category.get("other", 0)),
            "overlap_percent": None if math.isnan(pct) else pct,
        }
    # HTA sums time by kernel type over all ranks
    out["all"] = {f"kernel_type_us.{r['kernel_type']}": float(r["sum"]) for r in kernel_types.to_dict("records")}
    return out


def main() -> None:
    logging.disable(logging.WARNING)
    result = {"hta_version": version("HolisticTraceAnalysis"),
              "traces": {d.name: figures(d) for d in sorted(HERE.iterdir()) if d.is_dir()}}
    (HERE / "hta_figures.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
