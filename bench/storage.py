"""Storage benchmark (not a test): bytes per sample in the raw and the compact tier, and the CPU
that compacting costs against the CPU that ingesting the same samples cost.

Realistic 1 Hz data of a training job (8 GPUs per node, 4 processes per GPU: the rank and three
data-loader workers): timestamps with scheduling jitter, noisy utilization with an evaluation dip
every 10 min, power in mW with noise, an energy counter, slowly moving temperatures, clocks that
sometimes drop, steady memory, noisy PCIe and NVLink rates, constant ECC and error counters;
processes with noisy CPU percent (ticks over a jittered interval), the CPU they last ran on,
steady memory. Two GPUs: "hopper" adds the seven GPM metrics as noisy floats rounded as the agent
sends them (the field table's resolution), "pre-hopper" has none (NULL, as on A100). The headline
figures are Hopper's.

It is written as ingest writes it, a minute per transaction (the rows inserted and folded into the
same roll-ups with the same fold SQL, from a staging table filled by binary COPY), measured, compacted with `compact.compact`, VACUUMed and measured again;
sizes are table + indexes + TOAST of every partition. On the compacted data it then runs every
query of the job dashboard over the whole range and over its last 15 minutes. CPU is the
PostgreSQL backend's and this process's user + system time (/proc), for ingest the database side
only (the collector's HTTP and validation work would add to it, so the ratio printed is an upper
bound). References from the same data: the CPU of only deleting the raw rows (what moving them
costs before any packing) and of only reading each once, the bytes xz reaches on the same values
(how far their noise lets any lossless packing go), and Citus' columnar tables filled from the raw
rows (bytes and CPU; skipped, saying why, where the extension is missing).

    python bench/storage.py [--gpus 8] [--hours 6]

Writes bench/results/storage.json.
"""

from __future__ import annotations

import argparse
import array
import json
import lzma
import os
import platform
import statistics
import struct
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from seed import database

from jobpulse.collector.grafana import dashboards
from jobpulse.collector.store.tiers import coarse, compact, partitions, rollup, tier_stats
from jobpulse.schema import fields

sys.path.insert(0, str(Path(__file__).parent.parent))
from tests.grafana_macros import Var, expand
from tests.test_grafana import targets

RESULTS = Path(__file__).parent / "results"
TICK = os.sysconf("SC_CLK_TCK")

_GPU = """
INSERT INTO bench_gpu
SELECT 'big', 'node' || (g / 8), %(t0)s::timestamptz + make_interval(secs => s) + make_interval(secs => j / 1e6),
       'GPU-' || g, g %% 8, '1', u, least(100, (u * 0.45 + random() * 10)::int), 0, 0, 0, 0,
       (p / 1000.0)::float8::real, 700, 10000000000 + sum(p) OVER (PARTITION BY g ORDER BY s),
       62 + (sin(s / 300.0) * 4)::int + (u > 50)::int * 3, 71 + (sin(s / 300.0) * 4)::int,
       CASE WHEN random() < 0.02 THEN 1755 ELSE 1980 END, 2619, 1980, 2619,
       72000 + g * 10 + s / 3600, 81559, (random() * 40000)::int, (random() * 8000)::int, 5, 16, 5, 16, 0,
       CASE WHEN u > 10 THEN (2e6 + random() * 6e6)::bigint ELSE 0 END,
       CASE WHEN u > 10 THEN (2e6 + random() * 6e6)::bigint ELSE 0 END,
       CASE WHEN u < 5 THEN 1 WHEN random() < 0.05 THEN 4 ELSE 0 END, 0, 0, 0, 0, false, false,
       gpm * (u * 0.92 + random() * 3)::real, gpm * (25 + random() * 10)::real, gpm * (u * 0.5 + random() * 8)::real,
       gpm * (35 + random() * 20)::real, gpm * (u * 0.2 + random() * 4)::real, gpm * (1 + random() * 2)::real,
       gpm * 0::real, 0, 0, 0, 0
  FROM generate_series(0, %(gpus)s - 1) g, generate_series(0, %(seconds)s - 1) s,
       LATERAL (SELECT CASE WHEN s %% 600 < 20 THEN (random() * 3)::int
                            ELSE least(100, greatest(0, 85 + random() * 30 - 15))::int END AS u,
                       (random() * 1500)::int AS j) x,
       LATERAL (SELECT (90000 + x.u * 5200 + random() * 30000)::int AS p,
                       CASE WHEN %(gpm)s THEN 1 END AS gpm) y
"""

