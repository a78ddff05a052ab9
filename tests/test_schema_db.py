"""Migrations, partitions ahead and retention, the read-only role, and the indexes that matter."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from jobpulse.collector.embedded.postgres import EmbeddedPostgres
from jobpulse.collector.store.migrate import migrations, objects
from jobpulse.collector.store.read import series
from jobpulse.collector.store.tiers import coarse, compact, partitions
from jobpulse.schema import wire

from .batches import gpu_batch, now
from .conftest import RunningCollector, dsn_for, start_collector, stop_collector

PARENTS = ["events", "fabric_samples", "gpu_health_events", "gpu_rollup", "gpu_rollup_10s", "gpu_samples", "gpu_samples_compact", "ingest_batches",
           "job_bucket_rollup", "node_job_rollup", "node_rollup", "partition_queue", "process_rollup", "process_samples",
           "process_samples_compact", "rank_bins_compact", "step_rollup"]


def jobpulse_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def empty_dsn(postgres: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    name = f"empty_{request.node.name[:40]}".lower().replace("[", "_").replace("]", "")
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return dsn_for(postgres, name)


def test_upgrade_is_repeatable_and_recorded(empty_dsn: str) -> None:
    first = jobpulse_cli("db", "upgrade", "--dsn", empty_dsn)
    assert first.returncode == 0, first.stderr
    assert f"schema version {migrations.available()[-1].version}" in first.stdout and "0001_initial" in first.stdout
    second = jobpulse_cli("db", "upgrade", "--dsn", empty_dsn)
    assert second.returncode == 0 and "up to date" in second.stdout
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT version, name FROM jobpulse.schema_migrations ORDER BY 1").fetchall() == [
            (m.version, m.name) for m in migrations.available()]
        assert migrations.current_version(conn) == migrations.available()[-1].version
        days = partitions.existing(conn)
    today = partitions.utc_today()
    assert sorted(days) == PARENTS
    for table in PARENTS:  # the compact tier's partitions are made by compaction, for the days it writes
        ahead = {today + timedelta(days=d) for d in range(-1, 4)}
        assert days[table] == (set() if table in partitions.ON_DEMAND else ahead)


RANK_SERIES = "SELECT pg_get_functiondef('jobpulse.rank_series(text,text,timestamptz,timestamptz,integer)'::regprocedure)"


def test_a_migration_below_the_newest_that_is_not_recorded_is_applied(empty_dsn: str) -> None:
    """A database upgraded before a lower-numbered migration landed (two branches, either order)
    gets it on the next upgrade: 0022 re-creates an older rank_series, and the function layer's
    current one is applied again after it."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrations.upgrade(conn)
        current = conn.execute(RANK_SERIES).fetchone()[0]
        conn.execute("DELETE FROM jobpulse.schema_migrations WHERE version = 22")
        assert [m.version for m in migrations.upgrade(conn)] == [22]
        assert conn.execute(RANK_SERIES).fetchone()[0] == current
        assert migrations.upgrade(conn) == []


def test_a_renamed_or_edited_migration_is_refused_and_changes_nothing(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrations.upgrade(conn)
        recorded = conn.execute("SELECT checksum FROM jobpulse.schema_migrations WHERE version = 5").fetchone()[0]
        assert recorded == migrations.available()[4].checksum
        conn.execute("UPDATE jobpulse.schema_migrations SET name = 'old_name' WHERE version = 5")
    refused = jobpulse_cli("db", "upgrade", "--dsn", empty_dsn)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "migration 0005 was applied as 'old_name'" in refused.stderr, refused.stderr
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobpulse.schema_migrations SET name = %s, checksum = 'edited' WHERE version = 5",
                     (migrations.available()[4].name,))
        with pytest.raises(migrations.MigrationMismatch, match="differs from the one applied"):
            migrations.upgrade(conn)
        # Recorded before checksums were kept: the shipped file's is adopted.
        conn.execute("UPDATE jobpulse.schema_migrations SET checksum = NULL")
        assert migrations.upgrade(conn) == []
        assert conn.execute("SELECT count(*) FROM jobpulse.schema_migrations WHERE checksum IS NULL").fetchone()[0] == 0


