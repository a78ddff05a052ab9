"""Sample-to-queryable latency and storage per GPU sample (not a test): 8 real agents x 8 fake
GPUs (64 GPUs) at 1 Hz ship to a real collector on PostgreSQL; a reader polls every 20 ms and
records, for every GPU sample, the time from the agent's sample timestamp until a SELECT
returned it. Then the bytes PostgreSQL holds per GPU sample (heap, indexes, roll-ups).

    python bench/latency.py [--seconds 120] [--nodes 8] [--gpus-per-node 8]

Prints a table and writes bench/results/latency.json. Target: p99 <= 2 s at 1 Hz.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import psycopg
from harness import ROOT, build_fake_nvml, register, scenario, start_agent, stop
from seed import database

from jobpulse.collector.demo.embedded_postgres import free_port

POLL_S = 0.02
# newest rows per job since its watermark: each agent ships its own job's batches in order
NEW_ROWS = """
SELECT s.job_id, s.ts, count(*)
  FROM unnest(%s::text[], %s::timestamptz[]) AS w(job_id, since)
  JOIN LATERAL (SELECT job_id, ts FROM jobpulse.gpu_samples g
                 WHERE g.job_id = w.job_id AND g.ts > w.since) s ON true
 GROUP BY 1, 2"""
# what the GPU samples cost on disk: the partitions of the raw table with their indexes, and the
# roll-ups the collector keeps beside them
STORAGE = """
SELECT c.relname, coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'jobpulse'
  LEFT JOIN pg_inherits i ON i.inhparent = c.oid
 WHERE c.relname IN ('gpu_samples', 'gpu_rollup')
 GROUP BY 1"""


def collector(work: Path, dsn: str) -> tuple[subprocess.Popen[bytes], str]:
    (work / "tokens").write_text("bench\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobpulse.collector.cli", "collector", "serve", "--dsn", dsn,
         "--listen", f"127.0.0.1:{port}", "--token-file", str(work / "tokens"), "--rules-interval", "5",
         "--log-level", "warning"], stderr=(work / "collector.log").open("wb"))
    for _ in range(300):
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz")
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError((work / "collector.log").read_text()) from None
            time.sleep(0.1)
    raise RuntimeError("the collector did not start")


def footprint(dsn: str) -> dict[str, int]:
    """GPU samples stored and the bytes of the tables holding them, after a VACUUM (dead
    roll-up row versions reclaimed, as autovacuum does)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM jobpulse.gpu_samples, jobpulse.gpu_rollup")
        sizes = {name: int(size) for name, size in conn.execute(STORAGE).fetchall()}
        return {**sizes, "samples": conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]}


def measure(dsn: str, jobs: list[str], seconds: float) -> list[float]:
    """Latency in seconds of every GPU sample that became visible during `seconds`."""
    latencies: list[float] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = datetime.now(timezone.utc)
        since = [start] * len(jobs)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            rows = conn.execute(NEW_ROWS, (jobs, since)).fetchall()
            seen = time.time()
            for job_id, ts, n in rows:
                latencies += [seen - ts.timestamp()] * n
                i = jobs.index(job_id)
                since[i] = max(since[i], ts)
            time.sleep(POLL_S)
    return latencies


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(p * 10) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    args = ap.parse_args()
    gpus = args.nodes * args.gpus_per_node
    work = Path(tempfile.mkdtemp(prefix="jobpulse-latency-bench-"))
    agents: list[subprocess.Popen[bytes]] = []
    col = None
    try:
        with database("latency") as pg:
            build_fake_nvml(work)
            col, url = collector(work, pg.dsn)
            jobs = [str(800 + n) for n in range(args.nodes)]
            for n, job in enumerate(jobs):
                node = work / f"node{n}"
                node.mkdir()
                scenario(node / "s.scn", args.gpus_per_node, [], uuid=f"GPU-node{n}")
                shutil.copy(work / "libnvidia-ml.so.1", node)
                agents.append(start_agent(node, node / "s.scn", url, "--interval", "1", node=f"node{n}")[0])
                register(node, job, args.gpus_per_node)
            time.sleep(10)  # warm-up: imports, first batches, topology snapshots, partitions
            before = footprint(pg.dsn)
            latencies = measure(pg.dsn, jobs, args.seconds)
            for agent in agents:
                stop(agent)
            time.sleep(2)  # the last batches land
            after = footprint(pg.dsn)
            samples = after["samples"] - before["samples"]
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                row_bytes = conn.execute("SELECT avg(pg_column_size(s.*)) FROM jobpulse.gpu_samples s").fetchone()[0]
            col.terminate()
            col.wait(30)
        expected = gpus * args.seconds
        result = {
            "gpus": gpus, "nodes": args.nodes, "interval_s": 1.0, "poll_s": POLL_S, "seconds": args.seconds,
            "samples_seen": len(latencies), "samples_expected": int(expected),
            "p50_s": round(percentile(latencies, 50), 3), "p99_s": round(percentile(latencies, 99), 3),
            "max_s": round(max(latencies), 3),
            "gpu_samples_stored": samples,
            "bytes_per_gpu_sample": round((after["gpu_samples"] - before["gpu_samples"]) / samples),
            "rollup_bytes_per_gpu_sample": round((after["gpu_rollup"] - before["gpu_rollup"]) / samples),
            "row_bytes": round(float(row_bytes)),
        }
        print(f"\njobpulse sample-to-queryable latency — {os.cpu_count()} cores, Python {sys.version.split()[0]}")
        print(f"{args.nodes} agents x {args.gpus_per_node} GPUs at 1 Hz -> collector -> PostgreSQL; "
              f"reader polls every {POLL_S * 1000:.0f} ms for {args.seconds:g} s")
        print(f"{'GPU samples seen':>17} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
        print(f"{len(latencies):>17,} {result['p50_s']:>7} {result['p99_s']:>7} {result['max_s']:>7}")
        print(f"\nstorage growth over {samples:,} GPU samples: {result['bytes_per_gpu_sample']} bytes each in gpu_samples "
              f"(heap + indexes; the row itself {result['row_bytes']} bytes), "
              f"+{result['rollup_bytes_per_gpu_sample']} bytes of roll-ups")
        out = ROOT / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / "latency.json").write_text(json.dumps(result, indent=2))
        return 0
    finally:
        for agent in agents:
            stop(agent)
        if col and col.poll() is None:
            col.terminate()
            col.wait(30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
