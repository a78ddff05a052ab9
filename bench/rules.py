"""Rule-cycle benchmark (not a test): one collector watching a large cluster.

Seeds PostgreSQL with 2,000 running GPUs (250 nodes x 8, 500 jobs x 4 GPUs) and 1 Hz history
covering the rules' whole look-back window — GPU samples through the same staging-table, move
and roll-up SQL as ingest, one rank process per GPU — then times full rule cycles
(`rule_engine.evaluate`: statistics, rules, flag upserts and closes, commit).

    python bench/rules.py [--gpus 2000] [--cycles 5]

Prints a table and writes bench/results/rules.json. Target: under 1 s per cycle.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import psycopg
from seed import database, seed  # noqa: E402  (bench/ is run as scripts)

from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.thresholds import Thresholds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2000)
    ap.add_argument("--cycles", type=int, default=5)
    args = ap.parse_args()
    thresholds = Thresholds()
    window = int(thresholds.lookback.total_seconds())

    with database("rules") as pg:
        t0 = time.perf_counter()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            seed(conn, args.gpus, window, gpus_per_job=4)
            rows = conn.execute("SELECT (SELECT count(*) FROM jobpulse.gpu_samples),"
                                " (SELECT count(*) FROM jobpulse.gpu_rollup WHERE width_s = 10),"
                                " (SELECT count(*) FROM jobpulse.process_samples)").fetchone()
        seeded = time.perf_counter() - t0
        cycles = []
        with psycopg.connect(pg.dsn) as conn:
            for _ in range(args.cycles):
                cycles.append(evaluate(conn, thresholds))
            flags = dict(conn.execute("SELECT rule_id, count(*) FROM jobpulse.job_flags WHERE ended_at IS NULL"
                                      " GROUP BY 1").fetchall())
        secs = [c.seconds for c in cycles]
        machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        print(f"\njobpulse rule-cycle benchmark — {machine}, PostgreSQL at {pg.bindir}")
        print(f"{cycles[0].gpus:,} running GPUs in {cycles[0].jobs} jobs, {window} s of 1 Hz history: "
              f"{rows[0]:,} GPU samples, {rows[1]:,} 10 s roll-up rows, {rows[2]:,} process samples "
              f"(seeded in {seeded:.0f} s)\n")
        print(f"{'cycle':>5} {'seconds':>8} {'hits':>6} {'flags kept':>10} {'closed':>7}")
        for i, c in enumerate(cycles, 1):
            print(f"{i:>5} {c.seconds:>8.3f} {c.hits:>6} {c.opened_or_kept:>10} {c.closed:>7}")
        print(f"\nmedian {statistics.median(secs):.3f} s, max {max(secs):.3f} s per cycle (target < 1 s); "
              f"open flags {flags}")
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / "rules.json").write_text(json.dumps(
            {"machine": machine, "gpus": cycles[0].gpus, "jobs": cycles[0].jobs, "history_s": window,
             "gpu_samples": rows[0], "cycle_seconds": [round(s, 3) for s in secs],
             "median_s": round(statistics.median(secs), 3), "max_s": round(max(secs), 3), "open_flags": flags},
            indent=2))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
