"""jobpulse against the stores a site would run instead (not a test): dcgm-exporter's metrics scraped
by Prometheus and by VictoriaMetrics, on the same GPUs in the same run. CPU and disk per GPU
sample, each store's.

The cluster: ``--nodes`` real agents on the fake NVML library, 8 busy H100s each, sampling at 1 Hz.
Every agent ships to a real collector (PostgreSQL, roll-ups folded behind ingest, rule cycles at the
collector's default interval) and serves dcgm-exporter's exposition (`--prometheus-listen`), which
Debian's Prometheus and Debian's VictoriaMetrics (single node, its defaults) both scrape every
second with one scrape configuration, keeping the `DCGM_FI_*` series as a dcgm-exporter scrape
would hold (`bench/tsdb.py`). The three run at once on the same samples, so each round's
disturbances hit all of them.

Before any agent starts, each store's idle cost is measured, each from its own processes: the
collector's leader, rule cycles and PostgreSQL's upkeep; each store's scrape loops finding no
target up. Rounds then alternate two loads: each GPU runs its rank and three data-loader workers
(32 processes a node, 4 process samples a GPU sample, which jobpulse keeps and neither store sees),
or the GPUs run no process. CPU is user + system time from /proc over each round: each store's
process; the collector and PostgreSQL (postmaster and every backend); per GPU sample each side
stored in the round (Prometheus: scrapes x GPUs, from its own `up` series afterwards;
VictoriaMetrics: its scrape counter). The headline is the ratio above idle (``cpu_ratio_above_idle``:
what one more GPU costs, each side's idle cost per second taken off its round), the total beside it
(``cpu_ratio_in_all``), min and median of the rounds. What the rounds shared the machine with
(``shared_with``): every core's busy time from /proc/stat less the run's own processes, and the load
average.

jobpulse's compaction is added per GPU sample, measured where it works as on a cluster: a chunk
(six hours of a node) is packed once, and most of a pass's cost is fixed per chunk (planning and
reading the chunk's statement, the coarse buckets and pyramid hours it rebuilds), so the run's few
minutes per chunk would charge a whole chunk's fixed cost to them (reported too, as
``compaction_cpu_us.live_run``); the figures come from compacting the disk comparison's history
(``--disk-hours``, 2 by default, a third of a chunk; a whole chunk, 6, charged the same), each tier
timed apart (GPU samples; the history's 4 process samples a GPU sample). The ingest ledger's fold
(the leader's, of days before yesterday) is charged the same way, from folding the live run's ledger.
Prometheus' counterpart is added to its side: every 2 hours it writes its head as a block (not
counted: the head's truncation and WAL checkpoint that follow, later compactions merging blocks),
which a run this short never reaches, so its head is written
as a block (the admin API's snapshot, the same writer) halfway through the rounds and at their end,
and what the second half's samples added to that write is charged per GPU sample
(``prometheus_head_block_per_gpu_sample``; the fixed cost of its series' index cancels; taken as 0
where the two readings' noise makes it negative).
VictoriaMetrics merges its parts as it runs: within its rounds.

The day's raw GPU partition and its 10 s buckets hold ``--day-hours`` (6) of 256 other GPUs before
the run starts, vacuumed and analyzed (``prefill_today``): a cluster's partitions are half a day old
on average, and new ones price small btrees and autovacuum's ANALYZE of a young table (every time it
grows by a tenth: every minute or so in a run's first minutes), neither what a cluster pays. (``--day-hours 0``:
new partitions, as before.)

Disk, after the run: jobpulse's tables after compaction, VACUUM and the 10 s buckets' retention
(compact tier, roll-ups and the dashboards' coarse pyramid apart; the raw tier is empty by then, the
10 s buckets' day dropped, their size before reported apart; the ledger from the live run, folded
into runs, above its empty table's pages); Prometheus' blocks made by
`promtool tsdb create-blocks-from openmetrics` from every sample it holds (read back through its
API), since a head block is cut only after 2 hours. VictoriaMetrics gets the same samples through
its import API into a store of its own, flushed and merged, every file of its folder counted.

Citus, last: node batches of 8 GPUs and 32 processes, as the agent sends them (`ChangeOnly`: these
processes do not change, so a row a process every ten seconds; ``citus_every_tick``: the same with
every tick's 32 rows, as from a node whose processes all change), stored through the collector's storage,
one second of every node a group, into one server and into a Citus cluster on this machine
(coordinator and two workers, `jobpulse db upgrade --citus` with its shard count; the roll-up
partitions of both tuned as a collector's leader leaves them), alternated round by round; the
database CPU (every server's postmaster and backends) per GPU sample of each, the leader's fold of
the roll-ups behind ingest included (every 5 seconds of samples), and their ratio
(``citus_cpu_ratio_to_single``). A group writes each table shard by shard, so what Citus adds per
GPU sample falls as groups grow: the ratio is taken where Citus is run, at a site past one server,
whose collectors each take a second of hundreds of nodes a group (``--citus-nodes``, 256), and again
at this run's ``--nodes`` (``citus_small_groups``, the same batches in smaller groups). Storing and
folding are measured apart, and ``ratio_with_one_servers_fold`` is what the ratio would be were
Citus' fold as cheap as one server's: the floor that its coordinator's routing of every stored row
sets. The collector's own work is the same code on both and is left out. All three servers share this
machine's cores, so this is Citus' overhead, not its speed-up.

jobpulse's side includes its rule cycles (every 30 s, the collector's default: reading the 10 s
buckets of every running job, judging, writing flags), which neither store runs here; ``--rules-interval
86400`` leaves them out of the rounds, to show what storing alone costs. ``--flush-interval S``: the
agents send a batch every S seconds (sampling stays at 1 Hz), what fewer, larger requests save a site
that accepts S seconds from sample to queryable. ``--no-citus`` leaves out the Citus part.

    python bench/versus_tsdb.py [--nodes 32] [--seconds 60] [--rounds 3] [--flush-interval 1]
        [--rules-interval 30] [--no-citus]   (python -m bench --only versus_tsdb)

32 nodes (256 GPUs) load a 2-core machine without saturating it: the agents take 0.4 to 0.8 of a
core (measured per round). At 8 nodes most of what
jobpulse spends is the fixed cost of a transaction a second (a group of 8 batches), which a cluster
of any size pays once a second: that size overstates its cost per GPU sample.

Writes bench/results/versus_tsdb.json.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import storage
import tsdb
from harness import (
    SimulatedNode,
    build_fake_nvml,
    load_note,
    register,
    save,
    scenario,
    start_agent,
    start_collector,
    stop,
    tree_cpu_s,
    trees_cpu_s,
)
from ingest import build, postmasters, reset_statements, statement_settings
from seed import citus_database, database

from jobpulse.collector.embedded.citus_cluster import citus_installed
from jobpulse.collector.embedded.postgres import free_port
from jobpulse.collector.ingest.validate import time_span
from jobpulse.collector.settings import CollectorSettings
from jobpulse.collector.store.database import Storage, ValidBatch
from jobpulse.collector.store.tiers import compact, fold, ledger, partitions, rollup
from jobpulse.schema.fields import GPU_FIELDS

GPUS = 8
NOT_SERVED = {f.name for f in GPU_FIELDS if not f.dcgm}  # kept by jobpulse, not in dcgm-exporter's exposition
MAX_SETS = 262_144  # the fake library's `set` entries (one per key)
PROCESSES = 32  # a rank per GPU and three data-loader workers per rank
FOLD_EVERY = 5  # groups (seconds) between the leader's folds (the collector's fold_interval_s)
# What jobpulse keeps of GPU samples: the raw tier (emptied by compaction), the compact tier, the
# roll-ups and the dashboards' pyramid, and the batch ledger that makes ingest idempotent.
GPU_TABLES = ("gpu_samples", "gpu_samples_compact", "gpu_rollup", "gpu_rollup_10s", "node_rollup",
              "node_job_rollup", "job_bucket_rollup", "ingest_batches")












def messy(gpus: int, seconds: int, r: random.Random) -> list[str]:
    """A second-by-second timeline of a training job's GPUs, as noisy as real ones: utilization
    around 85 % with an evaluation dip every 10 minutes, power following it with noise, drifting
    temperatures, clocks that sometimes drop, PCIe and NVLink rates that jump, GPM as noisy
    fractions. Constant values would flatter both stores (Prometheus' XOR chunks above all)."""
    lines = []
    for t in range(min(seconds, MAX_SETS // (gpus * 17) - 1)):  # 17 keys a second
        for i in range(gpus):
            u = r.uniform(0, 3) if t % 600 < 20 else min(100.0, max(0.0, r.gauss(85, 8)))
            lines.append(
                f"set {t} {i} sm {round(u)} mem {round(min(100.0, u * 0.45 + r.uniform(0, 10)))} "
                f"power_mw {round(90_000 + u * 5200 + r.gauss(0, 15_000))} "
                f"temp {62 + round(4 * math.sin(t / 300) + r.gauss(0, 0.7))} memtemp {71 + round(4 * math.sin(t / 300))} "
                f"smclk {1755 if r.random() < 0.02 else 1980} fb_used_mib {72_000 + i * 10 + t // 3600} "
                f"pcie_rx_kbs {r.randrange(40_000)} pcie_tx_kbs {r.randrange(8_000)} "
                f"nvl_rx_kbs {r.randrange(2_000_000, 8_000_000) if u > 10 else 0} "
                f"nvl_tx_kbs {r.randrange(2_000_000, 8_000_000) if u > 10 else 0} "
                f"gpm_sm {u * 0.92 + r.uniform(0, 3):.3f} gpm_occ {25 + r.uniform(0, 10):.3f} "
                f"gpm_tensor {u * 0.5 + r.uniform(0, 8):.3f} gpm_dram {35 + r.uniform(0, 20):.3f} "
                f"gpm_fp16 {u * 0.2 + r.uniform(0, 4):.3f} gpm_fp32 {1 + r.uniform(0, 2):.3f}\n")
    return lines


def history_as_exposition(conn: psycopg.Connection, path: Path) -> int:
    """The stored GPU samples as the agent's exposition shows them (each field dcgm-exporter names,
    scaled as it serves it, with its labels), one OpenMetrics series after another; how many samples."""
    exposed = [f for f in GPU_FIELDS if f.dcgm]
    n = 0
    with path.open("w") as out:
        for f in exposed:
            assert f.dcgm is not None
            with conn.transaction(), conn.cursor(name="history") as cur:  # streamed: hours of samples
                cur.itersize = 50_000
                cur.execute(f"SELECT node, gpu_uuid, gpu_index, job_id, extract(epoch FROM ts)::float8, {f.name}"
                            f" FROM jobpulse.gpu_samples WHERE {f.name} IS NOT NULL ORDER BY gpu_uuid, ts")
                for node, uuid, index, job, ts, value in cur:
                    out.write(f'{f.dcgm.name}{{gpu="{index}",UUID="{uuid}",device="nvidia{index}",'
                              f'pci_bus_id="00000000:{0x17 + index:02X}:00.0",modelName="NVIDIA H100 80GB HBM3",'
                              f'Hostname="{node}",DCGM_FI_DRIVER_VERSION="550.90.07",hpc_job="{job or ""}"}} '
                              f'{value * f.dcgm.scale} {ts:.3f}\n')
                    n += 1
        out.write("# EOF\n")
    return n


def disk(gpus: int, hours: float, work: Path) -> dict[str, Any]:
    """The same noisy history in every store, long enough that none pays mostly for its empty
    structures: jobpulse ingests it as the collector writes batches (a minute each) and compacts
    it; Prometheus gets every sample the agent's exposition would have shown, as a block, and
    VictoriaMetrics the same samples through its import API, merged."""
    seconds = int(hours * 3600)
    chunk_s = int(compact.CHUNK.total_seconds())  # the history starts a chunk, as steady state keeps them
    t0 = datetime.fromtimestamp(int((datetime.now(UTC) - timedelta(days=4)).timestamp()) // chunk_s * chunk_s, UTC)
    with database("versus-disk") as pg, psycopg.connect(pg.dsn, autocommit=True) as conn:
        partitions.ensure(conn, [t0.date() + timedelta(days=d) for d in range(-1, 3)])
        storage.ingest(conn, storage.generate(conn, gpus, seconds, t0, gpm=True))
        samples = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]  # type: ignore[index]
        exposed = history_as_exposition(conn, work / "history.om")
        conn.execute("VACUUM ANALYZE")  # as autovacuum would have, hours before the chunk is compacted
        postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])
        processes = conn.execute("SELECT count(*) FROM jobpulse.process_samples").fetchone()[0]  # type: ignore[index]
        compaction_s = {}
        for tier in compact.TIERS:
            spent = tree_cpu_s(postmaster) + tsdb.cpu_s(os.getpid())
            compact.compact(conn, duty=1.0, tiers=(tier,))
            compaction_s[tier.raw] = tree_cpu_s(postmaster) + tsdb.cpu_s(os.getpid()) - spent
        conn.execute("VACUUM ANALYZE")
        by_field = storage.per_field(conn)  # the compact tier's packed bytes a GPU sample, by field
        fine_kept = table_bytes(conn)["gpu_rollup_10s"]
        # The history's day is past the 10 s buckets' retention (the hot window and a day): the leader's
        # hourly maintenance drops it, as every day after its third.
        partitions.drop_expired(conn, 30)
        tables = {k: v for k, v in table_bytes(conn).items() if k in GPU_TABLES}
        other_days = other_days_bytes(conn, t0, t0 + timedelta(seconds=seconds))
        # What the roll-ups' half-empty pages (room for the in-place updates of ingest) cost once their
        # days are closed: the same partitions rewritten full, as a maintenance step could.
        for (part,) in conn.execute("SELECT relid::regclass::text FROM pg_partition_tree('jobpulse.gpu_rollup')"
                                    " WHERE isleaf").fetchall():
            conn.execute(f"ALTER TABLE {part} SET (fillfactor = 100)")
            conn.execute(f"VACUUM FULL {part}")
        repacked = table_bytes(conn)["gpu_rollup"]
    prom_bytes = tsdb.promtool_blocks(work / "history.om", work / "history-blocks")
    victoria = tsdb.victoria_bytes(work, work / "history.om")
    (work / "history.om").unlink()
    return {"gpus": gpus, "hours": hours, "gpu_samples": samples, "process_samples": processes,
            "compaction_cpu_s": compaction_s, "compact_bytes_by_field": by_field,
            "jobpulse_tables_bytes": tables, "jobpulse_other_days_bytes": other_days,
            "gpu_rollup_bytes_repacked": repacked, "gpu_rollup_10s_bytes_while_kept": fine_kept,
            "prometheus_samples": exposed, "prometheus_block_bytes": prom_bytes,
            "victoria_samples": victoria["rows"], "victoria_bytes": victoria["bytes"],
            "victoria_bytes_by_part": victoria["bytes_by_part"]}


def write_pids(pidfiles: list[Path], pids: list[int] | None) -> None:
    """Put the processes on the GPUs (their PIDs, as the driver would know them) or take them off."""
    for path, pid in zip(pidfiles, pids or [0] * len(pidfiles), strict=True):
        path.write_text(f"{pid}\n")


def table_bytes(conn: psycopg.Connection) -> dict[str, int]:
    """Bytes on disk of every jobpulse table (its partitions, indexes and TOAST included)."""
    rows = conn.execute(
        "SELECT c.relname, CASE WHEN c.relkind = 'r' THEN pg_total_relation_size(c.oid) ELSE"
        " (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree(c.oid)) END"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'jobpulse' AND c.relkind IN ('r', 'p') AND NOT c.relispartition").fetchall()
    return {name: int(size) for name, size in rows}


def other_days_bytes(conn: psycopg.Connection, start: datetime, end: datetime) -> dict[str, int]:
    """Of `table_bytes`, what the GPU tables' partitions of days outside [start, end] hold: a new
    database's empty days (today's, the days ahead, the day before), each partition's empty index
    and TOAST pages, which a cluster's day of samples fills and a short history only carries."""
    out = {}
    for table in GPU_TABLES:
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_partition_tree(%s::regclass) t"
            " JOIN pg_class c ON c.oid = t.relid WHERE t.isleaf", (f"jobpulse.{table}",)).fetchall()
        out[table] = sum(size for name, size in rows if name[-8:].isdigit()
                         and not start.date() <= datetime.strptime(name[-8:], "%Y%m%d").date() <= end.date())
    return out


def top_statements(dsn: str, seconds: float) -> dict[str, dict[str, float]]:
    """Where PostgreSQL's time went over the rounds: the 12 costliest statements, ms and calls a second."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT query, total_exec_time, calls FROM pg_stat_statements WHERE query NOT LIKE"
                            " '%pg_stat_statements%' ORDER BY 2 DESC LIMIT 12").fetchall()
    return {" ".join(q.split())[:90]: {"ms_per_s": round(ms / seconds, 3), "calls_per_s": round(n / seconds, 2)}
            for q, ms, n in rows}


def groups_stored(port: int) -> float:
    """Groups (transactions) the collector has stored so far, from its own metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("jobpulse_collector_group_batches_count"):
                return float(line.split()[-1])
    return 0.0


PREFILL = "prefill"  # the cluster of the rows the day held before the run


def prefill_today(dsn: str, gpus: int, hours: float) -> dict[str, Any]:
    """Today's raw GPU partition and 10 s buckets as a cluster's hold them after ``hours`` of the day
    (from midnight at most; ending 15 minutes before the run), vacuumed and analyzed as autovacuum
    would have: a run on new partitions prices their btrees' small depth and the frequent ANALYZE of
    a young table (autovacuum analyzes a table each time it grows by a tenth), neither a cluster's
    steady state. Rows of GPUs of their own, with jobs no rule reads (no job record)."""
    source = (f"(SELECT * FROM jobpulse.gpu_samples WHERE cluster = '{PREFILL}')")
    fine = next(q for q in rollup.fold("gpu_samples", source) if rollup.FINE_TABLE in q)
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "INSERT INTO jobpulse.gpu_samples (cluster, node, ts, gpu_uuid, gpu_index, job_id, sm_util, mem_util,"
            " power_w, power_limit_w, gpu_temp_c, sm_clock_mhz, fb_used_mib, fb_total_mib, pcie_gen, pcie_width,"
            " pcie_gen_max, pcie_width_max)"
            f" SELECT '{PREFILL}', 'prefill' || (g / 8), t, 'GPU-prefill-' || g, g %% 8, 'prefill-' || (g / 8), 80, 30,"
            " 500, 700, 60, 1980, 40000, 81559, 5, 16, 5, 16"
            " FROM generate_series(greatest(date_trunc('day', now(), 'UTC'), now() - %s * interval '1 hour'),"
            "                      now() - interval '15 minutes', interval '1 second') t,"
            " generate_series(0, %s - 1) g", (hours, gpus)).rowcount if hours > 0 else 0
        if rows:
            conn.execute(fine.encode())
            conn.execute("VACUUM (ANALYZE) jobpulse.gpu_samples, jobpulse.gpu_rollup_10s")
    return {"hours": hours, "gpu_samples": rows, "seconds": round(time.monotonic() - started, 1)}


