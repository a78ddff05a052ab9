"""jobpulse on a real Citus cluster (a coordinator and two workers started here, ports and folders
of their own, stopped by PID): `db upgrade --citus`, ingest from real agents through a real
collector, the roll-up fold, rules raising and closing flags, every dashboard query, `jobpulse
report` and the backtest, each compared with the same on one PostgreSQL server. Without Citus
installed these tests skip and say why; with JOBPULSE_REQUIRE_CITUS=1 (CI) they fail instead.

The catalog tests at the top run on plain PostgreSQL: they keep the schema distributable."""

from __future__ import annotations

import contextlib
import decimal
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobpulse.collector.embedded.citus_cluster import EmbeddedCitus, citus_installed, citus_library
from jobpulse.collector.embedded.postgres import EmbeddedPostgres
from jobpulse.collector.grafana import dashboards
from jobpulse.collector.grafana import provisioning as grafana_provisioning
from jobpulse.collector.store.migrate import citus
from jobpulse.collector.store.tiers import compact, fold, partitions, rollup
from jobpulse.schema import wire

from . import test_agent_e2e, test_backtest, test_grafana
from .conftest import RunningCollector, dsn_for, start_collector, stop_collector
from .grafana_macros import expand
from .test_agent_e2e import ranks  # noqa: F401 - the fixture the end-to-end test needs
from .test_compact import straddling_start
from .test_ingest_http import post

SHARDS = 4  # per group: two per worker, few shard tables to create per daily partition
_databases = itertools.count()


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", *args, "--dsn", dsn],
                          capture_output=True, text=True, timeout=300)


# -- on plain PostgreSQL ------------------------------------------------------------------------

def test_every_unique_key_of_a_distributed_table_includes_its_distribution_column(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'jobpulse' AND c.relkind IN ('r', 'p') AND NOT c.relispartition")}
        placed = {p.table for p in citus.PLACEMENT}
        assert tables == placed | set(citus.LOCAL), "every table is placed (distributed, reference) or kept local"
        for p in citus.PLACEMENT:
            if p.column is None:
                continue
            keys = conn.execute(
                "SELECT i.indexrelid::regclass::text, array_agg(a.attname::text) FROM pg_index i"
                " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
                " WHERE i.indrelid = %s::regclass AND i.indisunique GROUP BY 1", (f"jobpulse.{p.table}",)).fetchall()
            for name, columns in keys:
                assert p.column in columns, f"{name} of {p.table} lacks its distribution column {p.column}"
        groups = {p.table: p.colocate_with or p.table for p in citus.PLACEMENT if p.column}
        assert groups["gpu_rollup"] == groups["job_flags"] == groups["job_gpus"] == "jobs", "a job's data co-located"


def test_upgrade_citus_on_plain_postgres_says_why_and_changes_nothing(postgres: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE no_citus")
    dsn = dsn_for(postgres, "no_citus")
    out = cli(dsn, "db", "upgrade", "--citus")
    assert out.returncode == 1 and "citus extension is not installed" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('jobpulse')").fetchone() == (None,)


def test_readers_become_plpgsql_arm_by_arm() -> None:
    sql_fn = ("CREATE OR REPLACE FUNCTION jobpulse.f(p integer)\n RETURNS TABLE(x integer)\n LANGUAGE sql\n STABLE\n"
              "AS $function$\nSELECT 1 WHERE p > 0\nUNION ALL\nSELECT 2 WHERE p <= 0\n$function$\n")
    assert citus.as_plpgsql(sql_fn) == (
        "CREATE OR REPLACE FUNCTION jobpulse.f(p integer)\n RETURNS TABLE(x integer)\n LANGUAGE plpgsql\n STABLE\n"
        "AS $function$\n#variable_conflict use_column\nBEGIN\nRETURN QUERY\nSELECT 1 WHERE p > 0;\n"
        "RETURN QUERY\nSELECT 2 WHERE p <= 0;\nEND\n$function$\n")
    with pytest.raises(ValueError, match="not a one-query SQL function"):
        citus.as_plpgsql(sql_fn.replace("LANGUAGE sql", "LANGUAGE plpgsql"))


# -- on a Citus cluster -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def citus_cluster() -> Iterator[EmbeddedCitus]:
    if not citus_installed():
        why = (f"Citus is not installed ({citus_library()} is missing): install Citus 12.1 for this PostgreSQL"
               " (docs/scaling.md)")
        if os.environ.get("JOBPULSE_REQUIRE_CITUS") == "1":
            pytest.fail(f"JOBPULSE_REQUIRE_CITUS=1 but {why}")
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="jobpulse-test-citus-"))  # /tmp: the servers run unprivileged
    cluster = EmbeddedCitus(base, workers=2, settings={"fsync": "off"})  # as the one-server test PostgreSQL
    with cluster.running():
        yield cluster
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def citus_dsn(citus_cluster: EmbeddedCitus) -> str:
    """A fresh database on the cluster, upgraded and distributed by `jobpulse db upgrade --citus`."""
    dsn = citus_cluster.create_database(f"c{os.getpid()}_{next(_databases)}")
    out = cli(dsn, "db", "upgrade", "--citus", "--shard-count", str(SHARDS), "--partitions-ahead", "1")
    assert out.returncode == 0 and f"distributed: {len(citus.PLACEMENT)} tables ({SHARDS} shards a group)" in out.stdout, \
        out.stdout + out.stderr
    return dsn


