"""The rules' inputs read cycle after cycle with a block cache are the inputs a whole-window read
gives: while samples arrive, a node falls silent and then delivers what it held back, and a job's
GPU on a late node first appears; for the jobs' GPUs and for GPUs no job holds."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from jobpulse.collector.rules import engine, inputs
from jobpulse.collector.rules.model import GpuStats, JobView
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.tiers import partitions, rollup

_SAMPLES = f"""
INSERT INTO pg_temp.{rollup.stage_name("gpu_samples")} (cluster, node, ts, gpu_uuid, gpu_index, job_id, sm_util,
    mem_util, power_w, fb_used_mib, fb_total_mib, pcie_gen, pcie_width, pcie_gen_max, pcie_width_max,
    clock_event_reasons, ecc_sbe_total)
SELECT 'c', %(node)s, ts, %(gpu)s, 0, %(job)s, CASE WHEN extract(minute FROM ts)::int %% 7 < 2 THEN 0 ELSE %(util)s END,
       30, 300, 20000 + extract(minute FROM ts)::int, 81559, 4, 16, 5, 16,
       CASE WHEN extract(second FROM ts)::int %% 30 = 0 THEN 8 ELSE 0 END, extract(epoch FROM ts)::bigint / 60
  FROM generate_series(%(from)s::timestamptz, %(to)s::timestamptz - interval '1 second', interval '5 seconds') ts
"""
# Each GPU's rank and one data-loader worker of that rank, CPU use changing minute by minute.
_PROCESSES = f"""
INSERT INTO pg_temp.{rollup.stage_name("process_samples")} (cluster, node, ts, pid, job_id, rank, gpu_uuid,
    cpu_percent, runnable, command, cpu)
SELECT 'c', %(node)s, ts, %(pid)s + worker, %(job)s, 0, CASE WHEN worker = 0 THEN %(gpu)s END,
       40 + extract(minute FROM ts)::int + 10 * worker, extract(second FROM ts)::int %% 10 < 8,
       CASE WHEN worker = 0 THEN 'python' ELSE 'pt_data_worker' END, worker
  FROM generate_series(%(from)s::timestamptz, %(to)s::timestamptz - interval '1 second', interval '5 seconds') ts,
       generate_series(0, 1) worker
