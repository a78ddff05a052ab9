"""Rule-cycle benchmark (not a test): one collector watching a cluster as it is, not as it starts.

For each size, a fresh PostgreSQL is seeded with a messy cluster (`seed.seed_cluster`): running jobs
of 1-64 GPUs with staggered starts on 8-GPU nodes, every GPU of every node in the topology (a fifth
held by no running job), the jobs that ended on those GPUs (some within the rules' window), process
samples of every rank and of data-loader workers, and faults. Then full rule cycles are timed
(`engine.evaluate`: read the inputs, judge every job and every unheld GPU, write the flags, commit)
with the block caches a running collector keeps: the first cycle reads the whole window (as after a
collector starts), the following ones what changed; min and median are over those.

    python bench/rules.py [--gpus 500,2000,8000] [--cycles 7] [--processes 0,2] [--citus [--shards 32]]

``--processes``: the ways of judging timed, alternated cycle by cycle on the same cluster: 0 in this
process (as a collector with `--rules-processes 0`), N in N rule processes (rules/workers.py).
Prints a table and writes bench/results/rules.json (``cycle_s_<N>_gpus``: the median cycle at N
running GPUs after the first, of the last way listed; ``by_processes``: every way's). Target: under
1 s per cycle at 8,000 running GPUs.

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
from seed import citus_database, database, seed_cluster

from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.inputs import SILENT, Blocks
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.rules.workers import Judges

FINE_HISTORY = timedelta(minutes=30)
"""10 s roll-ups kept before the window (a real day partition holds the whole day's)."""
AHEAD = timedelta(minutes=5)
"""Seeded data runs this far past the seeding's end; a cycle that starts later than this minus
inputs.SILENT would see GPUs stop reporting (an easier cycle), so timing stops there."""


def measure(gpus: int, cycles: int, thresholds: Thresholds, shards: int | None = None,
            processes: tuple[int, ...] = (0,)) -> dict[str, Any]:
    """Seed a cluster of ``gpus`` running GPUs in a fresh database (on Citus with ``shards`` shards
    per table group, if given) and time ``cycles`` cycles of each way of judging in ``processes``
    (0: in this process; N: N rule processes, `workers.Judges`), alternated cycle by cycle on the
    same cluster, each with its own caches."""
    with (database(f"rules-{gpus}") if shards is None else citus_database(f"rules-{gpus}", shards)) as pg:
        t0 = time.perf_counter()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            # Data runs a little past now, so every timed cycle sees GPUs that are still reporting.
            cluster = seed_cluster(conn, gpus, thresholds.lookback, ahead=AHEAD, fine_history=FINE_HISTORY)
        seeded = time.perf_counter() - t0
        live_until = time.monotonic() + (AHEAD - SILENT).total_seconds()
        # What the collector running the rules keeps between cycles: its blocks (with rule processes,
        # those of the GPUs no job holds, which it judges itself) and its rule processes.
        ways = {n: (Blocks(), Judges(pg.dsn, None, n) if n else None) for n in processes}
        results: dict[int, list[Any]] = {n: [] for n in processes}
        loads = [os.getloadavg()[0]]
        try:
            with psycopg.connect(pg.dsn) as conn:
                # Each way's first cycle reads the whole window (a collector that just started); the
                # others, what changed.
                while min(map(len, results.values())) < cycles and time.monotonic() < live_until:
                    for n, (blocks, judges) in ways.items():
                        results[n].append(evaluate(conn, thresholds, blocks, judges))
                flags = dict(conn.execute("SELECT rule_id, count(*) FROM jobpulse.job_flags WHERE ended_at IS NULL"
                                          " GROUP BY 1 ORDER BY 1").fetchall())
        finally:
            for _, judges in ways.values():
                if judges is not None:
                    judges.close()
        loads.append(os.getloadavg()[0])
    print(f"\n{cluster.running_gpus:,} running GPUs in {cluster.running_jobs:,} jobs; {cluster.topology_gpus:,} GPUs "
          f"in the topology; {cluster.ended_jobs:,} ended jobs; rows {cluster.rows} (seeded in {seeded:.0f} s); "
          f"load average {loads[0]:.1f} -> {loads[1]:.1f}")
    print(f"{'processes':>9} {'cycle':>5} {'seconds':>8} {'jobs':>6} {'GPUs':>6} {'hits':>6} {'closed':>7} "
          f"{'node flags':>10}")
    by_way = {}
    for n, rs in results.items():
        for i, r in enumerate(rs, 1):
            print(f"{n or 'this':>9} {i:>5} {r.seconds:>8.3f} {r.jobs:>6} {r.gpus:>6} {r.hits:>6} {r.closed:>7} "
                  f"{r.node_flags:>10}")
        first, secs = rs[0].seconds, [r.seconds for r in rs[1:]] or [rs[0].seconds]
        print(f"{n or 'in this'} process(es): first cycle (whole window) {first:.3f} s; then min {min(secs):.3f} s, "
              f"median {statistics.median(secs):.3f} s, max {max(secs):.3f} s over {len(secs)} cycles")
        by_way[n] = {"judged_jobs": rs[-1].jobs, "judged_gpus": rs[-1].gpus, "hits": [r.hits for r in rs],
                     "cycle_seconds": [round(r.seconds, 3) for r in rs], "first_cycle_s": round(first, 3),
                     "min_s": round(min(secs), 3), "median_s": round(statistics.median(secs), 3),
                     "max_s": round(max(secs), 3)}
    print(f"open flags {flags}")
    measured = by_way[processes[-1]]
    return {"running_gpus": cluster.running_gpus, "running_jobs": cluster.running_jobs,
            "topology_gpus": cluster.topology_gpus, "ended_jobs": cluster.ended_jobs, "rows": cluster.rows,
            "load_average": loads, "processes": processes[-1], **measured, "open_flags": flags,
            "by_processes": {str(n): r for n, r in by_way.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="500,2000,8000", help="running GPUs, comma-separated sizes")
    ap.add_argument("--cycles", type=int, default=7, help="cycles of each way of judging")
    ap.add_argument("--processes", default="0,2",
                    help="ways of judging, alternated cycle by cycle: 0 in this process, N in N rule processes; "
                         "the last is the one reported (default 0,2)")
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
    processes = tuple(int(n) for n in args.processes.split(","))
    sizes = {int(g): measure(int(g), args.cycles, thresholds, processes=processes) for g in args.gpus.split(",")}
    largest = sizes[max(sizes)]
    print(f"\n{'running GPUs':>12} {'processes':>9} {'min s':>7} {'median s':>9}")
    for gpus, r in sizes.items():
        for n, by in r["by_processes"].items():
            print(f"{gpus:>12,} {n if n != '0' else 'this':>9} {by['min_s']:>7.3f} {by['median_s']:>9.3f}")
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