def machine_busy_s() -> float:
    """CPU seconds every core of this machine has been busy so far (all processes, anyone's)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    build_fake_nvml(work)
    sleepers = [subprocess.Popen(["sleep", "100000"]) for _ in range(PROCESSES)]
    pidfiles = [work / f"pid{k}" for k in range(PROCESSES)]
    write_pids(pidfiles, None)
    agents: list[subprocess.Popen[bytes]] = []
    stores: list[tsdb.Store] = []
    duration = int(args.warmup + 2 * args.rounds * (args.seconds + 3) + 60)
    windows: list[dict[str, Any]] = []
    try:
        with database("versus", statement_settings()) as pg:
            prefilled = prefill_today(pg.dsn, args.nodes * GPUS, args.day_hours)
            col, port = start_collector(work, pg.dsn, "--group-wait-ms", str(args.group_wait_ms),
                                        "--group-max-wait-ms", str(args.group_max_wait_ms),
                                        "--rules-interval", str(args.rules_interval))
            postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])
            ports = [free_port() for _ in range(args.nodes)]
            targets = [f"127.0.0.1:{p}" for p in ports]
            prom = tsdb.start_prometheus(work, targets)
            victoria = tsdb.start_victoria(work, targets)
            stores = [prom, victoria]

            def cpu() -> dict[str, float]:
                """Each side's CPU so far, the agents', the machine's and this script's, read at one moment
                (one pass over /proc) with VictoriaMetrics' scrapes and the time."""
                trees = trees_cpu_s([col.pid, postmaster, *(a.pid for a in agents)])
                return {"prometheus": prom.cpu_s(), "victoriametrics": victoria.cpu_s(),
                        "collector": trees.pop(col.pid), "postgres": trees.pop(postmaster),
                        "agents": sum(trees.values()), "bench": tsdb.cpu_s(os.getpid()),
                        "machine": machine_busy_s(), "scrapes": victoria.scrapes(), "time": time.time()}

            # What each side costs with no GPU to watch, each apart (its own processes): the collector's
            # leader, rule cycles, PostgreSQL's own upkeep; each store's scrape loops finding no target up.
            time.sleep(5)
            with psycopg.connect(pg.dsn) as conn:  # the folded ledger's fixed cost: its empty table
                empty_ranges = table_bytes(conn)["ingest_ranges"]
            before = cpu()
            time.sleep(args.idle)
            after = cpu()
            idle = {"seconds": after["time"] - before["time"],
                    **{f"{k}_cpu_s": after[k] - before[k] for k in after if k not in ("scrapes", "time")},
                    "jobpulse_cpu_s": after["collector"] + after["postgres"] - before["collector"] - before["postgres"],
                    "load_average": os.getloadavg()}
            for n, metrics in enumerate(ports):
                node = work / f"node{n}"
                node.mkdir()
                scenario(node / "s.scn", GPUS, [], uuid=f"GPU-node{n}")
                with (node / "s.scn").open("a") as f:
                    f.writelines(f"procfile 0 {k % GPUS} {path} 4000 20 10\n" for k, path in enumerate(pidfiles))
                    f.writelines(messy(GPUS, duration, random.Random(n)))
                shutil.copy(work / "libnvidia-ml.so.1", node)
                agents.append(start_agent(node, node / "s.scn", f"http://127.0.0.1:{port}", "--interval", "1",
                                          "--flush-interval", str(args.flush_interval),
                                          "--prometheus-listen", f"127.0.0.1:{metrics}", node=f"node{n}")[0])
                register(node, str(900 + n), GPUS)
            began = time.time()
            time.sleep(args.warmup)  # imports, first batches, topology, partitions, the first scrapes
            if statement_settings():
                with psycopg.connect(pg.dsn, autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                reset_statements(pg.dsn)
            measured = time.monotonic()
            head_blocks: list[dict[str, float]] = []
            for i in range(2 * args.rounds):
                load = "processes" if i % 2 == 0 else "gpus only"
                if i == args.rounds:  # halfway, between rounds: Prometheus' head written as a block
                    head_blocks.append(head_block(prom, began))
                write_pids(pidfiles, [p.pid for p in sleepers] if load == "processes" else None)
                time.sleep(max(3.0, args.flush_interval + 2))  # the agents see the change, the last load's batches land
                groups = groups_stored(port)
                before = cpu()
                time.sleep(args.seconds)
                after = cpu()
                start, end = before["time"], after["time"]
                used = {k: after[k] - before[k] for k in after}
                ours = sum(v for k, v in used.items() if k not in ("machine", "scrapes", "time"))
                windows.append({"load": load, "start": start, "end": end, "prometheus_cpu_s": used["prometheus"],
                                "victoriametrics_cpu_s": used["victoriametrics"],
                                "collector_cpu_s": used["collector"], "postgres_cpu_s": used["postgres"],
                                "agents_cpu_s": used["agents"],
                                "victoriametrics_gpu_samples": round(used["scrapes"]) * GPUS,
                                # what the run shared the machine with: every core's busy time but the run's
                                "others_cores": round((used["machine"] - ours) / (end - start), 3),
                                "machine_busy_cores": round(used["machine"] / (end - start), 3),
                                "load_average": os.getloadavg(),
                                "groups_per_s": round((groups_stored(port) - groups) / (end - start), 2)})
            head_blocks.append(head_block(prom, began))  # before the agents stop: no scrape of a target down
            statements = top_statements(pg.dsn, time.monotonic() - measured) if statement_settings() else {}
            for agent in agents:
                stop(agent)
            time.sleep(3)  # the last batches land
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                for w in windows:
                    lo, hi = datetime.fromtimestamp(w["start"], UTC), datetime.fromtimestamp(w["end"], UTC)
                    for table in ("gpu_samples", "process_samples"):
                        w[table] = conn.execute(f"SELECT count(*) FROM jobpulse.{table} WHERE ts >= %s AND ts < %s",
                                                (lo, hi)).fetchone()[0]  # type: ignore[index]
                    w["prometheus_gpu_samples"] = tsdb.prometheus_scrapes(prom, w["start"], w["end"]) * GPUS
                for table in ("gpu_samples", "gpu_rollup_10s"):  # the day before the run: not the run's to compact
                    conn.execute(f"DELETE FROM jobpulse.{table} WHERE cluster = '{PREFILL}'")
                gpu_samples = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]  # type: ignore[index]
                process_samples = conn.execute("SELECT count(*) FROM jobpulse.process_samples").fetchone()[0]  # type: ignore[index]
                col.terminate()
                col.wait(30)
                compaction = {}
                later = datetime.now(UTC) + compact.CHUNK + timedelta(hours=compact.HOT_HOURS)
                for tier in compact.TIERS:
                    spent = tree_cpu_s(postmaster) + tsdb.cpu_s(os.getpid())
                    compact.compact(conn, duty=1.0, now=later, tiers=(tier,))
                    compaction[tier.raw] = tree_cpu_s(postmaster) + tsdb.cpu_s(os.getpid()) - spent
                conn.execute("VACUUM ANALYZE")
                unfolded = table_bytes(conn)["ingest_batches"]
                spent = tree_cpu_s(postmaster) + tsdb.cpu_s(os.getpid())  # as the leader folds days before yesterday
                folded = ledger.fold(conn, partitions.utc_today() + timedelta(days=1), 30).batches
                fold_s = tree_cpu_s(postmaster) + tsdb.cpu_s(os.getpid()) - spent
                tables = table_bytes(conn)
            blocks = tsdb.prometheus_blocks(work, prom, began, time.time())
    finally:
        for agent in agents:
            stop(agent)
        for store in stores:
            store.stop()
        for s in sleepers:
            s.kill()
            s.wait()
    return {"idle": idle, "windows": windows, "postgres_statements": statements, "prefilled": prefilled,
            "gpu_samples": gpu_samples,
            "process_samples": process_samples,
            "compaction_cpu_s": compaction,
            "ledger_fold": {"batches": folded, "cpu_s": fold_s, "batches_bytes": unfolded,
                            "ranges_bytes": tables["ingest_ranges"], "ranges_empty_bytes": empty_ranges},
            "tables": tables, "prometheus_blocks": blocks, "prometheus_head_blocks": head_blocks}