@pytest.fixture
def pair(dsn: str, citus_dsn: str, tmp_path: Path) -> Iterator[dict[str, tuple[str, RunningCollector]]]:
    """One server and the cluster, each with a collector whose rules sleep (the tests run the cycles)."""
    out: dict[str, tuple[str, RunningCollector]] = {}
    try:
        for name, d in (("one server", dsn), ("citus", citus_dsn)):
            (tmp_path / name).mkdir()
            out[name] = (d, start_collector(d, tmp_path / name, "--rules-interval", "86400"))
        yield out
    finally:
        for _, c in out.values():
            stop_collector(c)
    for _, c in out.values():
        assert "Traceback" not in c.log.read_text(), c.log.read_text()


def rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()


def worker_of(dsn: str, table: str, value: str) -> int:
    """The port of the worker holding the shard of ``table`` for distribution value ``value``."""
    return int(rows(dsn, "SELECT nodeport FROM citus_shards WHERE shardid ="
                         " get_shard_id_for_distribution_column(%s::regclass, %s::text)", f"jobpulse.{table}", value)[0][0])


def canonical(value: Any) -> Any:
    """Values as compared across the two databases: floats to 9 significant digits (sums in another
    order), everything else as is."""
    if isinstance(value, (float, decimal.Decimal)):
        return float(f"{float(value):.9g}")
    if isinstance(value, (list, tuple)):
        return type(value)(canonical(v) for v in value)
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    return value


