"""A policy that acts only while others wait (``only_while_queued``): held back, once, while no job waits
for GPUs in the job's partition or no fresh reading says so; warned and acted on while jobs wait, the
reason naming who waits; the setting is checked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobpulse.collector.notify.policy import Policy, decide, load

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
P = Policy(warn_after_minutes=30, cancel_after_minutes=20, action="cancel", cluster="c", only_while_queued=True)
H = Policy(kind="hung", warn_after_minutes=0, cancel_after_minutes=5, action="requeue", cluster="c",
           only_while_queued=True)


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def job(minutes: float, jobs: int | None, gpus: int = 0, **over: object) -> dict[str, object]:
    queue = None if jobs is None else {"partition": "gpu", "gpu_jobs_pending": jobs, "gpus_pending": gpus,
                                       "jobs_pending": jobs, "ts": NOW, "source": "openmetrics"}
    return {"started_at": ago(minutes), "scope_key": "n1/GPU-x", "hardware": False, "partition": "gpu",
            "account": "ml", "user_name": "ann", "tags": {}, "job_id": "7", "queue": queue,
            "evidence": {"broken": "rank", "how": "exited", "gpu": "n1/GPU0", "spinning_gpus": 3}, **over}


def test_held_back_while_no_one_waits_then_warned_and_cancelled_while_they_do() -> None:
    nobody = decide(P, job(40, 0), {}, NOW)
    assert nobody == ("unqueued", "n1/GPU-x idle for 40 min, but no job waits for GPUs in partition gpu; the site "
                                  "acts only while others wait")
    assert decide(P, job(41, 0), {"unqueued": ago(1)}, NOW) is None, "recorded once"
    unknown = decide(P, job(40, None), {}, NOW)
    assert unknown is not None and unknown[0] == "unqueued" and "is slurm-sync running?" in unknown[1]
    warned = decide(P, job(42, 2, 6), {"unqueued": ago(2)}, NOW)
    assert warned is not None and warned[0] == "warned" and "idle for 42 min while 2 jobs wait for 6 GPUs in " \
                                                            "partition gpu; the job will be cancelled" in warned[1]
    drained = decide(P, job(70, 0), {"warned": ago(25)}, NOW)
    assert drained is not None and drained[0] == "unqueued", "the queue drained after the warning: no cancel"
    assert decide(P, job(70, 0), {"warned": ago(25), "unqueued": ago(1)}, NOW) is None
    cancelled = decide(P, job(70, 1, 1), {"warned": ago(25)}, NOW)
    assert cancelled is not None and cancelled[0] == "cancelled" and "while 1 job waits for 1 GPU" in cancelled[1]
    assert decide(P, job(10, 3, 3), {}, NOW) is None, "not yet W minutes idle: nothing, queue or not"
    assert decide(Policy(warn_after_minutes=30), job(40, 0), {}, NOW)[0] == "warned", "off by default"  # type: ignore[index]


def test_a_hung_job_too_and_exemptions_and_hardware_come_first() -> None:
    assert decide(H, job(2, 0), {}, NOW)[0] == "unqueued"  # type: ignore[index]
    requeued = decide(H, job(9, 1, 2), {"warned": ago(6)}, NOW)
    assert requeued is not None and requeued[0] == "requeued" and "3 GPUs waiting while 1 job waits for 2 GPUs" \
        in requeued[1]
    exempt = Policy(warn_after_minutes=30, only_while_queued=True, exempt_users=("ann",))
    assert decide(exempt, job(40, 0), {}, NOW)[0] == "exempt"  # type: ignore[index]
    assert decide(P, job(40, 0, hardware=True), {}, NOW)[0] == "held_hardware"  # type: ignore[index]


def test_the_setting_is_true_or_false(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text("[idle_gpu]\nonly_while_queued = 'yes'\n")
    with pytest.raises(ValueError, match="only_while_queued must be true or false"):
        load(f)
    f.write_text("[hung]\nonly_while_queued = true\n")
    assert load(f, "hung").only_while_queued
