"""The cluster dashboards' pyramid (collector/store/tiers/pyramid.py) on real PostgreSQL, filled through
the real collector: the panels that read it show the numbers the same panels showed from the GPU
roll-ups; builds are idempotent, resumable, and merge late batches; bad ranges are refused."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import psycopg
import pytest

from jobpulse.collector.grafana import dashboards
from jobpulse.collector.grafana.panels import capped_time
from jobpulse.collector.store.read.mig_shares import slice_shares_sql
from jobpulse.collector.store.tiers import pyramid
from jobpulse.schema import wire
from jobpulse.schema.fields import PANELS
from jobpulse.schema.semantics import activity_bucket_sql, activity_mean_sql

from .conftest import RunningCollector
from .grafana_macros import Var, expand
from .test_grafana import GPUS, MINUTES, seed, targets, variables
from .test_ingest_http import post


def wasted_from_gpu_rollup(width_s: int) -> str:
    """The wasted GPU-hours panel as it read gpu_rollup before the pyramid (the reference), in the
    time groups of the pyramid level ``width_s`` the panel reads."""
    return f"""
SELECT $__timeGroupAlias(r.level_bucket, $__interval), coalesce(j.${{group_by:raw}}, '?') AS metric,
       sum(r.n * greatest(coalesce(g.share, s.share, 1)
                          - coalesce(s.share, 1) * {activity_bucket_sql("r.")} / 100, 0)) / 3600 AS value
  FROM (SELECT *, date_bin(interval '{width_s} seconds', bucket, timestamptz 'epoch') AS level_bucket
          FROM jobpulse.gpu_rollup) r JOIN jobpulse.jobs j USING (cluster, job_id)
  LEFT JOIN ({slice_shares_sql("'$cluster'")}) s ON s.node = r.node AND s.gpu_uuid = r.gpu_uuid
  LEFT JOIN jobpulse.job_gpus g ON g.cluster = r.cluster AND g.job_id = r.job_id AND g.node = r.node
       AND g.gpu_uuid = r.gpu_uuid
 WHERE r.width_s = 300 AND r.cluster = '$cluster' AND $__timeFilter(r.bucket)
 GROUP BY 1, 2 ORDER BY 1, 2"""


def per_node_from_gpu_rollup(width_s: int) -> str:
    """Per node and time group from gpu_rollup: what the per-node series must show, in the panels'
    time groups ($__interval, coarser where the nodes chosen times the groups would pass CELLS, whole
    buckets of the pyramid level ``width_s``)."""
    return f"""