def agree(a: Any, b: Any, clock: bool) -> bool:
    """Equal; with ``clock``, floats within 0.1 % and times within 5 s (``now()`` read twice)."""
    if clock and isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-3)
    if clock and isinstance(a, datetime) and isinstance(b, datetime):
        return abs(a - b) <= timedelta(seconds=5)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(agree(x, y, clock) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(agree(a[k], b[k], clock) for k in a)
    return bool(a == b)


def same_everywhere(dsns: dict[str, str], what: str, run: Callable[[str], Any], clock: bool = False) -> Any:
    """``run`` on both databases gives the same result. Where it reads the clock (``now()``), run
    once more if they differ (a 10 s bucket may have passed between the two runs) and let times
    measured up to now differ a little."""
    for attempt in (1, 2):
        got = {name: canonical(run(d)) for name, d in dsns.items()}
        one, other = got.values()
        if agree(one, other, clock) or not clock or attempt == 2:
            break
    assert agree(one, other, clock), f"{what}: one server and Citus differ\n{got}"
    return one


def flags(dsn: str) -> list[tuple[Any, ...]]:
    return rows(dsn, "SELECT job_id, rule_id, scope, scope_key, started_at, ended_at IS NULL, severity"
                     " FROM jobpulse.job_flags ORDER BY 1, 2, 3, 4")


def evaluate_together(dsns: dict[str, str]) -> list[tuple[Any, ...]]:
    """One rule cycle on both databases at once, from no flags, until both cycles read the same clock
    to the 10 s bucket (a flag starts at a bucket of the window the cycle's clock sets); their flags."""
    for _ in range(3):
        for d in dsns.values():
            with psycopg.connect(d) as conn:
                conn.execute("DELETE FROM jobpulse.job_flags")
        procs = [subprocess.Popen([sys.executable, "-m", "jobpulse.collector.cli", "rules", "evaluate", "--dsn", d],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in dsns.values()]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        got = [flags(d) for d in dsns.values()]
        if got[0] == got[1]:
            return got[0]
    return same_everywhere(dsns, "flags raised", flags)


@pytest.mark.citus
def test_dashboards_rules_and_report_on_citus_match_one_server(pair: dict[str, tuple[str, RunningCollector]],
                                                               tmp_path: Path) -> None:
    end = datetime.now(UTC).replace(microsecond=0)
    for d, c in pair.values():
        test_grafana.seed(c, d, end)  # through the collector (group-committed COPY), then one rule cycle
    dsns = {name: d for name, (d, _) in pair.items()}
    citus_dsn = dsns["citus"]

    # The fold: every sample counted once in each roll-up width, on the shards as on one server.
    fold = ("SELECT width_s, node, gpu_uuid, sum(n), sum(n_idle), sum(n_busy), max(max_sm_util) FROM jobpulse.gpu_rollup"
            " GROUP BY 1, 2, 3 UNION ALL SELECT width_s, node, gpu_uuid, sum(n), sum(n_idle), sum(n_busy), max(max_sm_util)"
            " FROM jobpulse.gpu_rollup_10s GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
    folded = same_everywhere(dsns, "gpu roll-ups", lambda d: rows(d, fold))
    assert {r[3] for r in folded} == {test_grafana.MINUTES * 60}
    same_everywhere(dsns, "process and step roll-ups", lambda d: rows(
        d, "SELECT 'p', width_s, rank, sum(n)::float8, sum(sum_cpu_percent) FROM jobpulse.process_rollup GROUP BY 2, 3"
           " UNION ALL SELECT 's', width_s, rank, sum(n)::float8, sum(sum_samples_per_s) FROM jobpulse.step_rollup"
           " GROUP BY 2, 3 ORDER BY 1, 2, 3"))

    # Rules raised the same flags (the never-used GPU; the GPU at 15 % among GPUs at 90 %, a straggler
    # behind n2's trained-down port: the node's fault, not the job's imbalance).
    raised = evaluate_together(dsns)
    assert {("5001", "over_allocation", "job", ""), ("5001", "fabric_degraded", "job", "n2")} <= {
        r[:4] for r in raised}

    # Every panel, variable and annotation query, expanded as Grafana does, over three ranges, each
    # database's on one connection as Grafana's pool keeps them (a new one per query costs Citus a
    # backend and its connections to the workers).
    ran = 0
    variables = test_grafana.variables(citus_dsn)
    with contextlib.ExitStack() as stack:
        conns = {d: stack.enter_context(psycopg.connect(d, autocommit=True)) for d in dsns.values()}
        for name, fn in dashboards.DASHBOARDS.items():
            for what, fmt, sql in test_grafana.targets(dashboards.as_json(fn())):
                for label, (span, interval_ms) in test_grafana.RANGES.items():
                    query = expand(sql, variables, end - span, end, interval_ms)

                    as_returned: dict[str, list[tuple[Any, ...]]] = {}

                    def run(d: str, query: str = query, kept: dict[str, Any] = as_returned) -> tuple[list[str], list[Any]]:
                        cur = conns[d].execute(query)
                        kept[d] = cur.fetchall()
                        return [c.name for c in cur.description], sorted(kept[d], key=repr)
                    columns, _ = same_everywhere(dsns, f"{name} {what} ({label})", run, clock="now()" in query)
                    test_grafana.check_shape(f"{what} ({name}, {label}) on Citus", fmt, columns, as_returned[citus_dsn])
                    ran += 1
    for rule in grafana_provisioning.alerting_yaml()["groups"][0]["rules"]:
        query = expand(rule["data"][0]["model"]["rawSql"], {}, end - timedelta(minutes=10), end, 1000)
        assert same_everywhere(dsns, f"alert {rule['uid']}", lambda d, q=query: sorted(rows(d, q), key=repr),
                               clock=True)
        ran += 1

    # jobpulse report, as JSON and text.
    def report(d: str, fmt: str) -> str:
        out = cli(d, "report", test_grafana.JOB, "--format", fmt)
        assert out.returncode == 0, out.stderr
        return out.stdout
    def facts(d: str) -> dict[str, Any]:
        data = json.loads(report(d, "json"))
        for stamp in ("first_seen", "updated_at"):  # when each database received the job
            data["job"].pop(stamp)
        return dict(data)
    same_everywhere(dsns, "report (json)", facts, clock=True)
    same_everywhere(dsns, "report (text)", lambda d: report(d, "text"), clock=True)

    # The job ends: the next cycle closes its flags at its end time, on both.
    job_end = end - timedelta(minutes=1)
    for d, c in pair.values():
        done = wire.JobRecord(job_id=test_grafana.JOB, end_time=job_end, state="COMPLETED", exit_code=0)
        agent = wire.AgentInfo(instance="seed-n1", node="n1", cluster="seedcluster", version="0.1.0", started_at=end)
        assert post(c, wire.encode(wire.Batch(version=1, agent=agent, seq=10_000, created_at=end, jobs=[done]))
                    ).status_code == 200
        out = cli(d, "rules", "evaluate")
        assert out.returncode == 0, out.stderr
    closed = same_everywhere(dsns, "flags closed", lambda d: rows(
        d, "SELECT job_id, rule_id, scope_key, ended_at FROM jobpulse.job_flags ORDER BY 1, 2, 3"))
    assert closed and all(r[3] is not None for r in closed)
    assert ("5001", "over_allocation", "", job_end) in closed
    print(f"\n{ran} dashboard and alert queries, the report and {len(raised)} flags agree on Citus and one server")


@pytest.mark.citus
def test_backtest_on_citus_matches_one_server(pair: dict[str, tuple[str, RunningCollector]]) -> None:
    start = (datetime.now(UTC) - timedelta(minutes=test_backtest.MINUTES + 5)).replace(second=0,
                                                                                                 microsecond=0)
    for _, c in pair.values():
        test_backtest.seed(c, start)
    end = start + timedelta(minutes=test_backtest.MINUTES)
    got = same_everywhere({n: d for n, (d, _) in pair.items()}, "backtest",
                          lambda d: test_backtest.backtest(d, start, end, "--format", "json"))
    assert {(f["job_id"], f["rule_id"], f["scope_key"]) for f in got["replayed"]} >= {("7001", "idle_gpu", "n1/GPU-b1")}


def fold_now(dsn: str) -> None:
    """The leader's fold, up to now, through the coordinator (what its next run would do)."""
    with psycopg.connect(dsn) as conn:
        assert fold.run(conn, timedelta(0), begin=False).end is not None, "the collector's leader set the mark"


@pytest.mark.citus
def test_agents_ingest_through_the_coordinator(fake_nvml: Path, citus_dsn: str, tmp_path: Path,
                                               ranks: list) -> None:  # type: ignore[type-arg]  # noqa: F811
    """Two agents on the fake NVML ship to a collector on the coordinator: every assertion of the
    one-server end-to-end test holds; the leader's fold and the ingest's counted every sample once; a job's rows of the job
    tables are on one worker; the rows of GPUs with no job spread over both workers."""
    c = start_collector(citus_dsn, tmp_path)
    try:
        test_agent_e2e.test_two_node_job_end_to_end(fake_nvml, c, citus_dsn, tmp_path, ranks)
        fold_now(citus_dsn)
        raw = rows(citus_dsn, "SELECT gpu_uuid, count(*) FROM jobpulse.gpu_samples GROUP BY 1 ORDER BY 1")
        for table in ("gpu_rollup_10s", "gpu_rollup"):
            assert rows(citus_dsn, f"SELECT gpu_uuid, sum(n) FROM jobpulse.{table} GROUP BY 1 ORDER BY 1") == raw, \
                "every sample folded once"
        job = rows(citus_dsn, "SELECT job_id FROM jobpulse.jobs")[0][0]
        job_tables = ("jobs", "job_gpus", "job_flags", "gpu_rollup", "gpu_rollup_10s", "process_rollup")
        assert len({worker_of(citus_dsn, t, job) for t in job_tables}) == 1, "a job's rows on one worker"

        # GPUs no job holds, on eight nodes: their samples land on both workers.
        now = datetime.now(UTC).replace(microsecond=0)
        for n in range(8):
            agent = wire.AgentInfo(instance=f"idle-{n}", node=f"idle{n}", cluster="c", version="0.1.0", started_at=now)
            samples = [wire.GpuSample(ts=now - timedelta(seconds=s), gpu_uuid=f"GPU-idle{n}", gpu_index=0, sm_util=0)
                       for s in range(5)]
            body = wire.encode(wire.Batch(version=1, agent=agent, seq=1, created_at=now, gpu_samples=samples))
            assert post(c, body).status_code == 200
            again = post(c, body)  # a replay: acknowledged, neither stored nor folded again
            assert again.status_code == 200 and again.json()["status"] == "duplicate", again.text
        fold_now(citus_dsn)
        idle = "SELECT gpu_uuid, sum(n) FROM jobpulse.{} WHERE gpu_uuid LIKE 'GPU-idle%%' GROUP BY 1 ORDER BY 1"
        for table in ("gpu_rollup_10s", "gpu_rollup"):
            assert rows(citus_dsn, idle.format(table)) == [(f"GPU-idle{n}", 5) for n in range(8)], table
        per_node = rows(citus_dsn, "SELECT node, count(*) FROM jobpulse.gpu_samples WHERE job_id IS NULL"
                                   " AND node LIKE 'idle%%' GROUP BY 1")
        assert sorted(per_node) == [(f"idle{n}", 5) for n in range(8)]
        assert len({worker_of(citus_dsn, "gpu_samples", node) for node, _ in per_node}) == 2, "spread over both"
        with psycopg.connect(citus_dsn) as conn:  # without --shard-count: four a worker
            assert citus.default_shard_count(conn) == 2 * citus.SHARDS_PER_WORKER == 8
    finally:
        stop_collector(c)
    assert "Traceback" not in c.log.read_text(), c.log.read_text()


@pytest.mark.citus
def test_compaction_on_citus_keeps_every_sample_as_on_one_server(dsn: str, citus_dsn: str) -> None:
    """Partitions of past days made and tuned as ingest makes them; samples past the hot window
    packed by `compact` chunk by chunk: raw and compact tiers on the shards hold each sample exactly
    once, and read back as on one server."""
    hour = straddling_start()  # two hours from it: two chunks per node
    read = ("SELECT node, gpu_uuid, job_id, ts, sm_util, power_w FROM jobpulse.gpu_samples_between(%s, %s)"
            " ORDER BY node, gpu_uuid, ts")
    again = cli(citus_dsn, "db", "upgrade", "--citus", "--partitions-ahead", "1")  # a second run: nothing to do
    assert again.returncode == 0 and "distributed: 0 tables" in again.stdout, again.stdout + again.stderr
    for d in (dsn, citus_dsn):
        with psycopg.connect(d, autocommit=True) as conn:
            partitions.ensure(conn, [hour.date(), (hour + timedelta(hours=2)).date()])
            tuned = rollup.tune(conn)  # what ingest does when it makes a day's partitions
            assert f"gpu_rollup_p{hour:%Y%m%d}" in tuned, tuned
            conn.execute(  # two hours of four GPUs on three nodes (two chunks), one GPU with no job
                "INSERT INTO jobpulse.gpu_samples (cluster, node, ts, gpu_uuid, gpu_index, job_id, sm_util, power_w)"
                " SELECT 'c', 'n' || (g %% 3), %s + make_interval(secs => s), 'GPU-' || g, g,"
                " CASE WHEN g > 0 THEN 'j' || g END, s %% 100, 100.5 + g FROM generate_series(0, 3) g,"
                " generate_series(0, 7199) s", (hour,))
            conn.execute(  # and two processes of each GPU's rank (the rank bins rank_series reads)
                "INSERT INTO jobpulse.process_samples (cluster, node, ts, pid, job_id, rank, sm_util, cpu_percent)"
                " SELECT 'c', 'n' || (g %% 3), %s + make_interval(secs => s), 100 * g + w, 'j1', g,"
                " CASE WHEN w = 0 THEN s %% 100 END, (s %% 7) * 10.5 + w FROM generate_series(0, 3) g,"
                " generate_series(0, 1) w, generate_series(0, 7199, 2) s", (hour,))
            done = compact.compact(conn, duty=1)
            assert done.chunks == 12, done
            assert done.samples == {"gpu_samples": 4 * 7200, "process_samples": 4 * 2 * 3600}, done
            assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone() == (0,)
    same_everywhere({"one server": dsn, "citus": citus_dsn}, "compacted samples",
                    lambda d: rows(d, read, hour, hour + timedelta(hours=2)))
    binned = same_everywhere({"one server": dsn, "citus": citus_dsn}, "ranks in 10 s bins", lambda d: rows(
        d, "SELECT * FROM jobpulse.rank_series('c', 'j1', %s, %s, 12) ORDER BY 1, 2", hour, hour + timedelta(hours=1)))
    # 12 s steps of whole 10 s bins: an hour and the bin starting at its end
    assert len(binned) == 4 * 301 and {r[-1] for r in binned} == {"process_samples 10 s bins"}
    with psycopg.connect(citus_dsn, autocommit=True) as conn:  # chunks compacted before the bins existed
        conn.execute("DELETE FROM jobpulse.rank_bins_compact WHERE node = 'n1'")
    assert rows(citus_dsn, "SELECT * FROM jobpulse.rank_series('c', 'j1', %s, %s, 12) ORDER BY 1, 2", hour,
                hour + timedelta(hours=1)) == binned
