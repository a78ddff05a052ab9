"""The scheduler's time from pure functions: squeue's suspend_time read on each version's real output,
how slurm-sync names a requeued job's earlier runs (from sacct, or REQUEUED without accounting),
and goodput with suspended and requeued-away time apart."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobpulse.agent.slurm import dialect
from jobpulse.agent.slurm.sync import records, run_ends
from jobpulse.collector.report.goodput import compute, line
from jobpulse.collector.report.text import runs_line
from jobpulse.collector.store.read.job_timeline import Bucket, Parts

pytestmark = pytest.mark.unit
DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
T0 = datetime(2026, 11, 29, 12, tzinfo=UTC)


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_a_suspended_jobs_record_carries_when_slurm_suspended_it(version: str) -> None:
    jobs = dialect.squeue_jobs(json.loads((DATA / f"squeue-{version}.json").read_text()))
    (held,) = [j for j in jobs if j.state == "SUSPENDED"]
    assert held.state_since and held.start and held.state_since >= held.start
    (record,) = [r for r in records(jobs) if r.job_id == held.job_id]
    assert record.state == "SUSPENDED" and record.state_since == datetime.fromtimestamp(held.state_since, UTC)
    assert all(r.state_since is None for r in records(jobs) if r.state != "SUSPENDED")  # never suspended


def test_a_requeued_jobs_earlier_runs_as_accounting_names_them() -> None:
    sacct = {"meta": {"plugin": {"data_parser": "data_parser/v0.0.42"}}, "jobs": [
        {"job_id": 5, "state": {"current": ["PENDING"]}, "time": {"start": 0}},  # the run waiting now
        {"job_id": 5, "state": {"current": ["PREEMPTED"]}, "time": {"start": 1767268900, "end": 1767269000}},
        {"job_id": 5, "state": {"current": ["NODE_FAIL"]}, "time": {"start": 1767268800, "end": 1767268850},
         "exit_code": {"return_code": {"set": True, "number": 0}}}]}
    got = run_ends(json.dumps(sacct), "5", range(2))
    assert [(r.run, r.state, r.end_time) for r in got] == [
        (0, "NODE_FAIL", datetime.fromtimestamp(1767268850, UTC)), (1, "PREEMPTED", datetime.fromtimestamp(1767269000, UTC))]
    assert [(r.run, r.state, r.end_time) for r in run_ends(None, "5", range(1))] == [(0, "REQUEUED", None)]


def test_suspended_time_is_apart_neither_badput_nor_productive() -> None:
    """2 GPUs, 30 min: busy, then suspended 10 min (idle, processes stopped), then busy again."""
    buckets = [Bucket(T0 + timedelta(seconds=10 * i), 10, 2, 0.0 if not 60 <= i < 120 else 2.0) for i in range(180)]
    end, hours = T0 + timedelta(minutes=30), 2 * 1800 / 3600
    held = [(T0 + timedelta(minutes=10), T0 + timedelta(minutes=20))]
    plain = compute({"gpus_total": 2}, [], Parts(buckets, [], None, False), T0, end, hours)
    got = compute({"gpus_total": 2}, [], Parts(buckets, [], None, False, suspended=held), T0, end, hours)
    assert plain["badput_gpu_hours"]["idle"] == pytest.approx(2 * 600 / 3600)  # without the state: idle
    assert got["scheduler_gpu_hours"] == {"suspended": pytest.approx(2 * 600 / 3600)}
    assert "idle" not in got["badput_gpu_hours"] and got["ettr"] == pytest.approx(1.0)
    assert "the scheduler's, apart: suspended 0.33" in line(got) and "of 0.67 GPU-hours" in line(got)


def test_a_preempted_runs_work_since_its_checkpoint_is_the_schedulers() -> None:
    buckets = [Bucket(T0 + timedelta(seconds=10 * i), 10, 1, 0.0) for i in range(60)]
    end, hours = T0 + timedelta(minutes=10), 600 / 3600
    saved = [("checkpoint", T0 + timedelta(minutes=3), T0 + timedelta(minutes=4))]
    got = compute({"gpus_total": 1, "state": "PREEMPTED"}, [], Parts(buckets, saved, None, True), T0, end, hours)
    assert got["scheduler_gpu_hours"]["requeued"] == pytest.approx(6 * 60 / 3600, abs=1e-3)
    assert "lost to failure" not in got["badput_gpu_hours"]


def test_the_runs_in_one_line() -> None:
    runs = [{"run": 0, "state": "NODE_FAIL", "end": T0, "nodes": ["n1", "n2"], "goodput": {"ettr": 0.4}},
            {"run": 1, "state": "COMPLETED", "end": T0, "nodes": ["n3", "n4"], "goodput": None}]
    assert runs_line(runs) == "Runs: run 1 ended NODE_FAIL on n1,n2 (40% productive); run 2 ended COMPLETED on n3,n4"
    assert runs_line([]) is None
