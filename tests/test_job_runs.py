"""A job's runs and states as the store keeps them from its records (real PostgreSQL, the collector's
own writer): a requeued job's later run starts its row afresh and keeps the earlier run in job_runs
(its end, its NODE_FAIL, its nodes), whatever order the records come in; the controller's states
make job_states' intervals."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from jobpulse.collector.store.database import Storage, ValidBatch
from jobpulse.schema import wire

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
_SEQ = itertools.count()


def _agent(node: str) -> wire.AgentInfo:
    return wire.AgentInfo(instance=f"runs-{node}", node=node, cluster="runs", version="0.1.0",
                          started_at=datetime(2026, 1, 1, tzinfo=UTC))


def store(dsn: str, *records: tuple[str, dict[str, Any]]) -> None:
    """Each (node, record) in its own batch, in this order, as the collector stores them."""
    async def go() -> None:
        storage = Storage(dsn)
        await storage.open()
        try:
            for node, fields in records:
                batch = wire.Batch(version=1, agent=_agent(node), seq=next(_SEQ), created_at=T0,
                                   jobs=[wire.JobRecord(**fields)])
                await storage.store([ValidBatch.spanning(batch, T0, T0)])
        finally:
            await storage.close()
    asyncio.run(go())


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def test_a_requeued_job_keeps_its_earlier_run_and_its_row_describes_the_new_one(dsn: str) -> None:
    store(dsn,
          ("n1", {"job_id": "7", "run": 0, "start_time": at(0), "nodes": ["n1", "n2"], "gpus_total": 4}),
          ("ctld", {"job_id": "7", "run": 0, "state": "RUNNING", "start_time": at(0)}),
          ("n1", {"job_id": "7", "end_time": at(20)}),  # the epilog: no state, no run
          ("ctld", {"job_id": "7", "run": 0, "state": "NODE_FAIL", "end_time": at(20), "exit_code": 0}),
          ("n3", {"job_id": "7", "run": 1, "start_time": at(23), "nodes": ["n3", "n4"], "gpus_total": 4}),
          ("ctld", {"job_id": "7", "run": 1, "state": "RUNNING", "start_time": at(23)}))
    (job,) = rows(dsn, "SELECT run, start_time, end_time, state, nodes, rules_final_at FROM jobpulse.jobs"
                       " WHERE job_id = '7'")
    assert job == (1, at(23), None, "RUNNING", ["n3", "n4"], None)
    assert rows(dsn, "SELECT run, start_time, end_time, state, exit_code, nodes FROM jobpulse.job_runs"
                     " WHERE job_id = '7'") == [(0, at(0), at(20), "NODE_FAIL", 0, ["n1", "n2"])]
    # the states: run 0 RUNNING until its end, run 1 RUNNING since its start
    assert rows(dsn, "SELECT run, state, since, until, source FROM jobpulse.job_states WHERE job_id = '7'"
                     " ORDER BY since") == [(0, "RUNNING", at(0), at(20), "slurm"), (1, "RUNNING", at(23), None, "slurm")]


def test_an_earlier_runs_records_that_arrive_late_never_touch_the_new_run(dsn: str) -> None:
    """The node that failed delivers its epilog when it comes back, after the next run began; slurm-sync
    names how the run ended after the next run registered: both go to run 0, the row keeps run 1."""
    store(dsn,
          ("n1", {"job_id": "8", "run": 0, "start_time": at(0), "nodes": ["n1"], "gpus_total": 2}),
          ("n2", {"job_id": "8", "run": 1, "start_time": at(10), "nodes": ["n2"], "gpus_total": 2}),
          ("n1", {"job_id": "8", "end_time": at(8), "state": "FAILED", "exit_code": 137}),  # late epilog
          ("ctld", {"job_id": "8", "run": 0, "state": "NODE_FAIL", "end_time": at(8)}))
    assert rows(dsn, "SELECT run, start_time, end_time, state, nodes FROM jobpulse.jobs WHERE job_id = '8'") == [
        (1, at(10), None, None, ["n2"])]
    # the controller's end state wins over the node's; the node's exit code stays
    assert rows(dsn, "SELECT run, start_time, end_time, state, exit_code FROM jobpulse.job_runs WHERE job_id = '8'") == [
        (0, at(0), at(8), "NODE_FAIL", 137)]


def test_a_run_requeued_with_no_word_of_why_reads_requeued(dsn: str) -> None:
    store(dsn,
          ("n1", {"job_id": "9", "run": 0, "start_time": at(0), "nodes": ["n1"]}),
          ("ctld", {"job_id": "9", "run": 0, "state": "RUNNING"}),
          ("n1", {"job_id": "9", "run": 2, "start_time": at(30), "nodes": ["n1"]}))
    assert rows(dsn, "SELECT run, state, end_time FROM jobpulse.job_runs WHERE job_id = '9'") == [(0, "REQUEUED", None)]
    assert rows(dsn, "SELECT run, start_time, end_time FROM jobpulse.jobs WHERE job_id = '9'") == [(2, at(30), None)]


def test_suspended_and_resumed_make_three_intervals(dsn: str) -> None:
    store(dsn,
          ("n1", {"job_id": "10", "run": 0, "start_time": at(0), "nodes": ["n1"]}),
          ("ctld", {"job_id": "10", "run": 0, "state": "RUNNING", "start_time": at(0)}),
          ("ctld", {"job_id": "10", "run": 0, "state": "SUSPENDED", "state_since": at(5)}),
          ("ctld", {"job_id": "10", "run": 0, "state": "RUNNING", "state_since": at(15)}),
          ("ctld", {"job_id": "10", "run": 0, "state": "COMPLETED", "end_time": at(30), "exit_code": 0}))
    assert rows(dsn, "SELECT state, since, until FROM jobpulse.job_states WHERE job_id = '10' ORDER BY since") == [
        ("RUNNING", at(0), at(5)), ("SUSPENDED", at(5), at(15)), ("RUNNING", at(15), at(30))]
    assert rows(dsn, "SELECT state, end_time FROM jobpulse.jobs WHERE job_id = '10'") == [("COMPLETED", at(30))]


def test_the_controllers_exact_end_moves_the_last_interval_and_a_state_of_no_second_gives_way(dsn: str) -> None:
    """The epilog's end (its clock, a moment later) closes the run's last interval; slurm-sync's end,
    Slurm's own, then moves it. A suspension resumed within its second leaves no empty interval."""
    store(dsn,
          ("n1", {"job_id": "11", "run": 0, "start_time": at(0), "nodes": ["n1"]}),
          ("ctld", {"job_id": "11", "run": 0, "state": "RUNNING", "start_time": at(0)}),
          ("ctld", {"job_id": "11", "run": 0, "state": "SUSPENDED", "state_since": at(5)}),
          ("ctld", {"job_id": "11", "run": 0, "state": "RUNNING", "state_since": at(5)}),
          ("n1", {"job_id": "11", "end_time": at(10.1)}),
          ("ctld", {"job_id": "11", "run": 0, "state": "COMPLETED", "end_time": at(10), "exit_code": 0}))
    assert rows(dsn, "SELECT state, since, until FROM jobpulse.job_states WHERE job_id = '11' ORDER BY since") == [
        ("RUNNING", at(0), at(5)), ("RUNNING", at(5), at(10))]
