"""A job Slurm suspended for 10 minutes and resumed, through the real collector and `jobpulse rules
backtest` (the library's scenario `suspended_resumed_4gpu`): no flag for its suspension, and goodput
from the stored rows shows the suspended GPU-hours apart. The same job without the controller's
states (nothing told jobpulse of the suspension) draws its idle flag: the states are what spares it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from jobpulse.collector.report.text import gather

from .conftest import RunningCollector
from .scenario_replay import backtest, seed
from .scenarios import library


@pytest.mark.timeout(600)
def test_a_suspended_job_draws_no_flag_for_its_suspension(collector: RunningCollector, dsn: str) -> None:
    (held,) = [s for s in library() if s.name == "suspended_resumed_4gpu"]
    untold = dataclasses.replace(held, name="suspended_untold_4gpu", job_id=str(int(held.job_id) + 500_000),
                                 nodes=[f"{n}-untold" for n in held.nodes], suspended=[])
    t0 = (datetime.now(UTC) - timedelta(seconds=held.duration_s + 300)).replace(second=0, microsecond=0)
    seed(collector, [held, untold], t0)
    flags = backtest(dsn, t0, t0 + timedelta(seconds=held.duration_s + 60))
    by_job = {j: sorted({f["rule_id"] for f in flags if f["job_id"] == j}) for j in (held.job_id, untold.job_id)}
    assert by_job[held.job_id] == [], by_job
    assert "idle_gpu" in by_job[untold.job_id] or "low_utilization" in by_job[untold.job_id], by_job
    with psycopg.connect(dsn) as conn:
        spans = conn.execute("SELECT state, since - %s, until - %s FROM jobpulse.job_states WHERE job_id = %s"
                             " ORDER BY since", (t0, t0, held.job_id)).fetchall()
        g = gather(conn, held.job_id, None)["goodput"]
    assert spans == [("RUNNING", timedelta(0), timedelta(seconds=600)),
                     ("SUSPENDED", timedelta(seconds=600), timedelta(seconds=1200)),
                     ("RUNNING", timedelta(seconds=1200), timedelta(seconds=held.duration_s))], spans
    assert g["scheduler_gpu_hours"]["suspended"] == pytest.approx(4 * 600 / 3600, rel=0.01)
    assert "idle" not in g["badput_gpu_hours"] or g["badput_gpu_hours"]["idle"] < 0.05, g
