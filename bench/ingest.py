"""Ingest benchmark (not a test): node batches per second through a real collector process into
PostgreSQL, against raw binary COPY of the same rows, alternated round by round in one run.

Each simulated node is one agent's second: 8 GPU samples and 32 process samples, built with the
agent's own batch code and gzipped as it ships. A round sends ``--seconds`` of ``--nodes`` nodes
over ``--connections`` keep-alive connections as fast as the collector answers; the round before
it COPYs the same rows (GPU and process samples) into tables of a schema of their own, created
LIKE the collector's with the same partitions and indexes, in one COPY per table and one commit.
Each round also reports the CPU the collector, PostgreSQL and this benchmark's own HTTP client
used per batch: the client shares the cores here but runs on the nodes in a cluster, so
``server_bound_nodes_per_s`` (cores / (database + collector CPU per batch)) is what these cores
would carry with the senders elsewhere: arithmetic from measured CPU, not a measured rate.
Then, without HTTP, the store path itself: ms of one batch stored alone (one transaction each)
and in groups (group commit), and, where PostgreSQL ships pg_stat_statements, the server's time
per batch of each statement in the groups.

    python bench/ingest.py [--nodes 1000] [--seconds 2] [--rounds 5] [--connections 64]

Prints a table and writes bench/results/ingest.json.

``--citus [--shards N]``: instead, the same rounds sent to two collectors in turn (the order
alternating round by round), one writing to one server, one to a Citus cluster started on this
machine (coordinator and two workers, the schema distributed by `jobpulse db upgrade --citus`):
node batches/s and database CPU per batch of each, and the store path (groups of 64) on each.
Writes bench/results/ingest_citus.json. All three servers share this machine's cores: the figures
show Citus' overhead here, not its speed-up on separate workers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import psycopg
from harness import SimulatedNode, load_note, post_all, request, save, start_collector, tree_cpu_s
from seed import citus_database, database

from jobpulse.collector.embedded.postgres import find_bindir
from jobpulse.collector.ingest.validate import time_span
from jobpulse.collector.store.database import BATCH_TABLES, Storage, ValidBatch
from jobpulse.schema import wire

TABLES = ("gpu_samples", "process_samples")
STORE_GROUP = 64


def baseline_tables(conn: psycopg.Connection) -> None:
    """Schema `baseline`: the sample tables as the collector has them (columns, partitions by day,
    indexes), empty, for the raw COPY to write into."""
    conn.execute("CREATE SCHEMA baseline")
    for table in TABLES:
        conn.execute(f"CREATE TABLE baseline.{table} (LIKE jobpulse.{table} INCLUDING ALL) PARTITION BY RANGE (ts)")
        for (bounds,) in conn.execute(
                "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                f" WHERE i.inhparent = 'jobpulse.{table}'::regclass").fetchall():
            day = bounds.split("'")[1][:10].replace("-", "")
            conn.execute(f"CREATE TABLE baseline.{table}_p{day} PARTITION OF baseline.{table} {bounds}")
    for table in TABLES:
        ours, theirs = (conn.execute("SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
                                     (schema, table)).fetchone()[0] for schema in ("jobpulse", "baseline"))
        if ours != theirs:
            raise RuntimeError(f"baseline.{table} has {theirs} indexes, jobpulse.{table} {ours}")


def raw_copy(conn: psycopg.Connection, batches: list[wire.Batch]) -> float:
    """Seconds to COPY the batches' sample rows into the baseline tables (one COPY each, one commit)."""
    types = dict(conn.execute(
        "SELECT a.attrelid::regclass::text || '.' || a.attname, format_type(a.atttypid, a.atttypmod)"
        " FROM pg_attribute a WHERE a.attrelid IN ('baseline.gpu_samples'::regclass,"
        " 'baseline.process_samples'::regclass) AND a.attnum > 0").fetchall())
    rows = {}
    for table in TABLES:
        attr = BATCH_TABLES[table][0]
        rows[table] = [(b.agent.cluster, b.agent.node, *msgspec.structs.astuple(r)) for b in batches
                       for r in getattr(b, attr)]
    start = time.perf_counter()
    with conn.cursor() as cur:
        for table in TABLES:
            cols = ["cluster", "node", *BATCH_TABLES[table][1].__struct_fields__]
            with cur.copy(f"COPY baseline.{table} ({', '.join(cols)}) FROM STDIN (FORMAT BINARY)") as cp:
                cp.set_types([types[f"baseline.{table}.{c}"] for c in cols])
                for row in rows[table]:
                    cp.write_row(row)
    conn.commit()
    return time.perf_counter() - start