_PROCESS = """
INSERT INTO bench_process
SELECT g.cluster, g.node, g.ts, 10000 + w * 1000 + g.gpu_index + 8 * (g.node = 'node1')::int,
       CASE WHEN w = 0 THEN g.gpu_uuid END, '1', '0', substring(g.gpu_uuid FROM 5)::int,
       g.gpu_index, CASE WHEN w = 0 THEN 71000 END, CASE WHEN w = 0 THEN g.sm_util END,
       CASE WHEN w = 0 THEN g.mem_util END,
       ((CASE WHEN w = 0 THEN 95 ELSE 55 END + (random() * 10)::int) / (1 + random() * 0.002))::float8::real,
       CASE WHEN w = 0 THEN 18000 ELSE 2400 END, CASE WHEN w = 0 THEN 'python' ELSE 'pt_data_worker' END,
       g.gpu_index * 8 + (random() * 7)::int
  FROM bench_gpu g, generate_series(0, 3) w
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / TICK


def cpu_of(backend: int) -> float:
    return cpu_seconds(backend) + cpu_seconds(os.getpid())


def quantize_gpm(conn: psycopg.Connection) -> None:
    """Round the generated GPM metrics as the agent does before it sends them (`Field.quantize`,
    the field table's resolution): the values the collector receives."""
    gpm = [f for f in fields.GPU_FIELDS if f.gpm]
    rows = conn.execute(f"SELECT ctid::text, {', '.join(f.name for f in gpm)} FROM bench_gpu").fetchall()
    conn.execute(f"CREATE TEMP TABLE bench_gpm (tid text, {', '.join(f'{f.name} float8' for f in gpm)})")
    with conn.cursor().copy("COPY bench_gpm FROM STDIN") as cp:
        for tid, *values in rows:
            cp.write_row((tid, *(f.quantize(v) for f, v in zip(gpm, values, strict=True))))
    conn.execute(f"UPDATE bench_gpu b SET {', '.join(f'{f.name} = q.{f.name}' for f in gpm)}"
                 " FROM bench_gpm q WHERE b.ctid = q.tid::tid")
    conn.execute("DROP TABLE bench_gpm")


def generate(conn: psycopg.Connection, gpus: int, seconds: int, t0: datetime, gpm: bool
             ) -> list[tuple[bytes, bytes]]:
    """The job and its samples, one binary COPY image per minute and table (made before anything
    is timed)."""
    conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, user_name, partition, nodes, gpus_total, start_time,"
                 " end_time, state) VALUES ('big', '1', 'alice', 'gpu', %s, %s, %s, %s, 'COMPLETED')",
                 ([f"node{i}" for i in range((gpus + 7) // 8)], gpus, t0, t0 + timedelta(seconds=seconds)))
    conn.execute("INSERT INTO jobpulse.job_gpus (cluster, job_id, node, gpu_uuid, gpu_index)"
                 " SELECT 'big', '1', 'node' || (g / 8), 'GPU-' || g, g %% 8 FROM generate_series(0, %s - 1) g",
                 (gpus,))
    conn.execute("CREATE UNLOGGED TABLE bench_gpu (LIKE jobpulse.gpu_samples)")
    conn.execute("CREATE UNLOGGED TABLE bench_process (LIKE jobpulse.process_samples)")
    conn.execute(_GPU, {"t0": t0, "gpus": gpus, "seconds": seconds, "gpm": gpm})
    if gpm:
        quantize_gpm(conn)
    conn.execute(_PROCESS)
    minutes = []
    for m in range(seconds // 60):
        lo, hi = t0 + timedelta(minutes=m), t0 + timedelta(minutes=m + 1)
        images = []
        for table in ("bench_gpu", "bench_process"):
            buf = bytearray()
            with conn.cursor().copy(f"COPY (SELECT * FROM {table} WHERE ts >= %s AND ts < %s)"
                                    " TO STDOUT (FORMAT binary)", (lo, hi)) as cp:
                for chunk in cp:
                    buf += chunk
            images.append(bytes(buf))
        minutes.append((images[0], images[1]))
    conn.execute("DROP TABLE bench_gpu, bench_process")
    return minutes


def ingest(conn: psycopg.Connection, minutes: list[tuple[bytes, bytes]]) -> None:
    """What the collector stores for a batch (rows and roll-up folds, the collector's fold SQL), fed
    from a staging table by binary COPY: fast to seed, the same rows and buckets."""
    for table in rollup.FOLDS:
        conn.execute(rollup.create_stage(table))
    for gpu_image, process_image in minutes:
        with conn.transaction():
            for table, image in (("gpu_samples", gpu_image), ("process_samples", process_image)):
                with conn.cursor().copy(f"COPY pg_temp.{rollup.stage_name(table)} FROM STDIN (FORMAT binary)") as cp:
                    cp.write(image)
                conn.execute(rollup.move(table))
                conn.execute(rollup.FOLDS[table])


def sizes(conn: psycopg.Connection) -> dict[str, dict[str, float]]:
    conn.execute("VACUUM ANALYZE")
    return {r.table: {"rows": r.rows, "samples": r.samples, "bytes": r.bytes, "bytes_per_sample": r.bytes_per_sample}
            for r in tier_stats.stats(conn)}


def timed_series(conn: psycopg.Connection, start: datetime, runs: int) -> dict[str, float]:
    """gpu_series over one hour of the whole job at full resolution and in 10 s steps, ms."""
    out = {}
    for step in (0, 10):
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            n = len(conn.execute("SELECT * FROM jobpulse.gpu_series('big', '1', %s, %s, %s) ORDER BY 1, 2, 3",
                                 (start, start + timedelta(hours=1), step)).fetchall())
            times.append((time.perf_counter() - t) * 1000)
        out[f"gpu_series_1h_step{step}_rows"] = n
        out[f"gpu_series_1h_step{step}_ms_min"] = round(min(times), 1)
        out[f"gpu_series_1h_step{step}_ms_median"] = round(statistics.median(times), 1)
    return out


def dashboard(conn: psycopg.Connection, gpus: int, start: datetime, end: datetime, runs: int,
              full_interval_ms: int = 60_000, job: str = "1") -> dict[str, Any]:
    """Every query of the job dashboard as Grafana expands it, over the whole compacted range and
    over its last 15 minutes (read from compact rows at full resolution): median and min ms, slowest."""
    nodes = tuple(f"node{i}" for i in range((gpus + 7) // 8))
    variables = {"cluster": Var(("big",)), "job": Var((job,)), "node": Var(nodes, multi=True),
                 "gpu": Var(tuple(f"GPU-{g}" for g in range(gpus)), multi=True),
                 "rank": Var(tuple(str(r) for r in range(gpus)), multi=True)}
    spans = {"full": (start, full_interval_ms), "15m": (end - timedelta(minutes=15), 1000)}
    out: dict[str, Any] = {}
    fastest: dict[str, float] = {}
    for what, _, sql_text in targets(dashboards.as_json(dashboards.job_dashboard())):
        for label, (frm, interval_ms) in spans.items():
            query = expand(sql_text, variables, frm, end, interval_ms)
            conn.execute(query).fetchall()
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                conn.execute(query).fetchall()
                times.append((time.perf_counter() - t) * 1000)
            out[f"{label} {what}"] = round(statistics.median(times), 1)
            fastest[f"{label} {what}"] = round(min(times), 1)
    slowest = max(out, key=out.__getitem__)
    return {"queries_ms": out, "queries_ms_min": fastest, "slowest": slowest, "slowest_ms": out[slowest]}


_WEEK_ROLLUPS = """
INSERT INTO jobpulse.gpu_rollup (width_s, bucket, cluster, job_id, node, gpu_uuid, gpu_index, n, first_ts, last_ts,
    n_idle, n_busy, n_gpm, n_hw_throttle, n_loaded, n_pcie_low, sum_sm_util, max_sm_util, sum_mem_util, sum_sm_active,
    sum_sm_occupancy, sum_tensor_active, max_tensor_active, sum_dram_bw, sum_fb_used_mib, max_fb_used_mib,
    fb_total_mib, sum_power_w, max_power_w, power_limit_w, sum_gpu_temp_c, max_gpu_temp_c, sum_sm_clock_mhz,
    sm_clock_max_mhz, sum_pcie_rx_kbs, sum_pcie_tx_kbs, sum_nvlink_rx_kbs, sum_nvlink_tx_kbs)
SELECT 300, b, 'big', '1', 'node' || (g / 8), 'GPU-' || g, g %% 8, 300, b, b + interval '299 seconds', 3, 290, 300, 0,
       290, 0, 300 * (80 + random() * 10), 100, 300 * 40, 300 * 75, 300 * 30, 300 * 40, 70, 300 * 45, 300 * 72000,
       72100, 81559, 300 * 500, 690, 700, 300 * 65, 70, 300 * 1980, 1980, 300 * 20000, 300 * 4000, 300 * 5e6, 300 * 5e6
  FROM generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '300 seconds', interval '300 seconds') b,
       generate_series(0, %(gpus)s - 1) g;
INSERT INTO jobpulse.process_rollup (width_s, bucket, cluster, job_id, node, pid, rank, local_rank, gpu_uuid, command,
    n, n_cpu, sum_cpu_percent, max_cpu_percent, n_sm, sum_sm_util, max_gpu_mem_mib, max_rss_mib)
SELECT 300, b, 'big', '1', 'node' || (g / 8), 10000 + w * 1000 + g, g, g %% 8, CASE WHEN w = 0 THEN 'GPU-' || g END,
       CASE WHEN w = 0 THEN 'python' ELSE 'pt_data_worker' END, 300, 300, 300 * (60 + random() * 40), 105,
       CASE WHEN w = 0 THEN 300 ELSE 0 END, CASE WHEN w = 0 THEN 300 * 85 END, 71000, 18000
  FROM generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '300 seconds', interval '300 seconds') b,
       generate_series(0, %(gpus)s - 1) g, generate_series(0, 3) w;
INSERT INTO jobpulse.step_rollup (width_s, bucket, cluster, job_id, rank, n, n_rate, sum_samples_per_s, max_step_number)
SELECT 300, b, 'big', '1', g, 30, 30, 30 * 400.0, extract(epoch FROM b - %(start)s)::bigint / 10
  FROM generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '300 seconds', interval '300 seconds') b,
       generate_series(0, %(gpus)s - 1) g
"""


_DENSE_PROCESSES = """
INSERT INTO jobpulse.process_samples (cluster, node, ts, pid, gpu_uuid, job_id, step, rank, local_rank, gpu_mem_mib,
    sm_util, mem_util, cpu_percent, rss_mib, command, cpu)
SELECT 'big', 'node' || (g / 8),
       %(t0)s::timestamptz + make_interval(secs => s) + make_interval(secs => (random() * 1500)::int / 1e6),
       20000 + w * 1000 + g, CASE WHEN w = 0 THEN 'GPU-' || g END, '2', '0', g, g %% 8, CASE WHEN w = 0 THEN 71000 END,
       CASE WHEN w = 0 THEN CASE WHEN s %% 600 < 20 THEN (random() * 3)::int
                                 ELSE least(100, greatest(0, 85 + random() * 30 - 15))::int END END,
       CASE WHEN w = 0 THEN (random() * 50)::int END,
       ((CASE WHEN w = 0 THEN 95 ELSE 55 END + (random() * 10)::int) / (1 + random() * 0.002))::float8::real,
       CASE WHEN w = 0 THEN 18000 ELSE 2400 END, CASE WHEN w = 0 THEN 'python' ELSE 'pt_data_worker' END,
       (g %% 8) * 8 + (random() * 7)::int
  FROM generate_series(0, %(gpus)s - 1) g, generate_series(0, 3) w, generate_series(0, %(seconds)s - 1) s
"""


def dense_ranks(conn: psycopg.Connection, gpus: int, chunk: datetime, runs: int) -> dict[str, Any]:
    """The job dashboard of a second job whose compact process rows are full: one chunk of 1 Hz
    process samples (4 per GPU, as in `generate`), 21,600 per (job, PID, chunk) row where the week's
    last hour fills a sixth of each. Written straight into the raw table: its 15-minute rank panels
    are what reads compacted process samples (the other panels read roll-ups at these ranges)."""
    conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, user_name, partition, nodes, gpus_total, start_time,"
                 " end_time, state) VALUES ('big', '2', 'bob', 'gpu', %s, %s, %s, %s, 'COMPLETED')",
                 ([f"node{i}" for i in range((gpus + 7) // 8)], gpus, chunk, chunk + compact.CHUNK))
    conn.execute(_DENSE_PROCESSES, {"t0": chunk, "gpus": gpus, "seconds": int(compact.CHUNK.total_seconds())})
    compact.compact(conn, duty=1.0)
    conn.execute("VACUUM ANALYZE")
    panels = dashboard(conn, gpus, chunk, chunk + compact.CHUNK, runs, job="2")
    return {k: {"ms_median": v, "ms_min": panels["queries_ms_min"][k]} for k, v in panels["queries_ms"].items()
            if k.startswith("15m") and "rank'" in k}


def week(gpus: int, runs: int) -> dict[str, Any]:
    """The job dashboard over a 7-day job, before and after compaction: its last hour as 1 Hz
    samples through ingest, then compacted; the six days and 23 hours before it as the 300 s roll-up
    buckets ingest would have left (what a range of days reads: long ranges never read samples) and,
    after compaction, the coarse buckets compaction makes of them; then a second job's rank panels
    on full process rows (`dense_ranks`)."""
    end = (datetime.now(UTC) - timedelta(days=3)).replace(minute=0, second=0, microsecond=0)
    start, last_hour = end - timedelta(days=7), end - timedelta(hours=1)
    with database("storage-week") as pg, psycopg.connect(pg.dsn, autocommit=True) as conn:
        partitions.ensure(conn, [start.date() + timedelta(days=d) for d in range(-1, 9)])
        ingest(conn, generate(conn, gpus, 3600, last_hour, gpm=True))
        conn.execute("UPDATE jobpulse.jobs SET start_time = %s", (start,))
        for statement in _WEEK_ROLLUPS.split(";"):
            conn.execute(statement, {"start": start, "end": last_hour, "gpus": gpus})
        conn.execute("VACUUM ANALYZE")
        # a 7-day range on a ~1,000 px panel: Grafana's $__interval is 10 min
        before = dashboard(conn, gpus, start, end, runs, full_interval_ms=600_000)
        done = compact.compact(conn, duty=1.0)
        hour = start
        while hour < last_hour:  # the coarse buckets compaction made as each hour left the hot window
            coarse.build(conn, hour)
            hour += coarse.HOUR
        conn.execute("VACUUM ANALYZE")
        after = dashboard(conn, gpus, start, end, runs, full_interval_ms=600_000)
        dense = dense_ranks(conn, gpus, start + timedelta(days=1) - timedelta(hours=start.hour % 6), runs)
        return {"gpus": gpus, "days": 7, "compacted_samples": done.samples, **after,
                "before_compaction": before, "rank_panels_on_full_process_rows": dense}


def profile(gpus: int, seconds: int, runs: int, gpm: bool) -> dict[str, Any]:
    """Ingest, measure, compact, measure one kind of GPU in a database of its own."""
    chunk_s = int(compact.CHUNK.total_seconds())  # the data starts a chunk: a whole chunk is what steady state keeps
    t0 = datetime.fromtimestamp(int((datetime.now(UTC) - timedelta(days=4)).timestamp()) // chunk_s * chunk_s, UTC)
    with database("storage") as pg, psycopg.connect(pg.dsn, autocommit=True) as conn:
        partitions.ensure(conn, [t0.date() + timedelta(days=d) for d in range(-1, 3)])
        backend = conn.info.backend_pid
        minutes = generate(conn, gpus, seconds, t0, gpm)
        c, w = cpu_of(backend), time.perf_counter()
        ingest(conn, minutes)
        ingest_cpu, ingest_wall = cpu_of(backend) - c, time.perf_counter() - w
        raw = sizes(conn)
        raw_reads = timed_series(conn, t0 + timedelta(hours=1), runs)
        floor_cpu = delete_floor(conn, backend)
        read_cpu = read_floor(conn, backend)
        xz = xz_reference(conn)
        columnar = columnar_reference(conn, backend, ingest_cpu)
        c, w = cpu_of(backend), time.perf_counter()
        done = compact.compact(conn, duty=1.0)
        compact_cpu, compact_wall = cpu_of(backend) - c, time.perf_counter() - w
        packed = sizes(conn)
        compact_reads = timed_series(conn, t0 + timedelta(hours=1), runs)
        by_field = per_field(conn)
        where = bytes_by_kind(conn)
        panels = dashboard(conn, gpus, t0, t0 + timedelta(seconds=seconds), runs) if gpm else None
    gpu_days = gpus * seconds / 86400
    return {
        "raw_bytes_per_gpu_sample": raw["gpu_samples"]["bytes_per_sample"],
        "raw_bytes_per_process_sample": raw["process_samples"]["bytes_per_sample"],
        "compact_bytes_per_gpu_sample": packed["gpu_samples_compact"]["bytes_per_sample"],
        # with the ranks' 10 s bins the compact tier keeps beside the packed process samples
        "compact_bytes_per_process_sample": round(
            (packed["process_samples_compact"]["bytes"] + packed["rank_bins_compact"]["bytes"])
            / packed["process_samples_compact"]["samples"], 2),
        "rank_bins_bytes_per_process_sample": packed["rank_bins_compact"]["bytes_per_sample"],
        "tiers_before": raw, "tiers_after": packed, "compacted_chunks": done.chunks,
        "compact_gpu_bytes_per_sample_by_field": by_field, "compact_gpu_bytes_per_sample_by_kind": where,
        "ingest_cpu_s_per_gpu_day": round(ingest_cpu / gpu_days, 3), "ingest_wall_s": round(ingest_wall, 2),
        "compact_cpu_s_per_gpu_day": round(compact_cpu / gpu_days, 3), "compact_wall_s": round(compact_wall, 2),
        "compact_cpu_share_of_ingest": round(compact_cpu / ingest_cpu, 4),
        "delete_raw_cpu_share_of_ingest": round(floor_cpu / ingest_cpu, 4),
        "read_raw_cpu_share_of_ingest": round(read_cpu / ingest_cpu, 4),
        "xz_bytes_per_gpu_sample": xz, "citus_columnar": columnar,
        "reads_raw": raw_reads, "reads_compact": compact_reads,
        **({"job_dashboard_on_compacted_range": panels} if panels else {}),
    }


def delete_floor(conn: psycopg.Connection, backend: int) -> float:
    """CPU seconds of only deleting the raw rows (rolled back): what moving them out of the raw
    tier costs at least, whatever the packing costs on top."""
    c = cpu_of(backend)
    with conn.transaction(force_rollback=True):
        conn.execute("DELETE FROM jobpulse.gpu_samples")
        conn.execute("DELETE FROM jobpulse.process_samples")
    return cpu_of(backend) - c


def read_floor(conn: psycopg.Connection, backend: int) -> float:
    """CPU seconds of only reading every raw row once (binary COPY out, discarded): what any
    compaction that looks at each value costs at least."""
    c = cpu_of(backend)
    for table in ("gpu_samples", "process_samples"):
        with conn.cursor().copy(f"COPY (SELECT * FROM jobpulse.{table}) TO STDOUT (FORMAT binary)") as cp:
            for _ in cp:
                pass
    return cpu_of(backend) - c


def columnar_reference(conn: psycopg.Connection, backend: int, ingest_cpu: float) -> dict[str, Any] | str:
    """The same raw rows copied into Citus' columnar tables (zstd, the extension's defaults) in one
    statement each, in the compact tier's order (node, GPU or PID, time): bytes per sample and the
    CPU of the copy against ingest's; or why it was not run."""
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS citus_columnar")
    except psycopg.Error as e:
        return f"not run: {e.diag.message_primary}"
    out: dict[str, Any] = {"compression": conn.execute("SHOW columnar.compression").fetchone()[0]}
    conn.execute("SET max_parallel_workers_per_gather = 0")  # columnar refuses writes from a parallel plan
    c = cpu_of(backend)
    for table, order in (("gpu_samples", "node, gpu_uuid, ts"), ("process_samples", "node, job_id, pid, ts")):
        conn.execute(f"CREATE TABLE bench_columnar_{table} USING columnar AS"
                     f" SELECT * FROM jobpulse.{table} ORDER BY {order}")
    out["cpu_share_of_ingest"] = round((cpu_of(backend) - c) / ingest_cpu, 4)
    for table in ("gpu_samples", "process_samples"):
        n, size = conn.execute(f"SELECT count(*), pg_total_relation_size('bench_columnar_{table}')"
                               f" FROM bench_columnar_{table}").fetchone()
        out[f"bytes_per_{table[:-len('_samples')]}_sample"] = round(size / n, 2)
        conn.execute(f"DROP TABLE bench_columnar_{table}")
    return out


def _ints(values: list[Any], sql_type: str) -> list[int]:
    """A column's values as the integers the compact tier codes (reals by their IEEE bits, NULL 0)."""
    if sql_type == "real":
        return [0 if v is None else struct.unpack("<I", struct.pack("<f", v))[0] for v in values]
    if sql_type == "timestamptz":
        return [int(v.timestamp() * 1_000_000) for v in values]
    return [0 if v is None else int(v) for v in values]


_XZ = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": 1 << 20}]  # a chunk fits


def xz_reference(conn: psycopg.Connection) -> float:
    """Bytes per GPU sample that xz (LZMA, preset 9 extreme: an entropy coder, which lz4 is not)
    reaches on the same values, compressed per column and (GPU, hour) as the compact tier groups
    them, each column the best of its values or their differences, bytes interleaved or split into
    planes: a reference for how far the data's own noise lets any lossless packing go."""
    tier = compact.TIERS[0]
    names = [c.name for c in tier.packed]
    rows = conn.execute(f"SELECT gpu_uuid, date_bin(%s, ts, timestamptz 'epoch'), {', '.join(names)}"
                        " FROM jobpulse.gpu_samples ORDER BY 1, 2, ts", (compact.CHUNK,)).fetchall()
    chunks: dict[tuple[str, datetime], list[tuple[Any, ...]]] = {}
    for r in rows:
        chunks.setdefault((r[0], r[1]), []).append(r[2:])
    total = 0
    for samples in chunks.values():
        for i, c in enumerate(tier.packed):
            v = _ints([s[i] for s in samples], c.sql)
            if c.sql == "text":
                continue  # one value per chunk here (the job): nothing to compare
            best = None
            for seq in (v, [b - a for a, b in zip([0, *v], v, strict=False)]):
                raw = array.array("q", seq).tobytes()
                for image in (raw, b"".join(raw[k::8] for k in range(8))):
                    size = len(lzma.compress(image, format=lzma.FORMAT_RAW, filters=_XZ))
                    best = size if best is None else min(best, size)
            total += best or 0
    return round(total / len(rows), 2)


def per_field(conn: psycopg.Connection) -> dict[str, float]:
    """Bytes per GPU sample of each packed field's planes (compressed, its packed top plane
    included), largest first."""
    n = conn.execute("SELECT sum(n) FROM jobpulse.gpu_samples_compact").fetchone()[0]
    tier = compact.TIERS[0]
    sizes = conn.execute("SELECT " + ", ".join(f"coalesce(sum(pg_column_size({c.name})), 0)"
                                               f" + coalesce(sum(pg_column_size({c.name}_top)), 0)" for c in tier.packed)
                         + " FROM jobpulse.gpu_samples_compact").fetchone()
    return dict(sorted(((c.name, round(b / n, 2)) for c, b in zip(tier.packed, sizes) if b), key=lambda kv: -kv[1]))


def bytes_by_kind(conn: psycopg.Connection) -> dict[str, float]:
    """Bytes per GPU sample of the compact GPU table by where they lie: the packed values (every
    column, compressed), and what holding them costs on top (heap and TOAST pages beyond the
    values, indexes, the partitions that hold no row)."""
    n = conn.execute("SELECT sum(n) FROM jobpulse.gpu_samples_compact").fetchone()[0]
    cols = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'jobpulse.gpu_samples_compact'::regclass"
        " AND attnum > 0 AND NOT attisdropped")]
    values = conn.execute("SELECT " + " + ".join(f"coalesce(sum(pg_column_size({c})), 0)" for c in cols)
                          + " FROM jobpulse.gpu_samples_compact").fetchone()[0]
    parts = conn.execute(
        "SELECT pg_relation_size(c.oid) + coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),"
        " pg_indexes_size(c.oid), c.reltuples > 0 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'jobpulse.gpu_samples_compact'::regclass").fetchall()
    used = [(data, index) for data, index, full in parts if full]
    empty = sum(data + index for data, index, full in parts if not full)
    return {"values": round(values / n, 2), "pages beyond the values": round((sum(d for d, _ in used) - values) / n, 2),
            "indexes": round(sum(i for _, i in used) / n, 2), "empty partitions": round(empty / n, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=6, help="of samples (6: one whole compact chunk)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--week-gpus", type=int, default=64, help="GPUs of the 7-day job for the dashboard (0: skip)")
    ap.add_argument("--concurrent", default="unknown", help="what else ran on the machine (for the record)")
    args = ap.parse_args()
    seconds = int(args.hours * 3600)
    week_result = week(args.week_gpus, args.runs) if args.week_gpus else None
    profiles = {name: profile(args.gpus, seconds, args.runs, gpm) for name, gpm in (("hopper", True),
                                                                                   ("pre-hopper", False))}
    with database("storage-version") as pg, psycopg.connect(pg.dsn) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        lz4 = compact.lz4_supported(conn)
    head = profiles["hopper"]
    result = {
        "conditions": {"gpus": args.gpus, "hours": args.hours, "gpu_samples": args.gpus * seconds,
                       "process_samples": args.gpus * seconds * 4, "chunk_s": int(compact.CHUNK.total_seconds()),
                       "postgresql": server, "toast_compression": "lz4" if lz4 else "pglz",
                       "machine": f"{platform.machine()}, {os.cpu_count()} cores", "concurrent": args.concurrent,
                       "ingest_cpu": "database side only (COPY into staging, move, roll-up fold): backend + client",
                       "citus": "citus_columnar, same rows, same run: profiles.*.citus_columnar"},
        **{k: head[k] for k in ("raw_bytes_per_gpu_sample", "raw_bytes_per_process_sample",
                                "compact_bytes_per_gpu_sample", "compact_bytes_per_process_sample",
                                "compact_cpu_share_of_ingest", "delete_raw_cpu_share_of_ingest",
                                "read_raw_cpu_share_of_ingest",
                                "xz_bytes_per_gpu_sample")},
        "profiles": profiles,
        **({"job_dashboard_7_days": week_result} if week_result else {}),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "storage.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, r in profiles.items():
        print(f"\n{name}: {'':20} {'raw':>10} {'compact':>10}")
        print(f"{'bytes per GPU sample':34} {r['raw_bytes_per_gpu_sample']:>10} "
              f"{r['compact_bytes_per_gpu_sample']:>10}  (target <= 30)")
        print(f"{'bytes per process sample':34} {r['raw_bytes_per_process_sample']:>10} "
              f"{r['compact_bytes_per_process_sample']:>10}  (target <= 15)")
        print(f"{'xz -9e on the same values, per GPU sample':34} {r['xz_bytes_per_gpu_sample']:>21}")
        print(f"Citus columnar on the same rows: {r['citus_columnar']}")
        print(f"CPU per GPU-day: ingest (database side) {r['ingest_cpu_s_per_gpu_day']} s, compaction "
              f"{r['compact_cpu_s_per_gpu_day']} s = {r['compact_cpu_share_of_ingest']:.1%} (target < 1 %); only"
              f" deleting the raw rows {r['delete_raw_cpu_share_of_ingest']:.1%}, only reading them once"
              f" {r['read_raw_cpu_share_of_ingest']:.1%}")
        print("compact bytes per GPU sample by kind:", r["compact_gpu_bytes_per_sample_by_kind"])
        print("  packed values by field:", r["compact_gpu_bytes_per_sample_by_field"])
        for key, ms in r["reads_raw"].items():
            if key.endswith("ms_median"):
                print(f"{key:34} {ms:>10} {r['reads_compact'][key]:>10}")
        if "job_dashboard_on_compacted_range" in r:
            d = r["job_dashboard_on_compacted_range"]
            print(f"job dashboard over the compacted range, slowest query: {d['slowest_ms']} ms ({d['slowest']})")
    if week_result:
        raw = week_result["before_compaction"]
        print(f"\njob dashboard, {week_result['gpus']} GPUs x 7 days, slowest query: before compaction "
              f"{raw['slowest_ms']} ms ({raw['slowest']}), after {week_result['slowest_ms']} ms "
              f"({week_result['slowest']}) (target <= 150 ms)")
        for what, ms in week_result["rank_panels_on_full_process_rows"].items():
            print(f"  1 Hz process rows of six hours, {what}: min {ms['ms_min']} ms, median {ms['ms_median']} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
