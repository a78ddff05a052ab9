"""Sample-to-queryable latency and storage per GPU sample (not a test), in two worlds:

- agents: 8 real agents x 8 fake GPUs (64 GPUs) at 1 Hz ship to a real collector on PostgreSQL;
- simulated: 1,000 nodes (8,000 GPUs, 32 processes each) at 1 Hz, each node's batch built with the
  agent's own code and sent at its own phase of the second; its samples were taken up to a second
  before (the agent flushes once a second, whenever its sampling happened), as a real agent's are.

A reader polls every 20 ms and records, for every sample of the GPUs it watches, the time from the
sample's timestamp until a SELECT returned it. It reads the way a dashboard does: one index range
scan per GPU from its last seen time (`gpu_samples (node, gpu_uuid, ts)`), never a scan of the table.
In the simulated world it watches a fixed subset of nodes (all share one collector and one queue).
Then the bytes PostgreSQL holds per GPU sample (heap, indexes, roll-ups).

    python bench/latency.py [--seconds 60] [--sim-nodes 1000] [--sim-seconds 20] [--watch-nodes 50]

Prints a table and writes bench/results/latency.json (``p99_s``: the worse of the two worlds).
Target: p99 <= 1.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from harness import (
    SimulatedNode,
    build_fake_nvml,
    finish,
    load_note,
    post_all,
    register,
    request,
    scenario,
    start_agent,
    start_collector,
    stop,
)
from seed import database

POLL_S = 0.02
# Each watched GPU's samples newer than the last seen: an index range scan per GPU.
NEW_ROWS = """
SELECT w.node, w.gpu_uuid, s.ts
  FROM unnest(%s::text[], %s::text[], %s::timestamptz[]) AS w(node, gpu_uuid, since)
  JOIN LATERAL (SELECT g.ts FROM jobpulse.gpu_samples g
                 WHERE g.node = w.node AND g.gpu_uuid = w.gpu_uuid AND g.ts > w.since) s ON true"""
# what the GPU samples cost on disk: the partitions of the raw table with their indexes, and the
# roll-ups the collector keeps beside them
STORAGE = """
SELECT c.relname, coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'jobpulse'
  LEFT JOIN pg_inherits i ON i.inhparent = c.oid
 WHERE c.relname IN ('gpu_samples', 'gpu_rollup', 'gpu_rollup_10s')
 GROUP BY 1"""


def footprint(dsn: str) -> dict[str, int]:
    """GPU samples stored and the bytes of the tables holding them, after a VACUUM (dead
    roll-up row versions reclaimed, as autovacuum does)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM jobpulse.gpu_samples, jobpulse.gpu_rollup, jobpulse.gpu_rollup_10s")
        sizes = {name: int(size) for name, size in conn.execute(STORAGE).fetchall()}
        return {**sizes, "samples": conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]}


class Reader(threading.Thread):
    """Polls for the watched GPUs' new samples; keeps each one's latency in seconds."""

    def __init__(self, dsn: str, gpus: list[tuple[str, str]]) -> None:
        super().__init__(daemon=True)
        self.dsn, self.gpus = dsn, gpus
        self.latencies: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        nodes, uuids = [g[0] for g in self.gpus], [g[1] for g in self.gpus]
        since = {g: datetime.now(UTC) for g in self.gpus}
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stopping.is_set():
                rows = conn.execute(NEW_ROWS, (nodes, uuids, [since[g] for g in self.gpus])).fetchall()
                seen = time.time()
                for node, uuid, ts in rows:
                    self.latencies.append(seen - ts.timestamp())
                    since[node, uuid] = max(since[node, uuid], ts)
                time.sleep(POLL_S)


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(p * 10) - 1]


def summary(latencies: list[float]) -> dict[str, float]:
    return {"samples_seen": len(latencies), "p50_s": round(percentile(latencies, 50), 3),
            "p99_s": round(percentile(latencies, 99), 3), "max_s": round(max(latencies), 3)}