def head_block(prom: tsdb.Store, began: float) -> dict[str, float]:
    """Prometheus' CPU to write its whole head as a block now, and the GPU samples the head holds."""
    return {"cpu_s": tsdb.head_block_cpu_s(prom), "gpu_samples": tsdb.prometheus_scrapes(prom, began, time.time()) * GPUS}


async def _store_rounds(dsn: str, groups: list[list[Any]], pids: list[int]) -> tuple[float, float]:
    """CPU seconds the database spent storing ``groups`` (one store call each, a second of every node)
    through one connection, and folding them behind ingest as the leader does (every
    ``FOLD_EVERY`` groups, the whole 10 s buckets up to `fold.LAG` before the newest sample stored):
    (storing, folding)."""
    storage = Storage(dsn, pool_max=1)
    await storage.open()
    spent = {"store": 0.0, "fold": 0.0}
    mark = 0.0

    def charge(part: str) -> None:
        nonlocal mark
        now = sum(tree_cpu_s(p) for p in pids)
        spent[part] += now - mark
        mark = now

    try:
        with psycopg.connect(dsn, autocommit=True) as leader:
            mark = sum(tree_cpu_s(p) for p in pids)  # after the leader's connection start-up
            for k, group in enumerate(groups, 1):
                await storage.store(group)
                charge("store")
                if k % FOLD_EVERY == 0 or k == len(groups):
                    newest = max(s.ts for v in group for s in v.batch.gpu_samples)
                    fold.run(leader, now=newest, align=fold.ALIGN)
                    charge("fold")
            return spent["store"], spent["fold"]
    finally:
        await storage.close()


