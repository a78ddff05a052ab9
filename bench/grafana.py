"""Grafana panel benchmark (not a test): every query of the job dashboard for a 24 h job on 64 GPUs
(8 nodes) sampled at 1 Hz — 5.5 million GPU samples and as many process samples, steps every 10 s
per rank — expanded as Grafana expands it, over the full 24 h and over the last 15 minutes.

    python bench/grafana.py [--hours 24] [--gpus 64]

Prints a table and writes bench/results/grafana.json. Target: under 200 ms per panel.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
from seed import database, seed  # noqa: E402  (bench/ is run as scripts)

from jobpulse.collector.grafana import dashboards
from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store import rollup

sys.path.insert(0, str(Path(__file__).parent.parent))
from tests.grafana_macros import Var, expand  # noqa: E402  (the same expansion the tests check)
from tests.test_grafana import targets  # noqa: E402


def events(conn: psycopg.Connection, gpus: int, seconds: int) -> None:
    """A step event every 10 s per rank, an epoch phase every 30 min, a log line every minute,
    stored and rolled up by the same SQL as ingest."""
    stage = f"pg_temp.{rollup.stage_name('events')}"
    with conn.transaction():
        conn.execute(
            f"INSERT INTO {stage} (cluster, node, ts, pid, level, kind, job_id, rank, name, message, attrs)"
            " SELECT 'big', 'node' || (g / 8), now() - make_interval(secs => s), 1000 + g, 'info', 'step', '0', g,"
            " 'train', 'step', jsonb_build_object('step', s, 'samples_per_s', 400 + g)"
            " FROM generate_series(0, %s - 1) g, generate_series(0, %s, 10) s", (gpus, seconds))
        conn.execute(
            f"INSERT INTO {stage} (cluster, node, ts, pid, level, kind, job_id, rank, name, message, attrs)"
            " SELECT 'big', 'node0', now() - make_interval(secs => s), 1000, 'info', 'phase_end', '0', 0, 'epoch',"
            " 'epoch', jsonb_build_object('duration_s', 1790) FROM generate_series(0, %s, 1800) s", (seconds,))
        conn.execute(
            f"INSERT INTO {stage} (cluster, node, ts, pid, level, kind, job_id, rank, message, attrs)"
            " SELECT 'big', 'node0', now() - make_interval(secs => s), 1000, 'info', 'log', '0', 0, 'checkpoint saved',"
            " '{}' FROM generate_series(0, %s, 60) s", (seconds,))
        conn.execute(rollup.move("events"))
        conn.execute(rollup.FOLDS["events"])
    conn.execute("ANALYZE jobpulse.events")
    conn.execute("ANALYZE jobpulse.step_rollup")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    seconds = int(args.hours * 3600)

    with database("grafana") as pg:
        t0 = time.perf_counter()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            seed(conn, args.gpus, seconds, gpus_per_job=args.gpus)
            conn.execute("INSERT INTO jobpulse.job_gpus (cluster, job_id, node, gpu_uuid, gpu_index)"
                         " SELECT 'big', '0', 'node' || (g / 8), 'GPU-' || g, g %% 8 FROM generate_series(0, %s - 1) g",
                         (args.gpus,))
            events(conn, args.gpus, seconds)
            samples = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]
        with psycopg.connect(pg.dsn) as conn:
            evaluate(conn, Thresholds())
        seeded = time.perf_counter() - t0

        end = datetime.now(timezone.utc)
        nodes = tuple(f"node{i}" for i in range((args.gpus + 7) // 8))
        variables = {"cluster": Var(("big",)), "job": Var(("0",)), "node": Var(nodes, multi=True),
                     "gpu": Var(tuple(f"GPU-{g}" for g in range(args.gpus)), multi=True),
                     "rank": Var(tuple(str(r) for r in range(args.gpus)), multi=True)}
        # $__interval as Grafana sets it for a ~1,000 px wide panel (rounded: 86 s -> 1 min)
        ranges = {"full": (timedelta(seconds=seconds), 60_000 if seconds >= 86_400 else max(1000, seconds)),
                  "15m": (timedelta(minutes=15), 1000)}
        rows = []
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            for what, _, sql in targets(dashboards.as_json(dashboards.job_dashboard())):
                row = {"query": what}
                for label, (span, interval_ms) in ranges.items():
                    query = expand(sql, variables, end - span, end, interval_ms)
                    conn.execute(query).fetchall()  # warm the cache, as a refreshing dashboard does
                    times = []
                    for _ in range(args.runs):
                        t = time.perf_counter()
                        n = len(conn.execute(query).fetchall())
                        times.append(time.perf_counter() - t)
                    row[f"{label}_ms"] = round(statistics.median(times) * 1000, 1)
                    row[f"{label}_rows"] = n
                rows.append(row)

        machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        print(f"\njobpulse Grafana panel benchmark — {machine}, PostgreSQL at {pg.bindir}")
        print(f"one job: {args.gpus} GPUs on {len(nodes)} nodes, {args.hours:g} h at 1 Hz = {samples:,} GPU samples "
              f"(seeded in {seeded:.0f} s); median of {args.runs} runs\n")
        print(f"{'query':58} {f'{args.hours:g}h ms':>8} {'rows':>7} {'15m ms':>8} {'rows':>7}")
        for r in rows:
            print(f"{r['query'][:58]:58} {r['full_ms']:>8} {r['full_rows']:>7} {r['15m_ms']:>8} {r['15m_rows']:>7}")
        worst = max(max(r["full_ms"], r["15m_ms"]) for r in rows)
        print(f"\nslowest: {worst} ms (target < 200 ms per panel)")
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / "grafana.json").write_text(json.dumps({"machine": machine, "gpus": args.gpus, "hours": args.hours,
                                                      "gpu_samples": samples, "queries": rows,
                                                      "slowest_ms": worst}, indent=2))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
