"""The database benchmarks' PostgreSQL: a private server with the schema, seeded with a running
cluster — jobs, topology, and 1 Hz GPU and process samples through the same staging-table, move
and roll-up SQL as ingest."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from jobpulse.collector.demo.embedded_postgres import EmbeddedPostgres
from jobpulse.collector.store import migrations, partitions, rollup


@contextmanager
def database(name: str) -> Iterator[EmbeddedPostgres]:
    """A started PostgreSQL with the current schema; stopped and deleted afterwards."""
    base = Path(tempfile.mkdtemp(prefix=f"jobpulse-bench-{name}-"))
    pg = EmbeddedPostgres(base / "data")
    pg.start()
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            migrations.upgrade(conn)
            partitions.ensure_ahead(conn, 1)
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)

GPUS_PER_NODE = 8


def seed(conn: psycopg.Connection, gpus: int, seconds: int, gpus_per_job: int) -> None:
    """Jobs, topology, and `seconds` of 1 Hz samples ending now: 80% of jobs busy, 10% with an
    idle GPU, 10% starved. Written a minute at a time, like a stream of batches."""
    jobs = gpus // gpus_per_job
    conn.execute(
        "INSERT INTO jobpulse.jobs (cluster, job_id, user_name, partition, nodes, gpus_total, start_time, state)"
        " SELECT 'big', j::text, 'user' || (j %% 40), 'gpu', ARRAY['node' || (j / 2)], %s,"
        " now() - make_interval(secs => %s), 'RUNNING' FROM generate_series(0, %s - 1) j",
        (gpus_per_job, seconds, jobs))
    conn.execute(
        "INSERT INTO jobpulse.topology (cluster, node, ts, gpu_uuid, gpu_index, model, cpu_affinity, links)"
        " SELECT 'big', 'node' || (g / %s), now() - interval '1 hour', 'GPU-' || g, g %% %s,"
        " 'NVIDIA H100 80GB HBM3', '0-63', '{}' FROM generate_series(0, %s - 1) g",
        (GPUS_PER_NODE, GPUS_PER_NODE, gpus))
    for table in rollup.FOLDS:
        conn.execute(rollup.create_stage(table))
    for minute_end in range(seconds, 0, -60):
        minute = {"per": GPUS_PER_NODE, "job": gpus_per_job, "gpus": gpus, "lo": max(minute_end - 59, 0),
                  "hi": minute_end}
        with conn.transaction():
            # act: busy jobs ~85 %, every 10th job leaves its last GPU idle, every 10th+5 job is starved.
            conn.execute(
                f"INSERT INTO pg_temp.{rollup.stage_name('gpu_samples')} (cluster, node, ts, gpu_uuid, gpu_index, job_id, sm_util,"
                " mem_util, power_w, power_limit_w, gpu_temp_c, sm_clock_mhz, fb_used_mib, fb_total_mib,"
                " pcie_gen, pcie_width, pcie_gen_max, pcie_width_max, clock_event_reasons, gpm_sm_active,"
                " gpm_tensor_active)"
                " SELECT 'big', 'node' || (g / %(per)s), now() - make_interval(secs => s), 'GPU-' || g, g %% %(per)s,"
                " (g / %(job)s)::text, u, 40, 300 + u, 700, 60, 1980, 40000, 81559, 5, 16, 5, 16, 0, u * 0.9, 30"
                " FROM generate_series(0, %(gpus)s::int - 1) g, generate_series(%(lo)s::int, %(hi)s::int) s,"
                " LATERAL (SELECT CASE WHEN (g / %(job)s) %% 10 = 0 AND g %% %(job)s = 3 THEN 0"
                "                      WHEN (g / %(job)s) %% 10 = 5 THEN 15 + (s %% 7) ELSE 80 + (s %% 15) END AS u) x",
                minute)
            conn.execute(rollup.move("gpu_samples"))
            conn.execute(rollup.FOLD)
            conn.execute(
                f"INSERT INTO pg_temp.{rollup.stage_name('process_samples')} (cluster, node, ts, pid, gpu_uuid, job_id,"
                " step, rank,"
                " local_rank, gpu_mem_mib, cpu_percent, rss_mib, command, cpu)"
                " SELECT 'big', 'node' || (g / %(per)s), now() - make_interval(secs => s), 1000 + g, 'GPU-' || g,"
                " (g / %(job)s)::text, '0', g %% %(job)s, g %% %(job)s, 39000, 95, 12000, 'python', g %% 64"
                " FROM generate_series(0, %(gpus)s::int - 1) g, generate_series(%(lo)s::int, %(hi)s::int) s",
                minute)
            conn.execute(rollup.move("process_samples"))
            conn.execute(rollup.FOLD_PROCESSES)
    conn.execute("ANALYZE")