"""


def _send(conn: psycopg.Connection[Any], node: str, gpu: str, job: str | None, start: datetime,
          end: datetime) -> None:
    """One node's samples of one GPU and its processes, stored and folded as ingest stores a batch.
    GPU-a is underused (the rules then read its job's process minutes)."""
    params = {"node": node, "gpu": gpu, "job": job, "from": start, "to": end, "util": 10 if gpu == "GPU-a" else 70,
              "pid": 1000 + 10 * ord(gpu[-1])}
    with conn.transaction():
        conn.execute(_SAMPLES, params)
        conn.execute(rollup.move("gpu_samples"))
        conn.execute(rollup.FOLDS["gpu_samples"])
        if job is not None:
            conn.execute(_PROCESSES, params)
            conn.execute(rollup.move("process_samples"))
            conn.execute(rollup.FOLDS["process_samples"])


def _close(a: Any, b: Any) -> bool:
    """Equal, floats up to summation order (a plan may add a block's rows in another order)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return all(_close(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


def _gpus(views: dict[tuple[str, str], JobView]) -> dict[tuple[str, str], list[GpuStats]]:
    return {key: sorted(v.gpus, key=lambda g: (g.node, g.gpu_uuid)) for key, v in views.items()}


def test_cached_cycles_read_what_a_whole_window_read_gives(dsn: str) -> None:
    thresholds = Thresholds()
    kept, unheld, shape = inputs.Blocks(), inputs.BlockCache(), engine.shape(thresholds)
    held, minutes = kept.jobs, kept.minutes
    with psycopg.connect(dsn, autocommit=True) as conn:
        (now,) = conn.execute("SELECT date_trunc('minute', now()) - interval '50 minutes'").fetchone()
        partitions.ensure(conn, sorted({now.date(), (now + timedelta(hours=1)).date()}))
        conn.execute(rollup.create_stage("gpu_samples"))
        conn.execute(rollup.create_stage("process_samples"))
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, start_time) VALUES ('c', '1', %(t)s), ('c', '2', %(t)s)",
                     {"t": now})
        gpus = [("n1", "GPU-a", "1"), ("n1", "GPU-b", "1"), ("n2", "GPU-c", "2"), ("n3", "GPU-d", None)]

        def cycle(at: datetime, minimum_cached: int) -> None:
            topology = inputs.read_topology(conn)
            cached = engine.read_jobs(conn, thresholds, at, kept, topology=topology)
            whole = engine.read_jobs(conn, thresholds, at, inputs.Blocks(), topology=topology)
            assert _gpus(cached).keys() == _gpus(whole).keys()
            assert _close(list(_gpus(cached).values()), list(_gpus(whole).values()))
            assert {k: v.procs for k, v in cached.items()} == {k: v.procs for k, v in whole.items()}
            assert any(p.cpu_by_minute and p.runnable_by_minute for p in cached[("c", "1")].procs)
            nodes = inputs.gather_unheld(conn, shape, at, topology=topology, blocks=unheld)
            assert _close(_gpus(nodes), _gpus(inputs.gather_unheld(conn, shape, at, topology=topology)))
            assert sum(len(blocks) for gpus in held._jobs.values() for _, blocks in gpus.values()) >= minimum_cached
            assert sum(len(rows) for _, _, rows in minutes._jobs.values()) >= minimum_cached

        for node, gpu, job in gpus:
            _send(conn, node, gpu, job, now, now + timedelta(minutes=25 if node == "n2" else 35))
        cycle(now + timedelta(minutes=35, seconds=7), 30)  # n2 silent for 10 minutes
        for node, gpu, job in gpus:  # n2 delivers what it held back, oldest first
            _send(conn, node, gpu, job, now + timedelta(minutes=25 if node == "n2" else 35),
                  now + timedelta(minutes=40))
        _send(conn, "n4", "GPU-e", "1", now + timedelta(minutes=20), now + timedelta(minutes=40))  # a late node
        cycle(now + timedelta(minutes=40, seconds=3), 30)
        for node, gpu, job in gpus:
            _send(conn, node, gpu, job, now + timedelta(minutes=40), now + timedelta(minutes=41))
        cycle(now + timedelta(minutes=40, seconds=48), 30)  # the window's first block cut anew
        cycle(now + timedelta(minutes=41, seconds=2), 30)


def test_an_idle_gpus_history_is_read_by_its_own_partitions_idle_share(dsn: str, tmp_path: Path) -> None:
    """Issue: the read of an idle GPU's history (since when idle, ever busy) used the default
    idle_share, so a partition's override was ignored there. A GPU busy 20 minutes, then idle in 7 of
    10 samples for an hour, then wholly idle: by the default (95 %) its idle stretch began when the
    mostly idle hour ended; where its partition calls 60 % idle, when the busy minutes did."""
    rules = tmp_path / "rules.toml"
    rules.write_text("[partition.lenient]\nidle_share = 0.6\n")
    with psycopg.connect(dsn, autocommit=True) as conn:
        (start,) = conn.execute("SELECT date_trunc('hour', now()) - interval '3 hours'").fetchone()
        now = start + timedelta(minutes=105)
        partitions.ensure(conn, sorted({start.date(), now.date()}))
        conn.execute(rollup.create_stage("gpu_samples"))
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, partition, start_time) VALUES"
                     " ('c', '7', 'lenient', %(t)s), ('c', '8', 'strict', %(t)s)", {"t": start})
        with conn.transaction():
            conn.execute(f"""
INSERT INTO pg_temp.{rollup.stage_name("gpu_samples")} (cluster, node, ts, gpu_uuid, gpu_index, job_id, sm_util)
SELECT 'c', 'n1', ts, 'GPU-' || job, 0, job,
       CASE WHEN ts < %(start)s + interval '20 minutes' THEN 90
            WHEN ts < %(start)s + interval '80 minutes' AND extract(second FROM ts)::int %% 10 >= 7 THEN 90
            ELSE 0 END
  FROM generate_series(%(start)s::timestamptz, %(now)s::timestamptz, interval '1 second') ts, unnest('{{7,8}}'::text[]) job
""", {"start": start, "now": now})
            conn.execute(rollup.move("gpu_samples"))
            conn.execute(rollup.FOLDS["gpu_samples"])
        views = engine.read_jobs(conn, Thresholds(rules), now, inputs.Blocks())
    since = {key[1]: view.gpus[0].idle_before for key, view in views.items()}
    assert since == {"7": start + timedelta(minutes=20), "8": start + timedelta(minutes=80)}, since
