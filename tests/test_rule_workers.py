"""Rule cycles judged in rule processes (rules/workers.py), each a share of the jobs: the same
verdicts as one process judging them all, a failed worker fails its cycle and is replaced, a
cycle's flags are written as before, and a collector's rule processes end with it."""

from __future__ import annotations

import dataclasses
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobpulse.collector.rules import inputs
from jobpulse.collector.rules.engine import Verdicts, evaluate, verdicts
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.rules.workers import JudgeFailed, Judges
from jobpulse.collector.store.tiers import partitions, rollup
from tests.conftest import start_collector
from tests.test_rule_inputs import _send

JOBS = 8
FLAGS = "SELECT job_id, rule_id, scope_key FROM jobpulse.job_flags ORDER BY 1, 2, 3"


def _seed(conn: psycopg.Connection[Any]) -> datetime:
    """Eight running jobs of one GPU each (the odd ones underused, so input_bound reads their
    process minutes) and a GPU no job holds, sampled for the last 40 minutes; returns a time just
    after the newest sample."""
    (start,) = conn.execute("SELECT date_trunc('minute', now()) - interval '40 minutes'").fetchone()
    end = start + timedelta(minutes=41)
    partitions.ensure(conn, sorted({start.date(), end.date()}))
    conn.execute(rollup.create_stage("gpu_samples"))
    conn.execute(rollup.create_stage("process_samples"))
    for k in range(1, JOBS + 1):
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, start_time) VALUES ('c', %s, %s)", (str(k), start))
        _send(conn, f"n{k}", "GPU-a" if k % 2 else "GPU-b", str(k), start, end)
    _send(conn, "n9", "GPU-d", None, start, end)
    conn.execute("INSERT INTO jobpulse.topology (cluster, node, ts, gpu_uuid, gpu_index, model, links)"
                 " SELECT 'c', 'n' || k, %s,"
                 " CASE WHEN k = 9 THEN 'GPU-d' WHEN k %% 2 = 1 THEN 'GPU-a' ELSE 'GPU-b' END,"
                 " 0, 'NVIDIA H100 80GB HBM3', '{}' FROM generate_series(1, 9) k", (start,))
    return end - timedelta(seconds=53)


def _hits(found: Verdicts) -> tuple[Any, ...]:
    def key(hits: list[Any]) -> list[tuple[Any, ...]]:
        return sorted((h.rule_id, h.scope_key, h.started_at, repr(h.evidence), h.advice) for h in hits)
    return ({k: key(v) for k, v in found.jobs.items()}, {k: key(v) for k, v in found.nodes.items()}, found.gpus,
            found.failed)


@pytest.mark.timeout(180)
def test_rule_processes_give_the_verdicts_of_one(dsn: str) -> None:
    thresholds = Thresholds()
    with psycopg.connect(dsn, autocommit=True) as conn:
        at = _seed(conn)
        whole = verdicts(conn, thresholds, inputs.Blocks(), at)
        one = dataclasses.replace(whole, nodes={})  # the rule processes judge jobs; the leader the rest
        assert len(one.jobs) == JOBS and whole.nodes.keys() == {("c", "n9")}
        assert any(h.rule_id == "input_bound" for hits in one.jobs.values() for h in hits), one.jobs
        shares = conn.execute("SELECT count(DISTINCT (hashtext(cluster || '/' || job_id)::bigint % 3 + 3) % 3)"
                              " FROM jobpulse.jobs").fetchone()[0]
        assert shares == 3  # every process judges some of the jobs
    for processes in (1, 3):
        judges = Judges(dsn, None, processes)
        try:
            for _ in range(2):  # the second cycle from the workers' caches
                assert _hits(judges.verdicts(at)) == _hits(one)
        finally:
            judges.close()


@pytest.mark.timeout(180)
def test_a_failed_rule_process_fails_its_cycle_and_is_replaced(dsn: str) -> None:
    thresholds = Thresholds()
    with psycopg.connect(dsn, autocommit=True) as conn:
        at = _seed(conn)
        one = dataclasses.replace(verdicts(conn, thresholds, inputs.Blocks(), at), nodes={})
        judges = Judges(dsn, None, 2)
        try:
            assert _hits(judges.verdicts(at)) == _hits(one)
            worker = judges._workers[1]
            assert worker is not None
            worker[0].kill()  # died between cycles: the next cycle starts another
            worker[0].join()
            assert _hits(judges.verdicts(at)) == _hits(one)
            # Both workers' sessions ended by the server: this cycle has no verdicts, and no flag may
            # be written or closed from half of them.
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE datname = current_database() AND pid <> pg_backend_pid()")
            with pytest.raises(JudgeFailed, match="rule process 0 failed.*rule process 1 failed"):
                judges.verdicts(at)
            assert judges._workers == [None, None]
            assert _hits(judges.verdicts(at)) == _hits(one)  # new workers, their shares read whole again
        finally:
            judges.close()
    assert judges._workers == [None, None]


@pytest.mark.timeout(180)
def test_a_cycle_judged_in_rule_processes_writes_the_flags(dsn: str) -> None:
    thresholds = Thresholds()
    judges = Judges(dsn, None, 2)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _seed(conn)
        with psycopg.connect(dsn) as conn:
            here = evaluate(conn, thresholds)
            opened = conn.execute(FLAGS).fetchall()
            conn.execute("DELETE FROM jobpulse.job_flags")
            conn.commit()
            there = evaluate(conn, thresholds, judges=judges)
            again = conn.execute(FLAGS).fetchall()
    finally:
        judges.close()
    assert (there.jobs, there.gpus, there.hits, there.node_flags) == (here.jobs, here.gpus, here.hits, here.node_flags)
    assert there.hits > 0 and there.node_flags > 0
    assert again == opened


def _workers_of(pid: int) -> list[int]:
    """The rule processes a collector started (spawned children named by multiprocessing)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"multiprocessing" in cmdline and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1][:3]
                   for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
def test_a_collector_with_rule_processes_raises_flags_and_leaves_none_behind(dsn: str, tmp_path: Path,
                                                                             stop: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        _seed(conn)
    c = start_collector(dsn, tmp_path, "--rules-interval", "1", "--rules-processes", "2")
    try:
        deadline = time.monotonic() + 60
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not conn.execute("SELECT count(*) FROM jobpulse.job_flags").fetchone()[0]:
                assert time.monotonic() < deadline, c.log.read_text()
                time.sleep(0.5)
            jobs = {r[0] for r in conn.execute("SELECT DISTINCT job_id FROM jobpulse.job_flags")}
            nodes = {r[0] for r in conn.execute("SELECT DISTINCT node FROM jobpulse.node_flags")}
        workers = _workers_of(c.proc.pid)
        assert len(workers) == 2
    finally:
        c.proc.send_signal(getattr(signal, stop))
        c.proc.wait(15)
    assert jobs == {str(k) for k in range(1, JOBS + 1)} and nodes == {"n9"}  # every share judged, and the rest
    assert _gone(workers, 15), f"rule processes {workers} outlived the collector ({stop})"
    log = c.log.read_text()
    assert "Traceback" not in log and "rule process" not in log, log