def build(nodes: list[SimulatedNode], seconds: int, t0: datetime) -> tuple[list[wire.Batch], list[bytes]]:
    batches, bodies = [], []
    for s in range(seconds):
        for node in nodes:
            batch, body = node.batch(t0 + timedelta(seconds=s))
            batches.append(batch)
            bodies.append(body)
    return batches, bodies


def sizes(conn: psycopg.Connection) -> int:
    """Bytes the collector's tables hold (heap, indexes, roll-ups, ledger)."""
    return int(conn.execute(
        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'jobpulse' AND c.relkind = 'r'").fetchone()[0])


async def store_path(dsn: str, batches: list[wire.Batch], group: int) -> float:
    """ms of database work per batch, storing ``batches`` in groups of ``group`` straight through
    the collector's storage (no HTTP)."""
    storage = Storage(dsn, pool_max=1)
    await storage.open()
    valid = [ValidBatch.spanning(b, *time_span(b)) for b in batches]
    await storage.store(valid[:1])  # the pool's connection, the schema check, partitions
    start = time.perf_counter()
    for i in range(1, len(valid), group):
        await storage.store(valid[i:i + group])
    seconds = time.perf_counter() - start
    await storage.close()
    return seconds / (len(valid) - 1) * 1000


def store_batches(cluster: str, count: int, t0: datetime) -> list[wire.Batch]:
    """``count`` node batches of ``STORE_GROUP`` nodes of a cluster of their own: a batch already
    stored would be a replay (a ledger lookup, nothing written), so every measurement gets new ones."""
    nodes = [SimulatedNode(n, cluster=cluster) for n in range(STORE_GROUP)]
    return build(nodes, -(-count // STORE_GROUP), t0)[0][:count]


def statement_settings() -> dict[str, str]:
    """Server options loading pg_stat_statements where this PostgreSQL ships it: the store path's
    server time is then broken down by statement."""
    shipped = (find_bindir().parent / "lib" / "pg_stat_statements.so").exists()
    return {"shared_preload_libraries": "pg_stat_statements"} if shipped else {}


def reset_statements(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def statement_ms(dsn: str, batches: int) -> dict[str, float]:
    """Server ms per batch of each statement since the reset (the 8 costliest), named by its first words."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT query, total_exec_time FROM pg_stat_statements"
                            " WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY 2 DESC LIMIT 8").fetchall()
    return {" ".join(query.split()[:3]): round(ms / batches, 3) for query, ms in rows}


def postmasters(datadirs: list[Path]) -> list[int]:
    return [int((d / "postmaster.pid").read_text().split()[0]) for d in datadirs]


def compare_citus(args: argparse.Namespace, note: str) -> int:
    """One server vs the Citus cluster, alternated round by round in one run."""
    work = Path(tempfile.mkdtemp(prefix="jobpulse-ingest-citus-bench-"))
    nodes = [SimulatedNode(n) for n in range(args.nodes)]
    t0 = datetime.now(UTC) - timedelta(seconds=args.seconds)  # live data (older marks the pyramid's late hours)
    rounds: dict[str, list[dict[str, float]]] = {"one server": [], "citus": []}
    cols = []
    with database("ingest") as pg, citus_database("ingest-citus", args.shards) as cluster:
        try:
            targets = {"one server": (pg.dsn, postmasters([pg.datadir])),
                       "citus": (cluster.dsn, postmasters([s.datadir for s in cluster.servers]))}
            ports = {}
            for name, (dsn, _) in targets.items():
                (work / name).mkdir()
                col, ports[name] = start_collector(work / name, dsn)
                cols.append(col)
            for r in range(args.rounds + 1):  # round 0 warms up (connections, partitions, caches)
                batches, bodies = build(nodes, args.seconds, t0 + timedelta(seconds=r * args.seconds))
                order = list(targets) if r % 2 else list(reversed(targets))
                for name in order:
                    pids = targets[name][1]
                    cpu = [tree_cpu_s(p) for p in pids]
                    start = time.monotonic()
                    retried: list[float] = []
                    asyncio.run(post_all(ports[name], ((0.0, request(ports[name], b)) for b in bodies),
                                         args.connections, retried))
                    http_s = time.monotonic() - start
                    used = [tree_cpu_s(p) - c for p, c in zip(pids, cpu, strict=True)]
                    db_cpu = sum(used)
                    if r:  # the first server is the coordinator (Citus) or the one server
                        rounds[name].append({"nodes_per_s": round(len(batches) / http_s),
                                             "db_cpu_ms_per_batch": round(db_cpu / len(batches) * 1000, 3),
                                             "first_server_cpu_ms_per_batch": round(used[0] / len(batches) * 1000, 3),
                                             "retried_503": len(retried)})
                    print(f"round {r}{' (warm-up)' if not r else ''} {name}: {len(batches) / http_s:,.0f} node batches/s,"
                          f" database CPU {db_cpu / len(batches) * 1000:.2f} ms/batch", flush=True)
            for name, (dsn, _) in targets.items():
                with psycopg.connect(dsn) as conn:
                    stored = conn.execute("SELECT count(*) FROM jobpulse.ingest_batches").fetchone()[0]
                if stored != len(nodes) * args.seconds * (args.rounds + 1):
                    raise RuntimeError(f"{name}: ledger holds {stored} batches, sent "
                                       f"{len(nodes) * args.seconds * (args.rounds + 1)}")
            for col in cols:
                col.terminate()
                col.wait(30)
            cols = []
            batches = store_batches("store-path", args.store_batches, datetime.now(UTC))
            store_ms = {name: round(asyncio.run(store_path(dsn, batches, STORE_GROUP)), 3)
                        for name, (dsn, _) in targets.items()}
        finally:
            for col in cols:
                col.terminate()
                col.wait(30)

    def stats(name: str, key: str) -> dict[str, float]:
        values = [r[key] for r in rounds[name]]
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    result = {"machine": machine, "conditions": f"{note}; coordinator, 2 workers, one server and both collectors"
                                                " share this machine",
              "nodes": args.nodes, "seconds_per_round": args.seconds, "rounds": args.rounds,
              "connections": args.connections, "shards": args.shards,
              **{name: {"nodes_per_s": stats(name, "nodes_per_s"),
                        "db_cpu_ms_per_batch": stats(name, "db_cpu_ms_per_batch"),
                        "coordinator_cpu_ms_per_batch": stats(name, "first_server_cpu_ms_per_batch"),
                        f"store_ms_per_batch_groups_of_{STORE_GROUP}": store_ms[name]} for name in rounds},
              "rounds_detail": rounds}
    print(f"\njobpulse ingest, one server vs Citus (coordinator + 2 workers, {args.shards or 'default'} shards) — {machine}; {note}")
    print(f"{args.nodes} nodes x {args.seconds} s per round, {args.connections} connections, {args.rounds} rounds"
          " after a warm-up, alternated\n")
    print(f"{'':34} {'min':>9} {'median':>9} {'max':>9}")
    for name in rounds:
        for label, key in (("node batches/s", "nodes_per_s"), ("database CPU ms/batch (all servers)",
                                                                "db_cpu_ms_per_batch"),
                           ("coordinator CPU ms/batch", "first_server_cpu_ms_per_batch")):
            st = stats(name, key)
            print(f"{name + ' ' + label:34} {st['min']:>9,} {st['median']:>9,} {st['max']:>9,}")
    print(f"\nstore path without HTTP, groups of {STORE_GROUP}: "
          + ", ".join(f"{name} {ms} ms a batch" for name, ms in store_ms.items())
          + f"; Citus / one server: {store_ms['citus'] / store_ms['one server']:.2f}")
    save("ingest_citus.json", result)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=2, help="seconds of every node's data per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--store-batches", type=int, default=1025, help="batches for the store-path comparison")
    ap.add_argument("--collector-pythonpath", metavar="DIR",
                    help="run the collector of another version installed there (e.g. main's, for before/after)")
    ap.add_argument("--collector-options", default="", metavar="OPTIONS",
                    help="`collector serve` options of the measured collector (e.g. \"--group-wait-ms 5\")")
    ap.add_argument("--out", default="ingest.json", help="file name under bench/results/")
    ap.add_argument("--citus", action="store_true", help="one server vs a 3-node Citus cluster (see above)")
    ap.add_argument("--shards", type=int, help="with --citus: shards per table group (default: `db upgrade --citus`'s)")
    args = ap.parse_args()
    note = load_note()
    if args.citus:
        return compare_citus(args, note)
    work = Path(tempfile.mkdtemp(prefix="jobpulse-ingest-bench-"))
    nodes = [SimulatedNode(n) for n in range(args.nodes)]
    t0 = datetime.now(UTC) - timedelta(seconds=args.seconds)  # live data (older marks the pyramid's late hours)
    rounds = []
    col = None
    settings = statement_settings()
    profiled = bool(settings) and not args.collector_pythonpath
    with database("ingest", settings) as pg:
        try:
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                baseline_tables(conn)
                if profiled:
                    conn.execute("CREATE EXTENSION pg_stat_statements")
            col, port = start_collector(work, pg.dsn, *shlex.split(args.collector_options),
                                        pythonpath=args.collector_pythonpath)
            postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])
            with psycopg.connect(pg.dsn) as conn:
                for r in range(args.rounds + 1):  # round 0 warms up (connections, partitions, caches)
                    batches, bodies = build(nodes, args.seconds, t0 + timedelta(seconds=r * args.seconds))
                    rows = sum(len(b.gpu_samples) + len(b.process_samples) for b in batches)
                    copy_s = raw_copy(conn, batches)
                    before_bytes = sizes(conn)
                    conn.commit()
                    cpu = (tree_cpu_s(postmaster), tree_cpu_s(col.pid), time.process_time())
                    start = time.monotonic()
                    retried: list[float] = []
                    asyncio.run(post_all(port, ((0.0, request(port, b)) for b in bodies), args.connections, retried))
                    http_s = time.monotonic() - start
                    client_cpu = time.process_time() - cpu[2]
                    db_cpu, col_cpu = tree_cpu_s(postmaster) - cpu[0], tree_cpu_s(col.pid) - cpu[1]
                    grown = sizes(conn) - before_bytes
                    conn.commit()
                    if r:
                        rounds.append({"batches": len(batches), "rows": rows, "copy_rows_per_s": round(rows / copy_s),
                                       "http_rows_per_s": round(rows / http_s),
                                       "nodes_per_s": round(len(batches) / http_s),
                                       "ratio_to_copy": round(copy_s / http_s, 3),
                                       "db_cpu_ms_per_batch": round(db_cpu / len(batches) * 1000, 3),
                                       "collector_cpu_ms_per_batch": round(col_cpu / len(batches) * 1000, 3),
                                       "client_cpu_ms_per_batch": round(client_cpu / len(batches) * 1000, 3),
                                       "server_bound_nodes_per_s": round(os.cpu_count() * len(batches) / (db_cpu + col_cpu)),
                                       "bytes_per_batch": round(grown / len(batches)), "retried_503": len(retried)})
                    print(f"round {r}{' (warm-up)' if not r else ''}: COPY {rows / copy_s:,.0f} rows/s, "
                          f"HTTP {len(batches) / http_s:,.0f} node batches/s = {rows / http_s:,.0f} rows/s "
                          f"({copy_s / http_s:.3f} x COPY)", flush=True)
                stored = conn.execute("SELECT count(*) FROM jobpulse.ingest_batches").fetchone()[0]
            if stored != len(nodes) * args.seconds * (args.rounds + 1):
                raise RuntimeError(f"ledger holds {stored} batches, sent {len(nodes) * args.seconds * (args.rounds + 1)}")
            col.terminate()
            col.wait(30)
            col = None
            store_ms, statements = {}, {}
            for g in () if args.collector_pythonpath else (1, STORE_GROUP):
                batches = store_batches(f"store-path-{g}", args.store_batches, datetime.now(UTC))
                if profiled:
                    reset_statements(pg.dsn)
                store_ms[str(g)] = round(asyncio.run(store_path(pg.dsn, batches, g)), 3)
                if profiled and g == STORE_GROUP:
                    statements = statement_ms(pg.dsn, len(batches))
        finally:
            if col is not None:
                col.terminate()
                col.wait(30)

    def stats(key: str) -> dict[str, float]:
        values = [r[key] for r in rounds]
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    result = {
        "machine": machine, "conditions": f"{note}; the machine is shared with other test runs: figures are "
                                          "contended, the ratio (same run, alternated) less so",
        "nodes": args.nodes, "seconds_per_round": args.seconds, "rounds": args.rounds,
        "connections": args.connections, "collector_options": args.collector_options, "rows_per_batch": rounds[0]["rows"] // rounds[0]["batches"],
        "node_batch_ratio_to_copy": stats("ratio_to_copy")["median"],
        "nodes_per_s": stats("nodes_per_s")["median"],
        "ratio_to_copy": stats("ratio_to_copy"), "nodes_per_s_stats": stats("nodes_per_s"),
        "copy_rows_per_s": stats("copy_rows_per_s"), "http_rows_per_s": stats("http_rows_per_s"),
        "db_cpu_ms_per_batch": stats("db_cpu_ms_per_batch"),
        "collector_cpu_ms_per_batch": stats("collector_cpu_ms_per_batch"),
        "client_cpu_ms_per_batch": stats("client_cpu_ms_per_batch"),
        "server_bound_nodes_per_s": stats("server_bound_nodes_per_s"),
        "bytes_per_batch": stats("bytes_per_batch"),
        "collector": args.collector_pythonpath or "this version",
        "store_ms_per_batch": store_ms and {"alone": store_ms["1"], f"groups_of_{STORE_GROUP}": store_ms[str(STORE_GROUP)]},
        f"statement_ms_per_batch_groups_of_{STORE_GROUP}": statements,
        "rounds_detail": rounds,
    }
    print(f"\njobpulse ingest benchmark — {machine}; {note}")
    print(f"{args.nodes} nodes x {args.seconds} s per round ({result['rows_per_batch']} rows a node batch: 8 GPU + "
          f"32 process samples), {args.connections} connections, {args.rounds} rounds after a warm-up\n")
    print(f"{'':28} {'min':>10} {'median':>10} {'max':>10}")
    for label, key in (("raw COPY rows/s", "copy_rows_per_s"), ("HTTP rows/s", "http_rows_per_s"),
                       ("node batches/s", "nodes_per_s_stats"), ("ratio to COPY", "ratio_to_copy"),
                       ("database CPU ms/batch", "db_cpu_ms_per_batch"),
                       ("collector CPU ms/batch", "collector_cpu_ms_per_batch"),
                       ("benchmark client CPU ms/batch", "client_cpu_ms_per_batch"),
                       ("cores / (db + collector CPU)", "server_bound_nodes_per_s"),
                       ("bytes stored/batch", "bytes_per_batch")):
        s = result[key]
        print(f"{label:28} {s['min']:>10,} {s['median']:>10,} {s['max']:>10,}")
    if store_ms:
        print(f"\nstore path without HTTP: {store_ms['1']} ms a batch alone, {store_ms[str(STORE_GROUP)]} ms in groups "
              f"of {STORE_GROUP}")
    if statements:
        print(f"server time per batch in groups of {STORE_GROUP}, by statement (pg_stat_statements):")
        for name, ms in statements.items():
            print(f"  {ms:>7} ms  {name}")
    save(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