def citus_versus_single(nodes: int, seconds: int, rounds: int, shards: int | None,
                        every_tick: bool = False) -> dict[str, Any]:
    """Database CPU per GPU sample: one server against a Citus cluster (see the module's text)."""
    if not citus_installed():
        return {"not_measured": "Citus is not installed here (make test builds it where the shared vendor folder has it)"}
    sims = [SimulatedNode(n, change_only=not every_tick) for n in range(nodes)]
    t0 = datetime.now(UTC) - timedelta(seconds=seconds)  # live data (older marks the pyramid's late hours)
    per: dict[str, list[tuple[float, float]]] = {"one server": [], "citus": []}  # (storing, folding) a round
    with database("versus-single") as pg, citus_database("versus-citus", shards) as cluster:
        with psycopg.connect(cluster.dsn) as conn:  # the count `db upgrade --citus` chose
            shards = conn.execute("SELECT shard_count FROM citus_tables WHERE table_name = 'jobpulse.jobs'::regclass"
                                  ).fetchone()[0]  # type: ignore[index]
        for dsn in (pg.dsn, cluster.dsn):  # room for in-place updates, as a collector's leader leaves
            with psycopg.connect(dsn) as conn:
                rollup.tune(conn)
                # the leader's mark, as its first fold sets it on an empty database before the samples come
                conn.execute("UPDATE jobpulse.fold_mark SET folded_before = %s", (t0,))
        targets = {"one server": (pg.dsn, postmasters([pg.datadir])),
                   "citus": (cluster.dsn, postmasters([s.datadir for s in cluster.servers]))}
        for r in range(rounds + 1):  # round 0 warms up (partitions, plans, connections)
            batches, _ = build(sims, seconds, t0 + timedelta(seconds=r * seconds))
            valid = [ValidBatch.spanning(b, *time_span(b)) for b in batches]
            groups = [valid[i:i + nodes] for i in range(0, len(valid), nodes)]
            gpu_samples = sum(len(b.gpu_samples) for b in batches)
            process_share = sum(len(b.process_samples) for b in batches) / gpu_samples
            for name in (list(targets) if r % 2 else list(reversed(targets))):
                store_s, fold_s = asyncio.run(_store_rounds(targets[name][0], groups, targets[name][1]))
                us = (store_s / gpu_samples * 1e6, fold_s / gpu_samples * 1e6)
                if r:
                    per[name].append(us)
                print(f"citus round {r}{' (warm-up)' if not r else ''} {name}: {sum(us):.1f} us of database CPU a"
                      f" GPU sample (storing {us[0]:.1f}, folding {us[1]:.1f})", flush=True)
    rounds_of = list(zip(per["citus"], per["one server"], strict=True))

    def spread(values: list[float]) -> dict[str, float]:
        return {"min": round(min(values), 3), "median": round(statistics.median(values), 3)}

    ratios = [sum(c) / sum(s) for c, s in rounds_of]
    return {"citus_cpu_ratio_to_single": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
            "db_cpu_us_per_gpu_sample": {k: spread([sum(u) for u in v]) for k, v in per.items()},
            "storing_us_per_gpu_sample": {k: spread([u[0] for u in v]) for k, v in per.items()},
            "folding_us_per_gpu_sample": {k: spread([u[1] for u in v]) for k, v in per.items()},
            "storing_ratio": spread([c[0] / s[0] for c, s in rounds_of]),
            "folding_ratio": spread([c[1] / s[1] for c, s in rounds_of]),
            # what the ratio would be were Citus' fold as cheap as one server's: the floor its
            # coordinator's routing of every stored row sets
            "ratio_with_one_servers_fold": spread([(c[0] + s[1]) / sum(s) for c, s in rounds_of]),
            "nodes": nodes, "seconds_per_round": seconds, "rounds": rounds, "shards": shards,
            "process_samples_per_gpu_sample": round(process_share, 3),
            "group": f"one second of every node ({nodes} node batches) a transaction"}