def with_agents(work: Path, dsn: str, nodes: int, gpus_per_node: int, seconds: float) -> dict[str, Any]:
    """Real agents on fake GPUs; latencies of every GPU sample, and the storage they took."""
    agents: list[subprocess.Popen[bytes]] = []
    build_fake_nvml(work)
    col, port = start_collector(work, dsn, "--rules-interval", "5")
    try:
        for n in range(nodes):
            node = work / f"node{n}"
            node.mkdir()
            scenario(node / "s.scn", gpus_per_node, [], uuid=f"GPU-node{n}")
            shutil.copy(work / "libnvidia-ml.so.1", node)
            agents.append(start_agent(node, node / "s.scn", f"http://127.0.0.1:{port}", "--interval", "1",
                                      node=f"node{n}")[0])
            register(node, str(800 + n), gpus_per_node)
        time.sleep(10)  # warm-up: imports, first batches, topology snapshots, partitions
        before = footprint(dsn)
        reader = Reader(dsn, [(f"node{n}", f"GPU-node{n}-{i}") for n in range(nodes) for i in range(gpus_per_node)])
        reader.start()
        time.sleep(seconds)
        reader.stopping.set()
        reader.join()
        for agent in agents:
            stop(agent)
        time.sleep(2)  # the last batches land
        after = footprint(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            row_bytes = conn.execute("SELECT avg(pg_column_size(s.*)) FROM jobpulse.gpu_samples s").fetchone()[0]
    finally:
        for agent in agents:
            stop(agent)
        col.terminate()
        col.wait(30)
    samples = after["samples"] - before["samples"]
    return {"gpus": nodes * gpus_per_node, "nodes": nodes, "seconds": seconds, **summary(reader.latencies),
            "samples_expected": int(nodes * gpus_per_node * seconds), "gpu_samples_stored": samples,
            "bytes_per_gpu_sample": round((after["gpu_samples"] - before["gpu_samples"]) / samples),
            "rollup_bytes_per_gpu_sample": round(sum(after[t] - before[t] for t in ("gpu_rollup", "gpu_rollup_10s"))
                                                 / samples),
            "row_bytes": round(float(row_bytes))}


def simulated(work: Path, dsn: str, nodes: int, seconds: int, watch: int) -> dict[str, Any]:
    """``nodes`` simulated nodes at 1 Hz for ``seconds``; latencies of the watched nodes' GPUs over
    all but the first 5 s."""
    sims = [SimulatedNode(n) for n in range(nodes)]
    lead = 5.0 + nodes * seconds * 0.003  # time to build every batch before the first is due
    start = time.time() + lead
    plan = []  # (wall time to send, node, sample time)
    for k in range(seconds):
        for n, sim in enumerate(sims):
            at = start + k + n / nodes
            plan.append((at, sim, at - (n * 0.618034) % 1.0))
    plan.sort(key=lambda p: p[0])
    col, port = start_collector(work, dsn, "--rules-interval", "30")
    try:
        requests = [(at, request(port, sim.batch(datetime.fromtimestamp(ts, UTC))[1])) for at, sim, ts in plan]
        if time.time() > start:
            raise RuntimeError("building the batches took longer than planned: raise the lead time")
        reader = Reader(dsn, [(sim.node, uuid) for sim in sims[::max(1, nodes // watch)][:watch] for uuid in sim.uuids])
        threading.Timer(start + 5 - time.time(), reader.start).start()
        offset = time.monotonic() - time.time()
        done = asyncio.run(post_all(port, ((at + offset, data) for at, data in requests), connections=256))
        time.sleep(1.0)
        reader.stopping.set()
        reader.join()
    finally:
        col.terminate()
        col.wait(30)
    late = max(answered - due for due, answered in done)
    return {"gpus": nodes * 8, "nodes": nodes, "seconds": seconds, "watched_gpus": len(reader.gpus),
            **summary(reader.latencies), "latest_answer_after_due_s": round(late, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60, help="measured seconds with the real agents")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--sim-nodes", type=int, default=1000)
    ap.add_argument("--sim-seconds", type=int, default=20)
    ap.add_argument("--watch-nodes", type=int, default=50)
    args = ap.parse_args()
    note = load_note()
    result: dict[str, Any] = {"interval_s": 1.0, "poll_s": POLL_S,
                                 "conditions": f"{note}; the machine is shared with other test runs"}
    work = Path(tempfile.mkdtemp(prefix="jobpulse-latency-bench-"))
    try:
        with database("latency") as pg:
            (work / "agents").mkdir()
            result["agents"] = agents = with_agents(work / "agents", pg.dsn, args.nodes, args.gpus_per_node,
                                                    args.seconds)
        with database("latency-sim") as pg:
            (work / "sim").mkdir()
            result["simulated"] = sim = simulated(work / "sim", pg.dsn, args.sim_nodes, args.sim_seconds,
                                                  args.watch_nodes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["p99_s"] = max(agents["p99_s"], sim["p99_s"])
    print(f"\njobpulse sample-to-queryable latency — {os.cpu_count()} cores, Python {sys.version.split()[0]}; {note}")
    print(f"reader polls every {POLL_S * 1000:.0f} ms, one index range scan per watched GPU\n")
    print(f"{'world':34} {'samples seen':>12} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    for name, r in (("agents", agents), ("simulated", sim)):
        label = f"{r['nodes']} {'real agents' if name == 'agents' else 'simulated nodes'}, {r['gpus']} GPUs"
        print(f"{label:34} {r['samples_seen']:>12,} {r['p50_s']:>7} {r['p99_s']:>7} {r['max_s']:>7}")
    return finish("latency.json", result,
                  f"\nstorage: {agents['bytes_per_gpu_sample']} bytes per GPU sample in gpu_samples (heap + indexes; the row "
                  f"itself {agents['row_bytes']} bytes), +{agents['rollup_bytes_per_gpu_sample']} bytes of roll-ups")


if __name__ == "__main__":
    sys.exit(main())
