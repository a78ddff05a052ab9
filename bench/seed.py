"""The database benchmarks' PostgreSQL: a private server with the schema, seeded with a running
cluster — jobs, topology, and 1 Hz GPU and process samples folded into the roll-ups by the same
fold SQL as ingest (fed from a staging table)."""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from jobpulse.collector.embedded.citus_cluster import EmbeddedCitus
from jobpulse.collector.embedded.postgres import EmbeddedPostgres, migrated
from jobpulse.collector.store.migrate import citus, migrations
from jobpulse.collector.store.tiers import partitions, rollup


def database(name: str, settings: dict[str, str] | None = None) -> contextlib.AbstractContextManager[EmbeddedPostgres]:
    """A started PostgreSQL with the current schema (``settings``: server options); stopped and
    deleted afterwards."""
    return migrated(f"jobpulse-bench-{name}-", settings)


@contextmanager
def citus_database(name: str, shard_count: int | None) -> Iterator[EmbeddedCitus]:
    """A started Citus cluster on this machine (a coordinator and two workers) with the current
    schema distributed as `jobpulse db upgrade --citus` does; stopped and deleted afterwards."""
    base = Path(tempfile.mkdtemp(prefix=f"jobpulse-bench-{name}-"))
    cluster = EmbeddedCitus(base, workers=2)
    cluster.start()
    try:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            migrations.upgrade(conn)
            citus.distribute(conn, shard_count)
            partitions.ensure_ahead(conn, 1)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


GPUS_PER_NODE = 8



def _stage(conn: psycopg.Connection[Any], table: str, rows: str, params: dict[str, int]) -> None:
    """Insert ``rows`` (a column list and a SELECT) as the collector stages a batch, then move and
    fold them as it does: samples and their roll-ups."""
    conn.execute(f"INSERT INTO pg_temp.{rollup.stage_name(table)} {rows}", params)
    conn.execute(rollup.move(table))
    conn.execute(rollup.FOLDS[table])

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
            _stage(conn, "gpu_samples",
                "(cluster, node, ts, gpu_uuid, gpu_index, job_id, sm_util,"
                " mem_util, power_w, power_limit_w, gpu_temp_c, sm_clock_mhz, fb_used_mib, fb_total_mib,"
                " pcie_gen, pcie_width, pcie_gen_max, pcie_width_max, clock_event_reasons, gpm_sm_active,"
                " gpm_tensor_active)"
                " SELECT 'big', 'node' || (g / %(per)s), now() - make_interval(secs => s), 'GPU-' || g, g %% %(per)s,"
                " (g / %(job)s)::text, u, 40, 300 + u, 700, 60, 1980, 40000, 81559, 5, 16, 5, 16, 0, u * 0.9, 30"
                " FROM generate_series(0, %(gpus)s::int - 1) g, generate_series(%(lo)s::int, %(hi)s::int) s,"
                " LATERAL (SELECT CASE WHEN (g / %(job)s) %% 10 = 0 AND g %% %(job)s = 3 THEN 0"
                "                      WHEN (g / %(job)s) %% 10 = 5 THEN 15 + (s %% 7) ELSE 80 + (s %% 15) END AS u) x",
                minute)
            _stage(conn, "process_samples",
                "(cluster, node, ts, pid, gpu_uuid, job_id,"
                " step, rank,"
                " local_rank, gpu_mem_mib, cpu_percent, rss_mib, command, cpu)"
                " SELECT 'big', 'node' || (g / %(per)s), now() - make_interval(secs => s), 1000 + g, 'GPU-' || g,"
                " (g / %(job)s)::text, '0', g %% %(job)s, g %% %(job)s, 39000, 95, 12000, 'python', g %% 64"
                " FROM generate_series(0, %(gpus)s::int - 1) g, generate_series(%(lo)s::int, %(hi)s::int) s",
                minute)
    conn.execute("ANALYZE")


# --- A messy cluster for the rule cycle: what a real one looks like when the rules run ------------

