"""Rule-cycle benchmark (not a test): one collector watching a cluster as it is, not as it starts.

For each size, a fresh PostgreSQL is seeded with a messy cluster (`seed.seed_cluster`): running jobs
of 1-64 GPUs with staggered starts on 8-GPU nodes, every GPU of every node in the topology (a fifth
held by no running job), the jobs that ended on those GPUs (some within the rules' window), process
samples of every rank and of data-loader workers, and faults. Then full rule cycles are timed
(`engine.evaluate`: read the inputs, judge every job and every unheld GPU, write the flags, commit)
with the block caches a running collector keeps: the first cycle reads the whole window (as after a
collector starts), the following ones what changed; min and median are over those.

    python bench/rules.py [--gpus 500,2000,8000] [--cycles 7] [--citus [--shards 32]]

Prints a table and writes bench/results/rules.json (``cycle_s_<N>_gpus``: the median cycle at N
running GPUs after the first). Target: under 1 s per cycle at 8,000 running GPUs.

``--citus``: each size on one server and on a Citus cluster started on this machine (coordinator and
two workers, the schema distributed by `jobpulse db upgrade --citus`), one after the other in the
same run; writes bench/results/rules_citus.json. All three servers share this machine's cores, so
the figures show Citus' overhead here, not its speed-up on separate workers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from seed import citus_database, database, seed_cluster  # noqa: E402  (bench/ is run as scripts)

from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.rule_inputs import SILENT, Blocks

FINE_HISTORY = timedelta(minutes=30)
"""10 s roll-ups kept before the window (a real day partition holds the whole day's)."""
AHEAD = timedelta(minutes=5)
"""Seeded data runs this far past the seeding's end; a cycle that starts later than this minus
rule_inputs.SILENT would see GPUs stop reporting (an easier cycle), so timing stops there."""


def measure(gpus: int, cycles: int, thresholds: Thresholds, shards: int | None = None) -> dict[str, Any]:
    """Seed a cluster of ``gpus`` running GPUs in a fresh database (on Citus with ``shards`` shards
    per table group, if given) and time ``cycles`` cycles."""
    with (database(f"rules-{gpus}") if shards is None else citus_database(f"rules-{gpus}", shards)) as pg:
        t0 = time.perf_counter()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            # Data runs a little past now, so every timed cycle sees GPUs that are still reporting.
            cluster = seed_cluster(conn, gpus, thresholds.lookback, ahead=AHEAD, fine_history=FINE_HISTORY)
        seeded = time.perf_counter() - t0
        live_until = time.monotonic() + (AHEAD - SILENT).total_seconds()
        blocks = Blocks()  # what the collector running the rules keeps between cycles
        results = []
        with psycopg.connect(pg.dsn) as conn:
            # The first cycle reads the whole window (a collector that just started); the others, what changed.
            while len(results) < cycles and time.monotonic() < live_until:
                results.append(evaluate(conn, thresholds, blocks))
            flags = dict(conn.execute("SELECT rule_id, count(*) FROM jobpulse.job_flags WHERE ended_at IS NULL"
                                      " GROUP BY 1 ORDER BY 1").fetchall())
    first, secs = results[0].seconds, [r.seconds for r in results[1:]] or [results[0].seconds]
    print(f"\n{cluster.running_gpus:,} running GPUs in {cluster.running_jobs:,} jobs; {cluster.topology_gpus:,} GPUs "
          f"in the topology; {cluster.ended_jobs:,} ended jobs; rows {cluster.rows} (seeded in {seeded:.0f} s)")
    print(f"{'cycle':>5} {'seconds':>8} {'jobs':>6} {'GPUs':>6} {'hits':>6} {'closed':>7} {'node flags':>10}")
    for i, r in enumerate(results, 1):
        print(f"{i:>5} {r.seconds:>8.3f} {r.jobs:>6} {r.gpus:>6} {r.hits:>6} {r.closed:>7} {r.node_flags:>10}")
    print(f"first cycle (whole window) {first:.3f} s; then min {min(secs):.3f} s, median "
          f"{statistics.median(secs):.3f} s, max {max(secs):.3f} s over {len(secs)} cycles; open flags {flags}")
    return {"running_gpus": cluster.running_gpus, "running_jobs": cluster.running_jobs,
            "topology_gpus": cluster.topology_gpus, "ended_jobs": cluster.ended_jobs, "rows": cluster.rows,
            "judged_jobs": results[-1].jobs, "judged_gpus": results[-1].gpus,
            "cycle_seconds": [round(r.seconds, 3) for r in results], "first_cycle_s": round(first, 3),
            "min_s": round(min(secs), 3),
            "median_s": round(statistics.median(secs), 3), "max_s": round(max(secs), 3), "open_flags": flags}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="500,2000,8000", help="running GPUs, comma-separated sizes")
    ap.add_argument("--cycles", type=int, default=7)
    ap.add_argument("--note", default="", help="conditions of the run (e.g. other load on the machine)")
    ap.add_argument("--citus", action="store_true", help="each size on one server and on a 3-node Citus cluster")
    ap.add_argument("--shards", type=int, default=32, help="with --citus: shards per table group (default 32)")
    args = ap.parse_args()
    thresholds = Thresholds()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"jobpulse rule-cycle benchmark — {machine}; window {thresholds.lookback}")
    if args.citus:
        return compare_citus([int(g) for g in args.gpus.split(",")], args.cycles, thresholds, args.shards, machine,
                             args.note)
    sizes = {int(g): measure(int(g), args.cycles, thresholds) for g in args.gpus.split(",")}
    largest = sizes[max(sizes)]
    print(f"\n{'running GPUs':>12} {'min s':>7} {'median s':>9}")
    for gpus, r in sizes.items():
        print(f"{gpus:>12,} {r['min_s']:>7.3f} {r['median_s']:>9.3f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "rules.json").write_text(json.dumps(
        {"machine": machine, "note": args.note, "history_s": int(thresholds.lookback.total_seconds()),
         **{f"cycle_s_{g}_gpus": r["median_s"] for g, r in sizes.items()},
         # the largest size, under the keys the `python -m bench` summary reads
         "gpus": largest["running_gpus"], "median_s": largest["median_s"], "max_s": largest["max_s"],
         "sizes": {str(g): r for g, r in sizes.items()}}, indent=2))
    return 0


