"""Goodput on jobs sent through the real collector: the allocated GPU-time splits into productive
time and badput by cause, the parts summing to the whole; each cause lands where the job's own
timeline puts it (a hang, a long start-up after a short GPU check, checkpoints, evaluation, work
lost to a failure since the last checkpoint, steps as the basis where the job sends them), and the
summary, report and digest say so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobpulse.collector.report import digest, summary
from jobpulse.collector.report.goodput import line
from jobpulse.collector.report.text import gather, text
from jobpulse.collector.rules import backtest
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.state import flags, summaries
from jobpulse.collector.store.tiers import fold

from .conftest import RunningCollector
from .scenario_replay import CLUSTER, seed
from .scenarios import A100, Procs, Scenario, library, loading, phases, place, steady, trained


def _own() -> list[Scenario]:
    S = Scenario
    busy = trained(steady(90))
    return place([
        S("gp_long_load", "4 GPUs: a 1 min GPU check, 20 min loading a checkpoint, then training", 30, [[0, 1, 2, 3]],
          phases((0, steady(97, 1)), (60, loading(4)), (1260, steady(92, 2))), gpu=A100, gpm=False,
          procs=Procs(workers_start_s=1260)),
        S("gp_failed_after_ckpt", "2 GPUs training, a checkpoint at 10 min, the job fails at 20 min", 20, [[0, 1]],
          busy, state="FAILED", app_events=[(600, "phase_start", "checkpoint"), (690, "phase_end", "checkpoint")]),
        S("gp_steps", "1 GPU that reports its steps from 5 min (compiling before); from 10 min to 18 min it works "
          "without a step (a silent loop)", 20, [[0]], phases((0, steady(60, 20)), (300, steady(90))),
          app_events=[(t, "step", "train") for t in (*range(300, 600, 20), *range(1080, 1200, 20))]),
    ], job_base=95_700, pid_base=95_000, prefix="gp", shared=("", ""))


WANTED = ("hang_gpm_8gpu", "h_checkpoint_90s", "h_eval_passes")


@pytest.mark.timeout(600)
def test_goodput_parts_sum_to_the_allocation_and_name_their_causes(collector: RunningCollector, dsn: str) -> None:
    jobs = [s for s in library() if s.name in WANTED] + _own()
    longest = max(s.duration_s for s in jobs)
    t0 = (datetime.now(UTC) - timedelta(seconds=longest + 300)).replace(second=0, microsecond=0)
    seed(collector, jobs, t0)
    found: dict[str, dict[str, Any]] = {}
    with psycopg.connect(dsn) as conn:
        fold.run(conn, timedelta(0), begin=False)
        for s in jobs:  # the flags a live collector would have kept, as an import keeps them
            end = t0 + timedelta(seconds=s.duration_s)
            replayed = backtest.replay(conn, Thresholds(), t0, end + timedelta(minutes=2), timedelta(seconds=30),
                                       CLUSTER, s.job_id)
            flags.write_history(conn, CLUSTER, s.job_id, [
                (f.rule_id, f.severity, f.category, f.scope, f.scope_key, f.started_at, f.raised_at, f.last_hit,
                 min(f.closed_at or end, end), f.evidence, f.advice) for f in replayed])
            data = gather(conn, s.job_id, CLUSTER)
            g = data["goodput"]
            parts = g["productive_gpu_hours"] + sum(g["badput_gpu_hours"].values())
            assert parts == pytest.approx(data["usage"]["gpu_hours_allocated"], abs=1e-6), (s.name, g)
            assert g["allocated_gpu_hours"] == data["usage"]["gpu_hours_allocated"]
            found[s.name] = g
            assert "Goodput:" in text(data)
            built = summary.build(data)
            assert built["goodput"] == g and "Goodput:" in built["text"]
            # The running collector summarizes each job a cycle after its end arrives, from its live
            # flags (none: the data came in bulk); the first summary written stays, so under load its
            # may come first. This one, from the replayed flags, replaces it in one transaction.
            conn.execute("DELETE FROM jobpulse.job_summaries WHERE cluster = %s AND job_id = %s", (CLUSTER, s.job_id))
            summaries.write(conn, built)
            conn.commit()
        report = digest.text(digest.build(conn, "account", timedelta(days=1), datetime.now(UTC) + timedelta(hours=1),
                                          CLUSTER))
    for name, g in found.items():
        print(f"{name}: {line(g)}")
    hung = found["hang_gpm_8gpu"]["badput_gpu_hours"]["hung"]
    assert hung == pytest.approx(8 * 18 / 60, rel=0.1), "8 GPUs from 10 min to 28 min"
    load = found["gp_long_load"]
    assert load["badput_gpu_hours"]["start-up"] == pytest.approx(4 * 21 / 60, rel=0.1) and "local disk" in load["advice"]
    # its GPUs wait idle while rank 0 writes: the phase's name does not take the time out of idle
    ckpt = found["h_checkpoint_90s"]["badput_gpu_hours"]
    assert ckpt["idle"] == pytest.approx(2 * 3 * 1.5 / 60, rel=0.2) and "checkpoints" not in ckpt, ckpt
    assert found["h_eval_passes"]["badput_gpu_hours"]["evaluation"] == pytest.approx(4 * 4 * 1.5 / 60, rel=0.2)
    failed = found["gp_failed_after_ckpt"]
    assert failed["badput_gpu_hours"]["lost to failure"] == pytest.approx(2 * (1200 - 690) / 3600, rel=0.1)
    assert "since its last checkpoint" in failed["lost_to_failure"]
    steps = found["gp_steps"]
    assert steps["basis"] == "steps" and steps["startup_minutes"] == pytest.approx(5, abs=0.1)
    # steps every 20 s: 3 minutes' patience either side of the 8-minute gap leaves 2 minutes without progress
    assert steps["badput_gpu_hours"]["no progress"] == pytest.approx(2 / 60, abs=0.5 / 60)
    assert "no progress" not in found["h_eval_passes"]["badput_gpu_hours"], "a job without steps: not judged so"
    assert found["h_eval_passes"]["basis"] == "GPU activity"
    assert "goodput" in report and "hung" in report, report



@pytest.mark.timeout(300)
def test_goodput_is_the_stored_rows_whatever_the_leader_folded(collector: RunningCollector, dsn: str) -> None:
    """A job whose last minutes are still raw (its samples reach ahead of the leader's fold, as a job
    just ended does when its summary is written) has the same goodput before and after they are
    folded, and a second every GPU sampled is never "not measured"."""
    [job] = place([Scenario("gp_live", "2 GPUs training; its last two minutes not folded yet", 3, [[0, 1]],
                            steady(90))], job_base=95_800, pid_base=96_000, prefix="gq", shared=("", ""))
    t0 = (datetime.now(UTC) - timedelta(seconds=60)).replace(microsecond=0)
    seed(collector, [job], t0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        raw = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples WHERE job_id = %s AND ts >= "
                           "(SELECT folded_before FROM jobpulse.fold_mark)", (job.job_id,)).fetchone()
        before = gather(conn, job.job_id, CLUSTER)["goodput"]
        fold.run(conn, timedelta(0), t0 + timedelta(seconds=job.duration_s + 60), begin=False)
        after = gather(conn, job.job_id, CLUSTER)["goodput"]
    assert raw and raw[0] > 0, "the test needs samples the leader has not folded"
    assert before["productive_gpu_hours"] == pytest.approx(after["productive_gpu_hours"]), (before, after)
    assert before["badput_gpu_hours"] == pytest.approx(after["badput_gpu_hours"]), (before, after)
    assert "not measured" not in before["badput_gpu_hours"], before