JOB_SIZES = (1, 2, 4, 8, 16, 32, 64)
JOB_SIZE_WEIGHTS = (20, 15, 20, 25, 10, 6, 4)
FREE_SHARE = 0.2
"""Of the GPUs in the topology, this share is held by no running job (free, or freed by a job that
ended within the window)."""

# Usage patterns of one GPU over its segment (SQL below turns them into roll-up rows).
BUSY, NEVER, LATE_IDLE, LOW, STALL, STRAGGLER, NO_TENSOR, UNHELD = range(8)

_SEGMENT_COLUMNS = ("node", "gpu_uuid", "gpu_index", "job_id", "t_from", "t_to", "pattern", "idle_at", "gpm",
                    "fb_mib", "throttle", "pcie_low", "sbe_storm")
_PROC_COLUMNS = ("node", "pid", "job_id", "rank", "local_rank", "gpu_uuid", "t_from", "t_to", "cpu_percent", "cpu")
_TYPES = {"gpu_index": "int", "t_from": "timestamptz", "t_to": "timestamptz", "pattern": "int",
          "idle_at": "timestamptz", "gpm": "bool", "fb_mib": "int", "throttle": "bool", "pcie_low": "bool",
          "sbe_storm": "bool", "pid": "int", "rank": "int", "local_rank": "int", "cpu_percent": "float8", "cpu": "int"}
_JOB_COLUMNS = ("job_id", "partition", "nodes", "gpus_total", "start_time", "end_time", "rules_final_at", "state")


@dataclass
class Cluster:
    """What `seed_cluster` wrote, in counts."""

    running_gpus: int
    topology_gpus: int
    running_jobs: int
    ended_jobs: int
    rows: dict[str, int] = field(default_factory=dict)


@dataclass
class _Plan:
    now: datetime  # the data's end
    ahead: timedelta  # how far that is past the seeding
    jobs: list[tuple[Any, ...]] = field(default_factory=list)
    segments: list[tuple[Any, ...]] = field(default_factory=list)
    procs: list[tuple[Any, ...]] = field(default_factory=list)
    faults: list[tuple[Any, ...]] = field(default_factory=list)  # node, ts, kind, gpu_uuid, job_id, code
    topology: list[tuple[Any, ...]] = field(default_factory=list)  # node, ts, uuid, index, model, cpus, links
    running: int = 0
    next_pid: int = 1000

    def job(self, job_id: str, partition: str, nodes: list[str], gpus: int, start: datetime,
            end: datetime | None) -> None:
        # Jobs that ended in the last 2 min before the seeding await their final cycle.
        pending = end is None or end > self.now - self.ahead - timedelta(minutes=2)
        final = None if pending else end + timedelta(seconds=30)
        self.jobs.append((job_id, partition, nodes, gpus, start, end, final, "RUNNING" if end is None else "COMPLETED"))