def spread_of(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    """Per GPU sample: each round's CPU (all of it, and above each side's idle cost), the compaction's
    share (GPU samples: from the history's compaction), disk; min and median of the rounds."""
    live_gpu_us = r["compaction_cpu_s"]["gpu_samples"] / r["gpu_samples"] * 1e6
    live_process_us = r["compaction_cpu_s"]["process_samples"] / max(1, r["process_samples"]) * 1e6
    past = r["disk"]  # the history: chunks compacted as on a cluster
    compact_gpu_us = past["compaction_cpu_s"]["gpu_samples"] / past["gpu_samples"] * 1e6
    compact_process_us = past["compaction_cpu_s"]["process_samples"] / max(1, past["process_samples"]) * 1e6
    fold_us = r["ledger_fold"]["cpu_s"] / r["gpu_samples"] * 1e6  # the live run's ledger, folded
    # Prometheus' counterpart, its head written as a block: what the second half of the rounds added
    # to that write (the index of its series, a fixed cost a 2-hour head spreads thin, cancels out).
    first, last = r["prometheus_head_blocks"]
    # Two readings of a few tenths of a second at /proc's 10 ms: noise can make it negative, never a credit.
    prom_block_us = max(0.0, (last["cpu_s"] - first["cpu_s"]) / max(1, last["gpu_samples"] - first["gpu_samples"]) * 1e6)
    compacting_of = {tsdb.PROMETHEUS: prom_block_us, tsdb.VICTORIA: 0.0}  # VictoriaMetrics merges as it runs
    idle = r["idle"]
    rounds: dict[str, list[dict[str, float]]] = {"gpus only": [], "processes": []}
    for w in r["windows"]:
        span, per_gpu_sample = w["end"] - w["start"], 1e6 / w["gpu_samples"]
        compacting = compact_gpu_us + compact_process_us * w["process_samples"] / w["gpu_samples"] + fold_us
        jp_cpu = w["collector_cpu_s"] + w["postgres_cpu_s"]
        jp = jp_cpu * per_gpu_sample + compacting
        jp_above = (jp_cpu - idle["jobpulse_cpu_s"] / idle["seconds"] * span) * per_gpu_sample + compacting
        figures = {"jobpulse": jp, "jobpulse_above_idle": jp_above}
        for store, short in ((tsdb.PROMETHEUS, "prometheus"), (tsdb.VICTORIA, "victoria")):
            total = w[f"{store}_cpu_s"] / w[f"{store}_gpu_samples"] * 1e6 + compacting_of[store]
            above = ((w[f"{store}_cpu_s"] - idle[f"{store}_cpu_s"] / idle["seconds"] * span)
                     / w[f"{store}_gpu_samples"] * 1e6 + compacting_of[store])
            figures |= {store: total, f"{store}_above_idle": above,
                        f"ratio_to_{short}": jp / total, f"ratio_to_{short}_above_idle": jp_above / above}
        rounds[w["load"]].append({**figures, "agents": w["agents_cpu_s"] * per_gpu_sample})
    d = r["disk"]
    history = {k: v for k, v in d["jobpulse_tables_bytes"].items() if k != "ingest_batches"}
    # Written per batch: from the live run, folded into runs (as the raw tier, its form before, is not
    # counted), above the empty table's pages; the per-batch rows it had, apart.
    fold = r["ledger_fold"]
    ledger = (fold["ranges_bytes"] - fold["ranges_empty_bytes"]) / r["gpu_samples"]
    jp_disk = sum(history.values()) / d["gpu_samples"] + ledger
    other_days = sum(v for k, v in d.get("jobpulse_other_days_bytes", {}).items() if k in history) / d["gpu_samples"]
    jp_repacked = jp_disk + (d["gpu_rollup_bytes_repacked"] - history["gpu_rollup"]) / d["gpu_samples"]
    prom_disk = d["prometheus_block_bytes"] / d["gpu_samples"]
    victoria_disk = d["victoria_bytes"] / d["gpu_samples"]

    def spread(load: str, key: str) -> dict[str, float]:
        values = [x[key] for x in rounds[load]]
        return {"min": round(min(values), 3 if "ratio" in key else 1),
                "median": round(statistics.median(values), 3 if "ratio" in key else 1)}

    def ratios(suffix: str) -> dict[str, dict[str, dict[str, float]]]:
        return {store: {load: spread(load, f"ratio_to_{short}{suffix}") for load in rounds}
                for store, short in ((tsdb.PROMETHEUS, "prometheus"), (tsdb.VICTORIA, "victoria"))}

    return {
        # the headline: what one more GPU costs (above each side's idle cost); the total beside it
        "cpu_ratio_above_idle": ratios("_above_idle"),
        "cpu_ratio_in_all": ratios(""),
        "disk_ratio": {tsdb.PROMETHEUS: round(jp_disk / prom_disk, 3), tsdb.VICTORIA: round(jp_disk / victoria_disk, 3)},
        "disk_ratio_rollups_repacked": round(jp_repacked / prom_disk, 3),
        "cpu_us_per_gpu_sample": {load: {k: spread(load, k) for k in rounds[load][0]} for load in rounds},
        "idle_cpu_percent_of_a_core": {side: round(idle[f"{side}_cpu_s"] / idle["seconds"] * 100, 2)
                                       for side in ("jobpulse", tsdb.PROMETHEUS, tsdb.VICTORIA)},
        "shared_with": {"others_cores": spread_of([w["others_cores"] for w in r["windows"]]),
                        "machine_busy_cores": spread_of([w["machine_busy_cores"] for w in r["windows"]]),
                        "load_average_1min": spread_of([w["load_average"][0] for w in r["windows"]])},
        "compaction_cpu_us": {"per_gpu_sample": round(compact_gpu_us, 2),
                              "per_process_sample": round(compact_process_us, 2),
                              "ledger_fold_per_gpu_sample": round(fold_us, 2),
                              "prometheus_head_block_per_gpu_sample": round(prom_block_us, 2),
                              "live_run": {"per_gpu_sample": round(live_gpu_us, 2),
                                           "per_process_sample": round(live_process_us, 2)}},
        "disk_bytes_per_gpu_sample": {
            "jobpulse": round(jp_disk, 2), "prometheus": round(prom_disk, 2), tsdb.VICTORIA: round(victoria_disk, 2),
            "jobpulse_rollups_repacked": round(jp_repacked, 2),
            # counted above: the partitions of days the history does not touch (their empty pages), and
            # the compact tier's packed values of the fields dcgm-exporter does not serve (neither
            # Prometheus nor VictoriaMetrics holds them: NVLink rates, GPM FP16/FP32/FP64, clock reasons...)
            "jobpulse_other_days": round(other_days, 2),
            "jobpulse_fields_the_others_lack": round(sum(
                v for k, v in d.get("compact_bytes_by_field", {}).items() if k in NOT_SERVED), 2),
            "jobpulse_by_table": {**{k: round(v / d["gpu_samples"], 2) for k, v in history.items()},
                                  "ingest_ledger": round(ledger, 2)},
            "ingest_ledger_before_its_fold": round(fold["batches_bytes"] / r["gpu_samples"], 2),
            "gpu_rollup_10s_while_kept": round(d["gpu_rollup_10s_bytes_while_kept"] / d["gpu_samples"], 2)},
        **r,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32,
                    help="simulated nodes of 8 GPUs (32: the agents then take about half a core)")
    ap.add_argument("--seconds", type=float, default=60, help="seconds per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each load (they alternate)")
    ap.add_argument("--warmup", type=float, default=20)
    ap.add_argument("--idle", type=float, default=30, help="seconds measured before any agent starts")
    ap.add_argument("--day-hours", type=float, default=6,
                    help="hours of today the raw GPU partition holds before the run (0: new partitions)")
    ap.add_argument("--group-wait-ms", type=float, default=CollectorSettings.group_wait_s * 1000,
                    help="the collector's group commit: a group closes after this long with no batch (its default)")
    ap.add_argument("--group-max-wait-ms", type=float, default=CollectorSettings.group_max_wait_s * 1000,
                    help="... or this long after its first batch (its default)")
    ap.add_argument("--flush-interval", type=float, default=1.0,
                    help="seconds between an agent's batches (its default: 1; sampling stays at 1 Hz)")
    ap.add_argument("--rules-interval", type=float, default=CollectorSettings.rules_interval_s,
                    help="the collector's rule cycles (its default; 86400: none in the rounds)")
    ap.add_argument("--no-citus", action="store_true", help="leave out the Citus comparison")
    ap.add_argument("--disk-gpus", type=int, default=32,
                    help="GPUs of the disk comparison's history (32: four nodes, whose empty partitions of other days no longer weigh a third)")
    ap.add_argument("--disk-hours", type=float, default=2, help="hours of that history (Prometheus cuts 2 h blocks)")
    ap.add_argument("--citus-nodes", type=int, default=256,
                    help="node batches a Citus group holds (256: one collector's second at a site past one server)")
    ap.add_argument("--citus-seconds", type=int, default=10, help="seconds of every node's batches a Citus round")
    ap.add_argument("--citus-rounds", type=int, default=3)
    ap.add_argument("--shards", type=int, help="Citus shards per table group (default: `db upgrade --citus`'s)")
    args = ap.parse_args()
    note = load_note()
    work = Path(tempfile.mkdtemp(prefix="jobpulse-versus-bench-"))
    try:
        measured = run(args, work)
        measured["disk"] = disk(args.disk_gpus, args.disk_hours, work)
        result = summarize(measured)
        result["citus_cpu_ratio_to_single"] = None
        if not args.no_citus:
            result["citus"] = citus_versus_single(args.citus_nodes, args.citus_seconds, args.citus_rounds, args.shards)
            # The same at this run's cluster size (--nodes a group): a site this small runs one server.
            result["citus_small_groups"] = citus_versus_single(
                args.nodes, args.citus_seconds * args.citus_nodes // args.nodes, args.citus_rounds, args.shards)
            # The batches as an agent sends them whose processes all change every tick (32 rows a second).
            result["citus_every_tick"] = citus_versus_single(args.citus_nodes, args.citus_seconds, args.citus_rounds,
                                                             args.shards, every_tick=True)
            result["citus_cpu_ratio_to_single"] = result["citus"].get("citus_cpu_ratio_to_single")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return finish(args, note, result)


def finish(args: argparse.Namespace, note: str, result: dict[str, Any]) -> int:
    """Print the figures and save them."""
    result.update(nodes=args.nodes, gpus=args.nodes * GPUS, seconds_per_round=args.seconds,
                  flush_interval_s=args.flush_interval, rules_interval_s=args.rules_interval,
                  group_wait_ms=args.group_wait_ms, group_max_wait_ms=args.group_max_wait_ms,
                  machine=f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
                          f"Python {sys.version.split()[0]}", conditions=note,
                  conditions_at_end="load average {:.1f} (1 min), {:.1f} (5 min) at the end".format(*os.getloadavg()))
    print(f"\njobpulse versus dcgm-exporter + Prometheus and + VictoriaMetrics — {args.nodes} nodes x {GPUS} GPUs at"
          f" 1 Hz, {args.rounds} rounds of {args.seconds:g} s per load; {result['machine']}; {note}; "
          f"{result['conditions_at_end']}; the rounds shared the machine with {result['shared_with']['others_cores']}"
          f" cores of other work (min, median, max)\n")
    print(f"{'CPU, us per GPU sample':40} {'min':>9} {'median':>9}")
    for load, figures in result["cpu_us_per_gpu_sample"].items():
        for key, v in figures.items():
            print(f"{load + ': ' + key:40} {v['min']:>9} {v['median']:>9}")
    print(f"idle, % of a core: {result['idle_cpu_percent_of_a_core']}; compaction, us: {result['compaction_cpu_us']}")
    d = result["disk_bytes_per_gpu_sample"]
    print(f"\ndisk per GPU sample ({args.disk_hours:g} h of {args.disk_gpus} noisy GPUs in each): jobpulse "
          f"{d['jobpulse']} B {d['jobpulse_by_table']}, Prometheus block {d['prometheus']} B, VictoriaMetrics"
          f" {d[tsdb.VICTORIA]} B; jobpulse with its closed roll-up days rewritten full {d['jobpulse_rollups_repacked']} B;"
          f" of jobpulse's, the empty partitions of days the history does not touch {d['jobpulse_other_days']} B"
          f" and the fields dcgm-exporter does not serve {d['jobpulse_fields_the_others_lack']} B")
    if result["postgres_statements"]:
        print("\nPostgreSQL's costliest statements over the rounds (ms and calls a second):")
        for q, v in result["postgres_statements"].items():
            print(f"  {v['ms_per_s']:8.2f} ms {v['calls_per_s']:7.2f}/s  {q}")
    for what in ("cpu_ratio_above_idle", "cpu_ratio_in_all"):
        for store, loads in result[what].items():
            print(f"{what} to {store}: " + "; ".join(f"{load} {v['median']} (min {v['min']})" for load, v in loads.items()))
    print(f"disk ratio {result['disk_ratio']}")
    if not args.no_citus:
        print(f"Citus / one server (database CPU a GPU sample) {result['citus_cpu_ratio_to_single']} at "
              f"{args.citus_nodes} node batches a group (processes changing every tick:"
              f" {result['citus_every_tick'].get('citus_cpu_ratio_to_single')}),"
              f" {result['citus_small_groups'].get('citus_cpu_ratio_to_single')} at "
              f"{args.nodes}"
              + (f" (storing {c['storing_ratio']['median']}, folding {c['folding_ratio']['median']}; with one server's"
                 f" fold {c['ratio_with_one_servers_fold']['median']})" if "storing_ratio" in (c := result["citus"]) else ""))
    save("versus_tsdb.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
