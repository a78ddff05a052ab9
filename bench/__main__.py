"""Every benchmark in one command: `python -m bench` (what `make bench` runs).

Each benchmark runs as its own process (a fresh interpreter and its own PostgreSQL), prints its
own table and writes bench/results/<name>.json; this then prints one table of the figures the
issues set targets for and writes bench/results/summary.json with the machine and every result.

    python -m bench [--only latency,grafana] [--quick]

--quick runs small sizes to check that the benchmarks work; its figures are not the ones to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

# name -> (arguments for a full run, arguments for --quick)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    "ingest": ([], ["--nodes", "100", "--seconds", "1", "--rounds", "2", "--store-batches", "129"]),
    "agent_overhead": ([], ["--seconds", "10"]),
    "events": ([], ["--events", "10000", "--senders", "1"]),
    "latency": ([], ["--seconds", "15", "--nodes", "2", "--sim-nodes", "100", "--sim-seconds", "8",
                     "--watch-nodes", "10"]),
    "rules": ([], ["--gpus", "200", "--cycles", "2"]),
    "grafana": ([], ["--hours", "0.5", "--gpus", "8", "--cluster-gpus", "200", "--runs", "1"]),
    "storage": ([], ["--hours", "1", "--gpus", "2", "--runs", "1"]),
    "notify_latency": ([], ["--flags", "3", "--spacing", "1"]),
    "capture_overhead": ([], ["--rounds", "2", "--seconds", "3"]),
    "trace_overhead": ([], ["--rounds", "2", "--seconds", "1"]),
    "watch_startup": ([], ["--rounds", "1"]),
    "versus_tsdb": ([], ["--nodes", "2", "--seconds", "10", "--rounds", "1", "--warmup", "10", "--idle", "10",
                               "--disk-gpus", "2", "--disk-hours", "0.25",
                               "--citus-seconds", "3", "--citus-rounds", "1"]),
}

# a benchmark's earlier name -> its name now
ALIASES = {"versus_prometheus": "versus_tsdb"}

Row = tuple[str, str, str, bool | None]  # figure, value, target, met (None: no target)


def _ingest(r: dict[str, Any]) -> list[Row]:
    return [(f"node batches ({r['rows_per_batch']} rows) via HTTP vs raw binary COPY, same run",
             f"{r['node_batch_ratio_to_copy']:.3f} x COPY (median of {r['rounds']})", ">= 0.5 x COPY",
             r["node_batch_ratio_to_copy"] >= 0.5),
            ("node batches a second, one collector", f"{r['nodes_per_s']:,.0f} nodes/s", ">= 1,500",
             r["nodes_per_s"] >= 1500)]


def _agent(r: dict[str, Any]) -> list[Row]:
    return [(f"agent CPU, 1 Hz, {r['gpus']} GPUs, {r['processes']} processes",
             f"{r['cpu_percent_of_one_core']:.2f} % of a core", "<= 0.3 %", r["cpu_percent_of_one_core"] <= 0.3)]


def _events(r: list[dict[str, Any]]) -> list[Row]:
    return [(f"events sent by {e['senders']} process(es)", f"{e['send_rate_per_process']:,}/s per process, "
             f"agent forwards {e['forward_rate']:,}/s", "", None) for e in r]


def _latency(r: dict[str, Any]) -> list[Row]:
    return [(f"sample -> queryable, {w['gpus']:,} GPUs at 1 Hz ({w['samples_seen']:,} samples)",
             f"p50 {w['p50_s']:.3f} s, p99 {w['p99_s']:.3f} s", "p99 <= 1.5 s", w["p99_s"] <= 1.5)
            for w in (r["agents"], r["simulated"])] + [
            ("storage per GPU sample", f"{r['agents']['bytes_per_gpu_sample']} B + "
             f"{r['agents']['rollup_bytes_per_gpu_sample']} B roll-ups", "", None)]


def _rules(r: dict[str, Any]) -> list[Row]:
    return [(f"rule cycle, {r['gpus']:,} running GPUs", f"median {r['median_s']:.3f} s, max {r['max_s']:.3f} s",
             "< 1 s", r["max_s"] < 1)]


def _grafana(r: dict[str, Any]) -> list[Row]:
    job = r["job_case"]
    scope = f"job of {job['gpus']} GPUs x {job['hours']:g} h"
    if "cluster_case" in r:
        scope += f", cluster of {r['cluster_case']['running_gpus']:,} GPUs"
    return [(f"Grafana: every query of every dashboard at {', '.join(r['ranges'])} ({scope})",
             f"slowest {r['slowest_query_ms']:.0f} ms ({r['slowest_query']}); {r['queries_over_target']} of "
             f"{r['queries_timed']} over 150 ms", "<= 150 ms each", r["queries_over_target"] == 0)]


def _storage(r: dict[str, Any]) -> list[Row]:
    gpu, proc = r["compact_bytes_per_gpu_sample"], r["compact_bytes_per_process_sample"]
    share = r["compact_cpu_share_of_ingest"]
    return [("compact tier, bytes per GPU sample", f"{gpu} B (raw {r['raw_bytes_per_gpu_sample']} B)", "<= 30",
             gpu <= 30),
            ("compact tier, bytes per process sample", f"{proc} B (raw {r['raw_bytes_per_process_sample']} B)",
             "<= 15", proc <= 15),
            ("compaction CPU / ingest CPU (database side)", f"{share:.1%}", "< 1 %", share < 0.01)]


def _notify(r: dict[str, Any]) -> list[Row]:
    return [(f"flag's first cycle -> webhook receiver ({r['delivered']} of {r['flags']} flags)",
             f"median {r['median_s']} s, max {r['max_s']} s", "<= 60 s",
             r["max_s"] is not None and r["max_s"] <= 60 and r["delivered"] == r["flags"])]


def _capture(r: dict[str, Any]) -> list[Row]:
    return [("a rank's throughput while its stacks are sampled (per CPU-second; wall)",
             f"median {r['per_cpu_ratio_median']:.3f}; wall {r['throughput_ratio_median']:.3f} "
             f"(machine noise {r['noise_percent_median']} %)", ">= 0.98", r["per_cpu_ratio_median"] >= 0.98)]


def _trace(r: dict[str, Any]) -> list[Row]:
    return [("jp.step() with traces allowed vs not, between traces", f"{r['extra_us_per_step_median']:+.2f} us a step "
             f"(median of {r['rounds']}; {r['us_per_step']['plain']} us without)", "<= 2 % of a 1 ms step (20 us)",
             r["extra_us_per_step_median"] <= 20)]


def _watch(r: dict[str, Any]) -> list[Row]:
    return [("`jobpulse watch`: start-up to COMMAND running", f"median {r['startup_s_median']:.2f} s, "
             f"min {r['startup_s_min']:.2f} s", "<= 10 s", r["startup_s_median"] <= 10)]


def _versus(r: dict[str, Any]) -> list[Row]:
    above, total, us = r["cpu_ratio_above_idle"], r["cpu_ratio_in_all"], r["cpu_us_per_gpu_sample"]
    rows: list[Row] = []
    for load, label in (("gpus only", ""), ("processes", ", 4 process samples a GPU")):
        for store, name, target in (("prometheus", "Prometheus", "<= 1.0"), ("victoriametrics", "VictoriaMetrics", "")):
            a, t = above[store][load], total[store][load]
            rows.append((f"CPU per GPU sample above idle vs {name} scraping the same {r['gpus']} GPUs{label}",
                         f"{a['median']:.2f} x (min {a['min']:.2f}; {us[load]['jobpulse_above_idle']['median']:.0f} vs "
                         f"{us[load][store + '_above_idle']['median']:.0f} us); in all {t['median']:.2f} x (min {t['min']:.2f})",
                         target, a["median"] <= 1.0 if target else None))
    disk = r["disk_bytes_per_gpu_sample"]
    for store, name, target in (("prometheus", "Prometheus' blocks", ""), ("victoriametrics", "VictoriaMetrics", "<= 1.0")):
        rows.append((f"disk per GPU sample vs {name}, same noisy history",
                     f"{r['disk_ratio'][store]:.2f} x ({disk['jobpulse']:.1f} vs {disk[store]:.1f} B)", target,
                     r["disk_ratio"][store] <= 1.0 if target else None))
    rows.append(("database CPU per GPU sample, Citus (coordinator + 2 workers) vs one server",
                 "not measured" if r["citus_cpu_ratio_to_single"] is None else
                 f"{r['citus_cpu_ratio_to_single']:.2f} x (storing {r['citus']['storing_ratio']['median']:.2f} x; were its"
                 f" fold one server's, {r['citus']['ratio_with_one_servers_fold']['median']:.2f} x)",
                 "<= 2.0", None if r["citus_cpu_ratio_to_single"] is None else r["citus_cpu_ratio_to_single"] <= 2.0))
    return rows


HEADLINES: dict[str, Callable[[Any], list[Row]]] = {
    "ingest": _ingest, "agent_overhead": _agent, "events": _events, "latency": _latency, "rules": _rules,
    "grafana": _grafana, "storage": _storage, "notify_latency": _notify, "capture_overhead": _capture, "trace_overhead": _trace,
    "watch_startup": _watch, "versus_tsdb": _versus,
}


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    from jobpulse.collector.embedded.postgres import find_bindir

    pg = subprocess.run([str(find_bindir() / "postgres"), "--version"], capture_output=True, text=True).stdout
    return {"cpu": re.sub(r"\s+", " ", cpu), "cores": os.cpu_count(), "memory_gib": round(mem / 2**20, 1),
            "os": platform.platform(), "python": platform.python_version(), "postgresql": pg.strip()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated subset of: " + ", ".join(BENCHMARKS)
                    + "; earlier names: " + ", ".join(f"{old} ({new})" for old, new in ALIASES.items()))
    ap.add_argument("--quick", action="store_true", help="small sizes: check that they run")
    args = ap.parse_args()
    names = [ALIASES.get(n, n) for n in args.only.split(",")] if args.only else list(BENCHMARKS)
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        ap.error(f"unknown benchmark: {', '.join(unknown)}")

    summary: dict[str, Any] = {"machine": machine(), "quick": args.quick, "results": {}, "seconds": {}}
    failed = []
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        t = time.monotonic()
        full, quick = BENCHMARKS[name]
        rc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *(quick if args.quick else full)]).returncode
        summary["seconds"][name] = round(time.monotonic() - t)
        if rc != 0:
            failed.append(name)
            continue
        summary["results"][name] = json.loads((RESULTS / f"{name}.json").read_text())

    rows = [row for name, result in summary["results"].items() for row in HEADLINES[name](result)]
    summary["table"] = [dict(zip(("figure", "value", "target", "met"), row)) for row in rows]
    m = summary["machine"]
    print(f"\njobpulse benchmarks{' (--quick: not figures to quote)' if args.quick else ''} — {m['cpu']}, "
          f"{m['cores']} cores, {m['memory_gib']} GiB, {m['postgresql']}, Python {m['python']}\n")
    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"{'figure':{width}}  {'value':46}  {'target':14}  met")
    for figure, value, target, met in rows:
        print(f"{figure:{width}}  {value:46}  {target:14}  {'' if met is None else 'yes' if met else 'NO'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\nwrote {RESULTS / 'summary.json'}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