def _links(model: str, index: int) -> dict[str, str]:
    """Peer index -> link: all-to-all NVLink on the H100 nodes; NVLink pairs on the A100 PCIe nodes
    (so two GPUs of a job may reach each other only through the CPU)."""
    if model.startswith("NVIDIA H100"):
        return {str(p): "NV18" for p in range(GPUS_PER_NODE) if p != index}
    return {str(p): ("NV12" if p // 2 == index // 2 else "NODE" if p // 4 == index // 4 else "SYS")
            for p in range(GPUS_PER_NODE) if p != index}


def _plan(now: datetime, ahead: timedelta, running_gpus: int, window: timedelta, rng: random.Random) -> _Plan:
    """Jobs of 1-64 GPUs packed onto 8-GPU nodes, with staggered starts (up to 6 h ago), the jobs
    that held the GPUs before them (ended, some within the window), free GPUs, and the usage,
    processes and faults of each."""
    plan = _Plan(now + ahead, ahead)
    now = plan.now
    sizes = []
    while (left := running_gpus - sum(sizes)) > 0:
        sizes.append(min(rng.choices(JOB_SIZES, JOB_SIZE_WEIGHTS)[0], left))
    nodes = math.ceil(running_gpus / (1 - FREE_SHARE) / GPUS_PER_NODE)
    free = {n: list(range(GPUS_PER_NODE)) for n in range(nodes)}
    # Big jobs take whole nodes; small ones fill a partly used node where one has room.
    placed: list[list[tuple[int, int]]] = []
    empty = iter(range(nodes))
    partial: list[int] = []
    for size in sorted(sizes, reverse=True):
        if size >= GPUS_PER_NODE:
            gpus = [(n, i) for _ in range(math.ceil(size / GPUS_PER_NODE)) for n in [next(empty)] for i in free[n]]
        else:
            n = next((n for n in partial if len(free[n]) >= size), None)
            if n is None:
                n = next(empty)
                partial.append(n)
            gpus = [(n, i) for i in free[n]]
        for n, i in gpus[:size]:
            free[n].remove(i)
        placed.append(gpus[:size])
    for n in range(nodes):
        model = "NVIDIA A100-PCIE-40GB" if n % 10 == 9 else "NVIDIA H100 80GB HBM3"
        for i in range(GPUS_PER_NODE):
            for age in (timedelta(days=30), timedelta(hours=20)):  # an older snapshot, then the agent's restart
                plan.topology.append((f"node{n}", now - age, f"GPU-{n}-{i}", i, model,
                                      "0-31" if i < 4 else "32-63",
                                      {f"GPU-{n}-{p}": link for p, link in _links(model, i).items()}))
    job_no = iter(range(10**9))
    for gpus in placed:
        _running_job(plan, str(next(job_no)), gpus, window, rng, job_no)
    for n, idle in free.items():
        for i in idle:  # free GPUs: half freed by a job that ended within the window
            ended = None
            if rng.random() < .5:
                ended = now - ahead - timedelta(minutes=rng.uniform(1, window.total_seconds() / 60 - 2))
            if ended is not None:
                job_id = str(next(job_no))
                start = ended - timedelta(hours=rng.uniform(0.5, 4))
                plan.job(job_id, "gpu", [f"node{n}"], 1, start, ended)
                plan.segments.append(_segment(n, i, job_id, start, ended, BUSY, None, rng))
            plan.segments.append(_segment(n, i, "", ended or now - timedelta(hours=6), now, UNHELD, None, rng))
    # A GPU no job holds with a fault: the node flag's case.
    n, i = next((n, idle[0]) for n, idle in free.items() if idle)
    plan.faults.append((f"node{n}", now - timedelta(minutes=5), "xid", f"GPU-{n}-{i}", None, 48))
    # The cluster's past: finished jobs the jobs table keeps (their data aged out of these windows).
    for _ in range(3 * len(placed)):
        end = now - timedelta(hours=rng.uniform(7, 72))
        plan.job(str(next(job_no)), "gpu", ["node0"], 1, end - timedelta(hours=2), end)
    plan.running = sum(len(g) for g in placed)
    return plan


def _segment(n: int, i: int, job_id: str, start: datetime, end: datetime, pattern: int, idle_at: datetime | None,
             rng: random.Random, **hw: bool) -> tuple[Any, ...]:
    gpm = n % 10 != 9
    fb = 0 if pattern in (NEVER, UNHELD) else rng.choice((3000, 30000, 60000))
    return (f"node{n}", f"GPU-{n}-{i}", i, job_id, start, end, pattern, idle_at, gpm, fb,
            hw.get("throttle", False), hw.get("pcie_low", False), hw.get("sbe_storm", False))


def _running_job(plan: _Plan, job_id: str, gpus: list[tuple[int, int]], window: timedelta, rng: random.Random,
                 job_no: Iterator[int]) -> None:
    """One running job: its usage pattern, its ranks (and for some, data-loader workers), the job
    that held its GPUs before it, and a fault now and then."""
    now = plan.now
    start = now - plan.ahead - timedelta(minutes=rng.uniform(2, 360))  # started before the seeding
    nodes = sorted({n for n, _ in gpus})
    plan.job(job_id, "debug" if rng.random() < .1 else "gpu", [f"node{n}" for n in nodes], len(gpus), start, None)
    roll = rng.random()
    kind = (BUSY if roll < .62 else LOW if roll < .72 else STALL if roll < .78 else LATE_IDLE if roll < .84
            else STRAGGLER if roll < .90 else NO_TENSOR if roll < .95 else NEVER)
    odd = rng.randrange(len(gpus))  # the GPU a straggler, late-idle or never-used job is about
    workers = 2 if rng.random() < .5 else 0
    far = rng.random() < .03
    hw = {"throttle": rng.random() < .01, "pcie_low": rng.random() < .01, "sbe_storm": rng.random() < .005}
    for rank, (n, i) in enumerate(gpus):
        pattern = kind if kind in (LOW, STALL, NO_TENSOR) or (kind != BUSY and rank == odd) else BUSY
        if kind == LATE_IDLE and len(gpus) > 1 and rank != odd:
            pattern = BUSY
        idle_at = now - timedelta(minutes=rng.uniform(4, 25)) if pattern == LATE_IDLE else None
        plan.segments.append(_segment(n, i, job_id, start, now, pattern, idle_at, rng, **hw))
        # The job before it on this GPU, if it ended within the data the seed keeps.
        if start > now - timedelta(hours=6):
            before = str(next(job_no)) + "p"
            plan.job(before, "gpu", [f"node{n}"], 1, start - timedelta(hours=2), start - timedelta(seconds=30))
            plan.segments.append(_segment(n, i, before, start - timedelta(hours=2), start - timedelta(seconds=30),
                                          BUSY, None, rng))
        main_cpu = (100.0 if pattern == STALL and not workers else 60.0 if pattern in (LOW, STALL) else 105.0)
        cpu = (i * 8 + 40) % 64 if far else i * 8 % 64
        plan.procs.append((f"node{n}", plan.next_pid, job_id, rank, i % GPUS_PER_NODE, f"GPU-{n}-{i}", start, now,
                           main_cpu, cpu))
        for w in range(workers):
            worker_cpu = 98.0 if pattern == LOW else 40.0
            plan.procs.append((f"node{n}", plan.next_pid + 1 + w, job_id, rank, i % GPUS_PER_NODE, None, start, now,
                               worker_cpu, cpu + 1 + w))
        plan.next_pid += 1 + workers
    if rng.random() < .02:
        n, i = gpus[odd]
        code = rng.choice((13, 31, 43, 48, 79))
        kind_of = "gpu_lost" if rng.random() < .2 else "xid"
        plan.faults.append((f"node{n}", start + (now - start) * rng.random(), kind_of, f"GPU-{n}-{i}", job_id,
                            None if kind_of == "gpu_lost" else code))


# One roll-up row per segment and bucket: the columns the ingest fold fills, from the pattern.
_ACT = f"""CASE s.pattern WHEN {BUSY} THEN 78 + 17 * random() WHEN {LOW} THEN 12 + 14 * random()
    WHEN {STALL} THEN 45 WHEN {STRAGGLER} THEN 30 + 8 * random() WHEN {NO_TENSOR} THEN 75 + 10 * random()
    WHEN {LATE_IDLE} THEN CASE WHEN b < s.idle_at THEN 80 + 15 * random() ELSE 0 END ELSE 0 END"""
_ROLLUP = f"""
INSERT INTO jobpulse.<table> (width_s, bucket, cluster, job_id, node, gpu_uuid, gpu_index, n, first_ts, last_ts,
    last_act, last_fb_used_mib, last_busy_ts, n_idle, n_busy, sum_sm_util, max_sm_util, sum_mem_util, n_gpm,
    sum_sm_active, sum_tensor_active, max_tensor_active, sum_fb_used_mib, max_fb_used_mib, fb_total_mib, sum_power_w,
    max_power_w, power_limit_w, sum_gpu_temp_c, max_gpu_temp_c, sum_sm_clock_mhz, sm_clock_max_mhz, n_hw_throttle,
    n_loaded, n_pcie_low, pcie_link_low, min_ecc_sbe_total, max_ecc_sbe_total, min_ecc_dbe_total, max_ecc_dbe_total,
    any_remap_pending, any_remap_failure)
SELECT w.w, b, %(cluster)s, s.job_id, s.node, s.gpu_uuid, s.gpu_index, w.w, b, b + make_interval(secs => w.w - 1),
       a.act, s.fb_mib, CASE WHEN a.act > 2 THEN b + make_interval(secs => w.w - 1) END,
       CASE WHEN s.pattern = {STALL} THEN w.w * 4 / 10 WHEN a.act <= 2 THEN w.w ELSE 0 END,
       CASE WHEN s.pattern = {STALL} THEN w.w / 2 WHEN a.act >= 50 THEN w.w ELSE 0 END,
       least(a.act * 1.15, 100) * w.w, least(a.act * 1.15, 100)::smallint, a.act * 0.4 * w.w,
       CASE WHEN s.gpm THEN w.w ELSE 0 END, CASE WHEN s.gpm THEN a.act * w.w END,
       CASE WHEN s.gpm AND s.pattern <> {NO_TENSOR} THEN a.act * 0.3 * w.w WHEN s.gpm THEN 0 END,
       CASE WHEN s.gpm AND s.pattern <> {NO_TENSOR} THEN a.act * 0.4 WHEN s.gpm THEN 0 END,
       s.fb_mib::float8 * w.w, s.fb_mib, 81559, (100 + a.act * 5) * w.w, 100 + a.act * 5.5, 700, 60.0 * w.w, 65,
       1980.0 * w.w, 1980,
       CASE WHEN s.throttle THEN w.w * 3 / 10 ELSE 0 END,
       CASE WHEN a.act * 1.15 >= 50 THEN w.w ELSE 0 END,
       CASE WHEN a.act * 1.15 >= 50 AND s.pcie_low THEN w.w ELSE 0 END,
       CASE WHEN a.act * 1.15 >= 50 AND s.pcie_low THEN '4x8/5x16' END,
       x.sbe, x.sbe + CASE WHEN s.sbe_storm THEN w.w / 5 ELSE 0 END, 0, 0, false, false
  FROM pg_temp.seed_segments s
 CROSS JOIN (VALUES (<width>)) AS w(w)
 CROSS JOIN LATERAL generate_series(
       date_bin(make_interval(secs => w.w), greatest(s.t_from, CASE WHEN w.w = 10 THEN %(fine_from)s END),
                timestamptz 'epoch'),
       s.t_to - interval '1 second', make_interval(secs => w.w)) AS b
 CROSS JOIN LATERAL (SELECT {_ACT} AS act) a
 CROSS JOIN LATERAL (SELECT 10 + CASE WHEN s.sbe_storm THEN extract(epoch FROM b - s.t_from)::bigint / 5 ELSE 0 END
                       AS sbe) x
 ORDER BY b  -- stored in time order, as ingest stores them
"""
_PROCESS_ROLLUP = """
INSERT INTO jobpulse.process_rollup (width_s, bucket, cluster, job_id, node, pid, rank, local_rank, gpu_uuid, command,
    n, n_cpu, sum_cpu_percent, max_cpu_percent, n_sm, sum_sm_util, max_gpu_mem_mib, max_rss_mib)
SELECT w.w, b, %(cluster)s, p.job_id, p.node, p.pid, p.rank, p.local_rank, p.gpu_uuid, 'python', w.w, w.w,
       p.cpu_percent * w.w, p.cpu_percent + 2, CASE WHEN p.gpu_uuid IS NULL THEN 0 ELSE w.w END,
       CASE WHEN p.gpu_uuid IS NULL THEN NULL ELSE 60.0 * w.w END, 30000, 12000
  FROM pg_temp.seed_procs p
 CROSS JOIN (VALUES (60), (300)) AS w(w)
 CROSS JOIN LATERAL generate_series(date_bin(make_interval(secs => w.w), greatest(p.t_from, %(fine_from)s),
                                             timestamptz 'epoch'),
                                    p.t_to - interval '1 second', make_interval(secs => w.w)) AS b
 ORDER BY b
"""
_PROCESS_SAMPLES = """
INSERT INTO jobpulse.process_samples (cluster, node, ts, pid, gpu_uuid, job_id, step, rank, local_rank, gpu_mem_mib,
    sm_util, cpu_percent, rss_mib, command, cpu)
SELECT %(cluster)s, p.node, ts, p.pid, p.gpu_uuid, p.job_id, '0', p.rank, p.local_rank,
       CASE WHEN p.gpu_uuid IS NOT NULL THEN 30000 END, CASE WHEN p.gpu_uuid IS NOT NULL THEN 80 END,
       p.cpu_percent - 2 + 4 * random(), 12000, 'python', p.cpu
  FROM pg_temp.seed_procs p
 CROSS JOIN LATERAL generate_series(greatest(p.t_from, %(raw_from)s), p.t_to, interval '1 second') AS ts
 ORDER BY ts
"""


def seed_cluster(conn: psycopg.Connection, running_gpus: int, window: timedelta, *, ahead: timedelta,
                 fine_history: timedelta, cluster: str = "big", rng_seed: int = 17) -> Cluster:
    """A cluster as the rules meet it: `running_gpus` GPUs in running jobs of 1-64 GPUs with
    staggered starts, on nodes whose every GPU is in the topology (a fifth held by no running job),
    the jobs that ended on them (some within the window), process samples of every rank (and of
    data-loader workers), faults. Roll-up rows are generated directly, in time order as ingest
    stores them (the rules read only roll-ups and recent process samples): 10 s rows for `window` + `fine_history`, 300 s rows since each
    segment began; raw process samples for the last 90 s. Data runs up to now + `ahead`, so cycles
    timed after seeding see a live cluster."""
    rng = random.Random(rng_seed)
    (now,) = conn.execute("SELECT now()").fetchone()
    plan = _plan(now, ahead, running_gpus, window, rng)
    conn.execute("SELECT setseed(0.17)")
    with conn.transaction():
        for name, columns, rows in (("seed_segments", _SEGMENT_COLUMNS, plan.segments),
                                    ("seed_procs", _PROC_COLUMNS, plan.procs)):
            typed = ", ".join(f"{c} {_TYPES.get(c, 'text')}" for c in columns)
            conn.execute(f"CREATE TEMP TABLE {name} ({typed})")
            with conn.cursor().copy(f"COPY {name} FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO jobpulse.jobs (cluster, {', '.join(_JOB_COLUMNS)}, user_name)"
                            f" VALUES (%s, {', '.join(['%s'] * len(_JOB_COLUMNS))}, 'user')",
                            [(cluster, *j) for j in plan.jobs])
            cur.executemany("INSERT INTO jobpulse.topology (cluster, node, ts, gpu_uuid, gpu_index, model,"
                            " cpu_affinity, links) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                            [(cluster, *t[:6], Jsonb(t[6])) for t in plan.topology])
            cur.executemany("INSERT INTO jobpulse.gpu_health_events (cluster, node, ts, kind, gpu_uuid, job_id, code,"
                            " message) VALUES (%s, %s, %s, %s, %s, %s, %s, 'seeded')",
                            [(cluster, *f) for f in plan.faults])
        params = {"cluster": cluster, "fine_from": now - window - fine_history, "raw_from": now - timedelta(seconds=90)}
        rows = {table: conn.execute(_ROLLUP.replace("<table>", table).replace("<width>", str(width)), params).rowcount
                for table, width in (("gpu_rollup_10s", 10), ("gpu_rollup", 300))}
        rows |= {"process_rollup": conn.execute(_PROCESS_ROLLUP, params).rowcount,
                 "process_samples": conn.execute(_PROCESS_SAMPLES, params).rowcount}
        conn.execute("DROP TABLE seed_segments, seed_procs")
    conn.execute("ANALYZE")
    running_jobs = sum(1 for j in plan.jobs if j[5] is None)
    return Cluster(plan.running, len(plan.topology) // 2, running_jobs, len(plan.jobs) - running_jobs, rows)
