"""Goodput from a job's buckets alone (the database's part is tests/test_goodput_live.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jobpulse.collector.report.goodput import compute
from jobpulse.collector.store.read.job_timeline import Bucket, Parts

T0 = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _job(busy: list[float], gpus: int = 2) -> dict[str, Any]:
    """The seconds by cause of a job whose 10 s buckets each have ``busy`` of ``gpus`` GPUs working."""
    buckets = [Bucket(T0 + timedelta(seconds=10 * i), 10, gpus, gpus - b) for i, b in enumerate(busy)]
    end = T0 + timedelta(seconds=10 * len(busy))
    hours = gpus * len(busy) * 10 / 3600
    return compute({"gpus_total": gpus}, [], Parts(buckets, [], None, False), T0, end, hours)


def test_a_short_job_that_works_from_its_start_is_productive_not_start_up() -> None:
    """Found by the demo's 90 s jobs: start-up ended only after 3 minutes of work, so a job shorter
    than that, working all along, was all start-up ("0% productive" beside a GPU at 93 %)."""
    got = _job([1.0] * 9)  # one of two GPUs busy for 90 s, the other never
    assert got["ettr"] == 0.5 and got["startup_minutes"] == 0 and "start-up" not in got["badput_gpu_hours"], got


def test_a_gpu_check_before_a_long_load_stays_start_up() -> None:
    got = _job([2.0] * 6 + [0.0] * 60 + [2.0] * 30)  # 1 min check, 10 min load, 5 min work
    assert got["startup_minutes"] == 11 and round(got["badput_gpu_hours"]["start-up"] * 3600) == 2 * 660, got


def test_a_jobs_phase_names_move_time_between_kinds_of_work_only() -> None:
    """The same 2-GPU buckets (one GPU busy, one idle) of a job that fails, with and without a
    checkpoint phase it names over its last minutes: the idle half stays idle and nothing leaves
    "lost to failure" for a phase that did not complete."""
    buckets = [Bucket(T0 + timedelta(seconds=10 * i), 10, 2, 1.0) for i in range(60)]
    end, hours = T0 + timedelta(minutes=10), 2 * 600 / 3600
    plain = compute({"gpus_total": 2, "state": "FAILED"}, [], Parts(buckets, [], None, True), T0, end, hours)
    named = compute({"gpus_total": 2, "state": "FAILED"}, [], Parts(buckets, [("checkpoint", T0 + timedelta(minutes=7),
                                                                                None)], None, True),
                    T0, end, hours)
    for got in (plain, named):
        assert round(got["badput_gpu_hours"]["idle"] * 3600) == 600, got
    assert round(named["badput_gpu_hours"]["lost to failure"] * 3600) == round(
        plain["badput_gpu_hours"]["lost to failure"] * 3600), (plain, named)