def test_a_changed_function_file_is_applied_again(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrations.upgrade(conn)
        names = [o.name for o in migrations.objects()]
        assert set(names) <= set(conn.execute("SELECT array_agg(name) FROM jobpulse.schema_objects").fetchone()[0])
        current = conn.execute(RANK_SERIES).fetchone()[0]
        # As an older version of this file left it: another definition, another checksum.
        conn.execute(current.replace("GROUP BY 1, 2", "GROUP BY 1, 2 HAVING false", 1))
        conn.execute("UPDATE jobpulse.schema_objects SET checksum = 'older' WHERE name = 'rank_series'")
        migrations.upgrade(conn)
        assert conn.execute(RANK_SERIES).fetchone()[0] == current


def test_every_function_and_view_has_one_home_in_the_ledger(dsn: str) -> None:
    """Issue: a database function was hand-written in `store/migrate/sql/` (the checksummed ledger), generated
    in Python with change detection of its own (a tag in its comment), or an old migration's stale copy.
    Now every function and view in the schema is made from one ledger row, a file's or a generator's,
    whose checksum is its current definition; dropped readers are forgotten, so they are made again."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        made = objects.recorded(conn)
        generated = {"gpu_series": series.gpu_series_sql(), compact.LEDGER_NAME: compact.definition(conn),
                     "coarse_readers": coarse.definition()}
        files = {o.name: o.sql for o in migrations.objects()}
        assert made == {name: objects.checksum(body) for name, body in {**files, **generated}.items()}
        defined = {name for (name,) in conn.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'jobpulse'"
            " UNION SELECT viewname FROM pg_views WHERE schemaname = 'jobpulse'")}
        homes = {name: [row for row, body in {**files, **generated}.items()
                        if re.search(rf"(FUNCTION|VIEW)\s+jobpulse\.{name}\b", body)] for name in defined}
        assert {name: rows for name, rows in homes.items() if len(rows) != 1} == {}, "one home each"
        compact.drop_readers(conn)
        assert compact.LEDGER_NAME not in objects.recorded(conn)
        assert not migrations.upgrade(conn) and conn.execute("SELECT count(*) FROM jobpulse.gpu_samples_all").fetchone()
        assert objects.current(conn, compact.LEDGER_NAME, compact.definition(conn))


def test_upgrade_with_unreachable_database_is_a_clear_error() -> None:
    r = jobpulse_cli("db", "upgrade", "--dsn", "postgresql://nobody@127.0.0.1:1/none")
    assert r.returncode == 1
    assert "cannot use the database" in r.stderr and "Traceback" not in r.stderr
    r = jobpulse_cli("db", "upgrade")
    assert r.returncode == 2 and "--dsn" in r.stderr


def test_retention_drops_whole_partitions(dsn: str) -> None:
    today = partitions.utc_today()
    with psycopg.connect(dsn, autocommit=True) as conn:
        partitions.ensure(conn, [today - timedelta(days=d) for d in range(2, 6)])
        old = today - timedelta(days=5)
        conn.execute("INSERT INTO jobpulse.gpu_samples (cluster, node, ts, gpu_uuid, gpu_index)"
                     " VALUES ('c', 'n', %s, 'GPU-x', 0), ('c', 'n', now(), 'GPU-x', 0)", (str(old) + " 12:00+00",))
    r = jobpulse_cli("db", "maintain", "--dsn", dsn, "--retention-days", "3", "--compact-days", "3")
    assert r.returncode == 0, r.stderr
    assert f"gpu_samples_p{old:%Y%m%d}" in r.stdout
    with psycopg.connect(dsn) as conn:
        kept = partitions.existing(conn)["gpu_samples"]
        assert min(kept) == today - timedelta(days=3)
        assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0] == 1


def test_collector_creates_partitions_ahead_and_on_demand(empty_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        migrations.upgrade(conn)  # no partitions at all yet
    c = start_collector(empty_dsn, tmp_path, "--partitions-ahead", "2")
    try:
        today = partitions.utc_today()
        deadline = time.monotonic() + 20
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            while partitions.common_days(conn) != {today + timedelta(days=d) for d in range(-1, 3)}:
                assert time.monotonic() < deadline, partitions.existing(conn)
                time.sleep(0.2)
        # Late data (a spool replayed after days) gets its partition made when it arrives.
        late = gpu_batch(0, t0=now() - timedelta(days=4))
        with c.client() as http:
            r = http.post("/v1/batches", content=wire.encode(late))
        assert r.status_code == 200, r.text
        with psycopg.connect(empty_dsn) as conn:
            assert today - timedelta(days=4) in partitions.common_days(conn)
            assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0] == 2
    finally:
        stop_collector(c)


def test_reader_role_can_read_not_write(collector: RunningCollector, dsn: str) -> None:
    with collector.client() as http:
        assert http.post("/v1/batches", content=wire.encode(gpu_batch(0))).status_code == 200
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS grafana_test")
        conn.execute("CREATE ROLE grafana_test LOGIN IN ROLE jobpulse_reader")
    reader = dsn.replace("jobpulse@", "grafana_test@")
    with psycopg.connect(reader, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM jobpulse.jobs").fetchone()[0] == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM jobpulse.jobs")


@pytest.mark.parametrize("query,index", [
    ("SELECT * FROM jobpulse.gpu_samples WHERE job_id = '1001' AND ts > now() - interval '1 day'", "_job_id_ts_idx"),
    ("SELECT * FROM jobpulse.process_samples WHERE job_id = '1001' ORDER BY ts", "_job_id_ts_idx"),
    ("SELECT * FROM jobpulse.events WHERE job_id = '1001' ORDER BY ts", "_job_id_ts_idx"),
    ("SELECT * FROM jobpulse.jobs WHERE end_time IS NULL", "jobs_running"),
])
def test_indexes_serve_the_common_queries(dsn: str, query: str, index: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {query}").fetchall())
    # Partitions name their copies of an index <partition>_<columns>_idx.
    assert "Seq Scan" not in plan and index in plan, plan


def test_health_reports_database_down(tmp_path: Path) -> None:
    c = start_collector("postgresql://nobody@127.0.0.1:1/none", tmp_path)
    try:
        r = httpx.get(f"{c.url}/healthz", timeout=10)
        assert r.status_code == 503 and r.json()["database"] == "unreachable"
        with c.client() as http:
            r = http.post("/v1/batches", content=wire.encode(gpu_batch(0)))
        assert r.status_code == 503 and r.headers["Retry-After"].isdigit()
    finally:
        stop_collector(c)