SELECT extract(epoch FROM {capped_time("bucket", "cardinality(ARRAY[$node]::text[])", width_s)}), node,
       {activity_mean_sql()}, sum(n_hw_throttle)::float8 / nullif(sum(n), 0) * 100,
       sum(n_pcie_low)::float8 / nullif(sum(n_loaded), 0) * 100
  FROM jobpulse.gpu_rollup WHERE width_s = 300 AND cluster = '$cluster' AND $__timeFilter(bucket)
 GROUP BY 1, 2 ORDER BY 1, 2"""


def build(dsn: str) -> str:
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "db", "pyramid", "--dsn", dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def send_late(collector: RunningCollector, node: str, at: datetime) -> None:
    """30 samples of a GPU of ``node`` from ``at``, in a batch sent now (an agent that buffered them)."""
    agent = wire.AgentInfo(instance=f"late-{node}", node=node, cluster="seedcluster", version="0.1.0", started_at=at)
    batch = wire.Batch(version=1, agent=agent, seq=0, created_at=datetime.now(UTC), gpu_samples=[
        wire.GpuSample(ts=at + timedelta(seconds=s), gpu_uuid=f"GPU-{node}", gpu_index=0, job_id=None, sm_util=40)
        for s in range(30)])
    response = post(collector, wire.encode(batch))
    assert response.status_code == 200, response.text


def query(dsn: str, sql: str, vars_: dict[str, Var], end: datetime, span: timedelta, interval_ms: int) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(expand(sql, vars_, end - span, end, interval_ms)).fetchall()


def panel(name: str, title: str) -> str:
    return next(t[2] for t in targets(dashboards.as_json(dashboards.DASHBOARDS[name]())) if title in t[0])


def series(rows: list[Any], column: int = 2) -> dict[tuple[Any, str], float]:
    return {(r[0], r[1]): pytest.approx(r[column], rel=1e-9, abs=1e-12) for r in rows}


def test_panels_from_the_pyramid_show_what_they_showed_from_gpu_rollup(quiet_collector: RunningCollector,
                                                                       dsn: str) -> None:
    end = seed(quiet_collector, dsn)  # builds the pyramid (jobpulse db pyramid)
    vars_ = variables(dsn)
    many = Var(("n1", "n2", *(f"absent{i}" for i in range(20))), multi=True)  # "All" on a large cluster
    for span, interval_ms in ((timedelta(minutes=15), 1000), (timedelta(hours=1), 5000), (timedelta(hours=6), 20_000),
                              (timedelta(hours=24), 60_000), (timedelta(days=7), 600_000)):
        width = next(w for w, upto in zip(pyramid.LEVELS, (6, 36, 10_000)) if span <= timedelta(hours=upto))
        wasted = query(dsn, panel("cluster", "Wasted GPU-hours"), vars_, end, span, interval_ms)
        reference = query(dsn, wasted_from_gpu_rollup(width), vars_, end, span, interval_ms)
        assert wasted and series(wasted) == series(reference)
        reference = query(dsn, per_node_from_gpu_rollup(width), {**vars_, "node": many}, end, span, interval_ms)
        for title, column in (("Hardware slowdown", 3), ("PCIe link below max", 4)):
            got = query(dsn, panel("node-health", title), {**vars_, "node": many}, end, span, interval_ms)
            assert {r[1] for r in got} == {"n1", "n2"}  # a series per node, not per GPU
            assert series(got) == series([r for r in reference if r[column] is not None], column)
            # Whole buckets of the level read (22 nodes over 7 days in 600 s groups would pass CELLS).
            assert {int(b - a) for a, b in zip(sorted({r[0] for r in got}), sorted({r[0] for r in got})[1:])} <= {width}
    # The NVLink error counters count the seed's minutes (0 .. MINUTES - 1) on each GPU: with every node
    # chosen, a series per node and counter of what it rose by, rises between buckets included.
    labels = {f" {f.label}" for f in PANELS["NVLink errors (increase)"]}
    for span, interval_ms in ((timedelta(hours=6), 20_000), (timedelta(hours=24), 60_000), (timedelta(days=7), 600_000)):
        got = query(dsn, panel("node-health", "NVLink errors"), {**vars_, "node": many}, end, span, interval_ms)
        assert {r[1] for r in got} == {node + label for node in GPUS for label in labels}
        for name in {r[1] for r in got}:  # two GPUs a node, each from 0 to MINUTES - 1
            assert sum(r[2] for r in got if r[1] == name) == 2 * (MINUTES - 1)
        if span == timedelta(hours=6):  # a whole bucket: five minutes' rises on each of two GPUs, not four
            assert max(r[2] for r in got) == 10
    # SM activity is 0.9 of the duty cycle: the idle GPU wastes a whole GPU, the 15 % one 0.865 of one,
    # the two at 90 % 0.19 each.
    hours = sum(r[2] for r in query(dsn, panel("cluster", "Wasted GPU-hours"), vars_, end, timedelta(hours=6), 20_000))
    assert hours == pytest.approx(40 * 60 * (1 + 0.865 + 0.19 + 0.19) / 3600, rel=0.01)
    # The heatmap per node (a cluster over HEATMAP_GPUS GPUs) from the pyramid: the node's GPUs' mean.
    with psycopg.connect(dsn) as conn:
        for width in pyramid.LEVELS:
            per_node = conn.execute(f"SELECT node, {activity_mean_sql()} FROM jobpulse.node_rollup"
                                    " WHERE cluster = 'seedcluster' AND width_s = %s GROUP BY 1 ORDER BY 1",
                                    (width,)).fetchall()
            assert per_node == [("n1", pytest.approx(40.5)), ("n2", pytest.approx(47.25))]
    # A counter that rises exactly between two buckets (the seed's rise inside them): still counted.
    edge = (end - timedelta(minutes=8)).replace(second=0, microsecond=0)  # within the build's relook
    edge -= timedelta(minutes=edge.minute % 5)
    agent = wire.AgentInfo(instance="edge", node="n9", cluster="seedcluster", version="0.1.0", started_at=edge)
    batch = wire.Batch(version=1, agent=agent, seq=0, created_at=datetime.now(UTC), gpu_samples=[
        wire.GpuSample(ts=edge + timedelta(seconds=s), gpu_uuid="GPU-n9", gpu_index=0, job_id=None, sm_util=40,
                       nvlink_replay_errors=int(s >= 0)) for s in range(-30, 30)])
    assert post(quiet_collector, wire.encode(batch)).status_code == 200
    build(dsn)
    got = query(dsn, panel("node-health", "NVLink errors"), {**vars_, "node": Var(("n9", *many.values), multi=True)},
                end, timedelta(hours=6), 20_000)
    rises = {int(r[0]): r[2] for r in got if r[1] == "n9 replay"}
    assert rises[int(edge.timestamp())] == 1 and sum(rises.values()) == 1


def test_builds_are_idempotent_resumable_and_merge_late_batches(quiet_collector: RunningCollector, dsn: str) -> None:
    end = seed(quiet_collector, dsn)
    compare = ("SELECT cluster, job_id, node, bucket, count(*), sum(n), sum(n_hw_throttle) FROM jobpulse.gpu_rollup"
               " WHERE width_s = 300 GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4")
    mine = ("SELECT cluster, job_id, node, bucket, gpus, n, n_hw_throttle FROM jobpulse.node_job_rollup"
            " WHERE width_s = 300 ORDER BY 1, 2, 3, 4")
    with psycopg.connect(dsn) as conn:
        built = conn.execute(mine).fetchall()
        assert built == conn.execute(compare).fetchall()
        hours_are_sums(conn)
        built_to = conn.execute("SELECT built_to FROM jobpulse.pyramid_progress").fetchone()[0]
    assert end - timedelta(minutes=1) <= built_to <= end + timedelta(minutes=6)  # through the open bucket
    build(dsn)  # again: the same rows
    with psycopg.connect(dsn) as conn:
        assert conn.execute(mine).fetchall() == built
    # A batch sent late (4 minutes: buckets already built, well inside the next run's RELOOK even when
    # a loaded machine's clock has crossed a bucket or two since): the next build merges it.
    send_late(quiet_collector, "n3", end - timedelta(minutes=4))
    build(dsn)
    with psycopg.connect(dsn) as conn:
        assert conn.execute(mine).fetchall() == conn.execute(compare).fetchall() != built
        hours_are_sums(conn)
        # Stopped before it began (budget spent): nothing built, built_to where it was; the next run goes on.
        conn.execute("TRUNCATE jobpulse.node_job_rollup")
        conn.execute("UPDATE jobpulse.pyramid_progress SET built_to = %s", (end - timedelta(hours=2),))
        conn.commit()
        done = pyramid.build(conn, max_seconds=-1)
        assert (done.finished, done.rows) == (False, 0)
        assert conn.execute(mine).fetchall() == []
        done = pyramid.build(conn)
        assert done.finished and conn.execute(mine).fetchall() == conn.execute(compare).fetchall()
        hours_are_sums(conn)


def hours_are_sums(conn: psycopg.Connection) -> None:
    """Every coarse row holds the sums of the rows of the level below in its bucket (per job and node,
    and per job), and there is one for every coarse bucket with rows below; every per-node row, the
    sums of its jobs' rows."""
    for below, width in pairwise(pyramid.LEVELS):
        for table, key, values in (("node_job_rollup", "cluster, job_id, node", ("n, n_gpm, n_hw_throttle, n_loaded,"
                                    " n_pcie_low, sum_sm_util, sum_sm_active, wasted_s, inc_nvlink_replay_errors")),
                                   ("job_bucket_rollup", "cluster, job_id", "gpus, wasted_s")):
            gpus = "max(gpus)" if table == "node_job_rollup" else "sum(gpus)"
            sums = ", ".join(f"sum({v.strip()})" for v in values.split(",") if v.strip() != "gpus")
            fine = conn.execute(f"SELECT {key}, date_bin(make_interval(secs => {width}), bucket, timestamptz 'epoch')"
                                f" AS b, {gpus}, {sums} FROM jobpulse.{table} WHERE width_s = {below}"
                                f" GROUP BY {key}, b ORDER BY {key}, b").fetchall()
            got = conn.execute(f"SELECT {key}, bucket, gpus, {values.replace('gpus, ', '')} FROM jobpulse.{table}"
                               f" WHERE width_s = {width} ORDER BY {key}, bucket").fetchall()
            if table == "job_bucket_rollup":  # a job's gpus: its nodes' at this level, summed
                fine = [(*r[:3], *r[4:]) for r in fine]
                got = [(*r[:3], *r[4:]) for r in got]
            assert got == [tuple(pytest.approx(v) if isinstance(v, float) else v for v in r) for r in fine] and got, \
                (table, width)
    # and at every level, a node's row holds its jobs' rows summed
    values = "gpus, n, n_gpm, n_hw_throttle, n_loaded, n_pcie_low, sum_sm_util, sum_sm_active, inc_nvlink_replay_errors"
    per_job = conn.execute(f"SELECT cluster, node, width_s, bucket, {', '.join(f'sum({v})' for v in values.split(', '))}"
                           " FROM jobpulse.node_job_rollup GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4").fetchall()
    per_node = conn.execute(f"SELECT cluster, node, width_s, bucket, {values} FROM jobpulse.node_rollup"
                            " ORDER BY 1, 2, 3, 4").fetchall()
    assert per_node == [tuple(pytest.approx(v) if isinstance(v, float) else v for v in r) for r in per_job] and per_node


