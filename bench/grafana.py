"""Grafana benchmark (not a test): every panel, variable and annotation query of every dashboard,
expanded as Grafana expands it, at the ranges people pick (15 min, 1 h, 6 h, 24 h, 7 d), with
Grafana's $__interval for a ~1,000 px wide panel.

- The job and node-health dashboards over one job of 64 GPUs (8 nodes) sampled at 1 Hz for
  `--hours` (default 24): 5.5 million GPU samples and as many process samples, a step event
  every 10 s per rank, stored and rolled up by the ingest SQL.
- The cluster dashboard over a messy cluster of `--cluster-gpus` running GPUs (default 8,000;
  bench/seed.py's rule-cycle cluster: jobs of 1-64 GPUs with staggered starts up to 6 h back,
  ended jobs, free GPUs, 10 s roll-ups for the last hour, 300 s ones since each job began), and
  the node-health dashboard there for one rack (8 nodes) and for every node (All). The per-node
  and per-job sums the cluster panels read (the pyramid) hold a week: the last 6 hours repeated
  back (`week_of_pyramid`), so 24 h and 7 d read a day's and a week's rows.

    python bench/grafana.py [--hours 24] [--gpus 64] [--cluster-gpus 8000] [--runs 3]

`--gpus 0` skips the job case, `--cluster-gpus 0` the cluster case. The cluster case also times
the pyramid build (collector/store/tiers/pyramid.py): its first run over the seeded hours, then the
leader's per-minute run (min and median of `--runs`).

Prints a table per dashboard and writes bench/results/grafana.json (`slowest_query_ms` over all
dashboards and ranges). Target: every query <= 150 ms at every range.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from seed import database, seed, seed_cluster

from jobpulse.collector.grafana import dashboards
from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.tiers import partitions, pyramid, rollup

sys.path.insert(0, str(Path(__file__).parent.parent))
from tests.grafana_macros import Var, expand
from tests.test_grafana import targets

TARGET_MS = 150
RACK = 8  # nodes of the node-health dashboard opened for one rack
# Range -> Grafana's $__interval for a ~1,000 px panel (range / 1,000, rounded as Grafana rounds).
RANGES = {"15m": (timedelta(minutes=15), 1_000), "1h": (timedelta(hours=1), 5_000),
          "6h": (timedelta(hours=6), 20_000), "24h": (timedelta(hours=24), 60_000),
          "7d": (timedelta(days=7), 600_000)}


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


def time_dashboard(conn: psycopg.Connection, name: str, variables: dict[str, Var], end: datetime,
                   runs: int) -> list[dict[str, Any]]:
    """Each query of one dashboard at each range: warmed once (a refreshing dashboard hits a warm
    cache), then the min and median of `runs` executions."""
    rows = []
    for what, _, sql in targets(dashboards.as_json(dashboards.DASHBOARDS[name]())):
        row: dict[str, Any] = {"dashboard": name, "query": what}
        for label, (span, interval_ms) in RANGES.items():
            query = expand(sql, variables, end - span, end, interval_ms)
            conn.execute(query).fetchall()
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                n = len(conn.execute(query).fetchall())
                times.append((time.perf_counter() - t) * 1000)
            row[label] = {"min_ms": round(min(times), 1), "median_ms": round(statistics.median(times), 1), "rows": n}
        rows.append(row)
    return rows


def job_case(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    seconds = int(args.hours * 3600)
    with database("grafana") as pg:
        t0 = time.perf_counter()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            seed(conn, args.gpus, seconds, gpus_per_job=args.gpus)
            conn.execute("INSERT INTO jobpulse.job_gpus (cluster, job_id, node, gpu_uuid, gpu_index)"
                         " SELECT 'big', '0', 'node' || (g / 8), 'GPU-' || g, g %% 8 FROM generate_series(0, %s - 1) g",
                         (args.gpus,))
            events(conn, args.gpus, seconds)
            conn.execute("VACUUM (ANALYZE)")  # as autovacuum has on a cluster's older data: not during the timing
            samples = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]
        with psycopg.connect(pg.dsn) as conn:
            evaluate(conn, Thresholds())
        seeded = time.perf_counter() - t0
        nodes = tuple(f"node{i}" for i in range((args.gpus + 7) // 8))
        variables = {"cluster": Var(("big",)), "job": Var(("0",)), "node": Var(nodes, multi=True),
                     "gpu": Var(tuple(f"GPU-{g}" for g in range(args.gpus)), multi=True),
                     "rank": Var(tuple(str(r) for r in range(args.gpus)), multi=True)}
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            end = conn.execute("SELECT now()").fetchone()[0]
            rows = [*time_dashboard(conn, "job", variables, end, args.runs),
                    *time_dashboard(conn, "node-health", variables, end, args.runs)]
    case = {"gpus": args.gpus, "nodes": len(nodes), "hours": args.hours, "gpu_samples": samples,
            "seeded_s": round(seeded)}
    return case, rows


def cluster_case(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with database("grafana-cluster") as pg:
        t0 = time.perf_counter()
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            cluster = seed_cluster(conn, args.cluster_gpus, timedelta(hours=1), ahead=timedelta(0),
                                   fine_history=timedelta(0))
        with psycopg.connect(pg.dsn) as conn:
            evaluate(conn, Thresholds())
        seeded = time.perf_counter() - t0
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            built = pyramid.build(conn)  # catching up with the seeded hours, as a first leader run does
            for table in pyramid.TABLES:  # as autovacuum does after such an insert: the planner needs the counts
                conn.execute(f"ANALYZE jobpulse.{table}")
            # then the leader's run every minute: the last RELOOK minutes and the open bucket again
            runs = [pyramid.build(conn).seconds * 1000 for _ in range(args.runs)]
            build = {"catch_up_s": round(built.seconds, 1), "catch_up_rows": built.rows,
                     "per_run_min_ms": round(min(runs)), "per_run_median_ms": round(statistics.median(runs)),
                     **week_of_pyramid(conn)}
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            nodes = tuple(r[0] for r in conn.execute("SELECT DISTINCT node FROM jobpulse.topology ORDER BY 1"))
            variables = {"cluster": Var(("big",)), "group_by": Var(("user_name",))}
            end = conn.execute("SELECT now()").fetchone()[0]
            rows = time_dashboard(conn, "cluster", variables, end, args.runs)
            # node health as admins open it for a rack (8 nodes), and with every node chosen (All)
            for label, chosen in ((f"{RACK} nodes", nodes[:RACK]), (f"all {len(nodes):,} nodes", nodes)):
                for row in time_dashboard(conn, "node-health", {**variables, "node": Var(chosen, multi=True)}, end,
                                          args.runs):
                    rows.append({**row, "dashboard": f"node-health ({label})"})
    case = {"running_gpus": cluster.running_gpus, "topology_gpus": cluster.topology_gpus,
            "running_jobs": cluster.running_jobs, "ended_jobs": cluster.ended_jobs, "rows": cluster.rows,
            "seeded_s": round(seeded), "pyramid_build": build}
    return case, rows


def week_of_pyramid(conn: psycopg.Connection, days: int = 7) -> dict[str, Any]:
    """A week of history for the cluster panels: the seeded cluster's last 6 hours of pyramid rows
    repeated back over ``days`` (the same jobs and nodes, ~2,750 (job, node) rows per 300 s bucket),
    then its coarse levels made from them by the pyramid's own code. The seed holds 6 hours; without
    this, 24 h and 7 d would read what 6 h reads."""
    (now,) = conn.execute("SELECT now()").fetchone()
    repeats = days * 4 + 1
    partitions.ensure(conn, [(now - timedelta(days=d)).date() for d in range(days + 3)], list(pyramid.TABLES))
    t0 = time.perf_counter()
    for table in pyramid.TABLES:
        cols = [r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                                           " AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (f"jobpulse.{table}",))]
        shifted = ", ".join("s.bucket - make_interval(hours => 6 * k)" if c == "bucket" else f"s.{c}" for c in cols)
        conn.execute(f"INSERT INTO jobpulse.{table} ({', '.join(cols)}) SELECT {shifted} FROM jobpulse.{table} s,"
                     f" generate_series(1, {repeats}) k WHERE s.width_s = {pyramid.WIDTH_S}"
                     " AND s.bucket > %s - interval '6 hours' ON CONFLICT DO NOTHING", (now,))
    copied = time.perf_counter() - t0
    t0 = time.perf_counter()
    with conn.transaction():
        hour_rows = pyramid.rebuild_coarse(conn, now - timedelta(days=days + 2), now)
    for table in pyramid.TABLES:
        conn.execute(f"ANALYZE jobpulse.{table}")
    rows = conn.execute("SELECT count(*) FROM jobpulse.node_job_rollup").fetchone()[0]
    return {"week_rows_node_job_rollup": rows, "week_copied_s": round(copied, 1),
            "week_coarse_rows": hour_rows, "week_coarse_built_s": round(time.perf_counter() - t0, 1)}


def print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title} — median ms (rows)")
    print(f"{'query':52}" + "".join(f"{label:>16}" for label in RANGES))
    for r in rows:
        cells = "".join(f"{r[label]['median_ms']:>9} ({r[label]['rows']:>5})" for label in RANGES)
        print(f"{(r['dashboard'] + ': ' + r['query'])[:52]:52}{cells}")


def main() -> int:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--gpus", type=int, default=64, help="GPUs of the job case (0: skip it)")
    ap.add_argument("--cluster-gpus", type=int, default=8000, help="running GPUs of the cluster case (0: skip)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    load_before = os.getloadavg()
    print(f"\njobpulse Grafana benchmark — {machine}; load average before {load_before[0]:.1f}")
    result: dict[str, Any] = {"machine": machine, "load_average_before": round(load_before[0], 2), "runs": args.runs,
                              "ranges": {k: {"seconds": int(v[0].total_seconds()), "interval_ms": v[1]}
                                         for k, v in RANGES.items()}, "queries": []}
    if args.gpus:
        job, job_rows = job_case(args)
        print(f"job case: {job['gpus']} GPUs on {job['nodes']} nodes, {job['hours']:g} h at 1 Hz = "
              f"{job['gpu_samples']:,} GPU samples (seeded in {job['seeded_s']} s); min and median of {args.runs} runs")
        print_rows("job and node-health dashboards, one 64-GPU job", job_rows)
        result.update(job_case=job, queries=job_rows)
    if args.cluster_gpus:
        cluster, cluster_rows = cluster_case(args)
        print(f"\ncluster case: {cluster['running_gpus']:,} running GPUs, {cluster['topology_gpus']:,} in the "
              f"topology, {cluster['running_jobs']} running and {cluster['ended_jobs']} ended jobs, rows {cluster['rows']}"
              f" (seeded in {cluster['seeded_s']} s); pyramid {cluster['pyramid_build']}")
        print_rows("cluster and node-health dashboards, the whole cluster", cluster_rows)
        result["cluster_case"] = cluster
        result["queries"] += cluster_rows
    result["load_average_after"] = round(os.getloadavg()[0], 2)
    timings = [(r[label]["median_ms"], r["dashboard"], r["query"], label) for r in result["queries"] for label in RANGES]
    worst = max(timings)
    over = sorted((t for t in timings if t[0] > TARGET_MS), reverse=True)
    result.update(slowest_query_ms=worst[0], slowest_query=f"{worst[1]}: {worst[2]} at {worst[3]}",
                  queries_over_target=len(over), queries_timed=len(timings))
    print(f"\nslowest: {worst[0]} ms ({worst[1]}: {worst[2]} at {worst[3]}); {len(over)} of {len(timings)} "
          f"query-ranges over {TARGET_MS} ms")
    for ms, dash, what, label in over:
        print(f"  {ms:>8} ms  {dash}: {what} at {label}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "grafana.json").write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