def compare_citus(sizes: list[int], cycles: int, thresholds: Thresholds, shards: int, machine: str,
                  note: str) -> int:
    """Each size on one server, then on the Citus cluster; a table of both and their ratio."""
    load = os.getloadavg()[0]
    runs = {g: {"one server": measure(g, cycles, thresholds), "citus": measure(g, cycles, thresholds, shards)}
            for g in sizes}
    print(f"\nrule cycles, one server vs Citus (coordinator + 2 workers, {shards} shards, all on this machine)")
    print(f"{'running GPUs':>12} {'':>11} {'first s':>8} {'min s':>7} {'median s':>9}")
    for g, by in runs.items():
        for name, r in by.items():
            print(f"{g:>12,} {name:>11} {r['first_cycle_s']:>8.3f} {r['min_s']:>7.3f} {r['median_s']:>9.3f}")
        print(f"{'':>12} {'ratio':>11} {by['citus']['first_cycle_s'] / by['one server']['first_cycle_s']:>8.2f} "
              f"{by['citus']['min_s'] / by['one server']['min_s']:>7.2f} "
              f"{by['citus']['median_s'] / by['one server']['median_s']:>9.2f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "rules_citus.json").write_text(json.dumps(
        {"machine": machine, "note": note, "load_average_at_start": load, "shards": shards,
         "cluster": "coordinator + 2 workers on this machine", "sizes": {str(g): by for g, by in runs.items()}},
        indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