def test_a_batch_later_than_the_relook_is_merged_by_the_next_run(quiet_collector: RunningCollector, dsn: str) -> None:
    """Samples older than the relook (a spool replayed after an outage, an import): the ingest marks
    their hour, the next run rebuilds it and deletes the mark (before, they waited for compaction);
    compaction's rebuild of the hour, later, makes the same rows. (The mark itself, and the CLI's
    count of marked hours: tests/test_import.py, with no leader running.)"""
    end = seed(quiet_collector, dsn)
    # 13 h back: its six-hour compact chunk has ended before the 1 h hot window whatever the time of day
    late = (end - timedelta(hours=13)).replace(minute=0, second=0)
    send_late(quiet_collector, "n4", late)
    marks = "SELECT DISTINCT hour FROM jobpulse.pyramid_late"
    have = ("SELECT sum(n) FILTER (WHERE width_s = 300), sum(n) FILTER (WHERE width_s = 3600)"
            " FROM jobpulse.node_job_rollup WHERE node = 'n4'")
    build(dsn)  # (or the test collector's leader, which may run first and take the mark)
    with psycopg.connect(dsn) as conn:
        assert conn.execute(have).fetchone() == (30, 30)  # in its 300 s bucket and in its hour
        assert conn.execute(marks).fetchall() == []
        hours_are_sums(conn)
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "db", "compact", "--raw-hours", "1",
                          "--duty", "1", "--dsn", dsn], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with psycopg.connect(dsn) as conn:
        assert conn.execute(have).fetchone() == (30, 30)


def test_a_range_off_the_buckets_is_refused_and_writes_nothing(dsn: str) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with psycopg.connect(dsn) as conn:
        with pytest.raises(ValueError, match="300 s buckets"):
            pyramid.rebuild(conn, start + timedelta(seconds=7), start + timedelta(hours=1))
        assert conn.execute("SELECT count(*) FROM jobpulse.node_job_rollup").fetchone()[0] == 0
