"""The idle-GPU policy's decisions: warn after W minutes, act C minutes later (cancel, or a dry
run's record), once each; exemptions; never a job whose idleness a hardware flag explains."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobpulse.collector.notify.policy import Policy, decide, load, load_all

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
P = Policy(warn_after_minutes=30, cancel_after_minutes=20, action="cancel", cluster="c", exempt_partitions=("debug",))


def idle(minutes: float, **over: object) -> dict[str, object]:
    return {"started_at": NOW - timedelta(minutes=minutes), "scope_key": "n1/GPU-x", "hardware": False,
            "partition": "gpu", "account": "ml", "user_name": "ann", "tags": {}, **over}


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def test_warn_then_cancel_once_each() -> None:
    assert decide(P, idle(29), {}, NOW) is None
    assert decide(P, idle(31), {}, NOW)[0] == "warned"  # type: ignore[index]
    assert decide(P, idle(49), {"warned": ago(18)}, NOW) is None, "C minutes after the warning, not before"
    assert decide(P, idle(600), {}, NOW)[0] == "warned", "never cancelled without a warning first"  # type: ignore[index]
    assert decide(P, idle(600), {"warned": ago(1)}, NOW) is None, "long idle, warned a minute ago: C minutes first"
    assert decide(P, idle(51), {"warned": ago(21)}, NOW)[0] == "cancelled"  # type: ignore[index]
    assert decide(P, idle(90), {"warned": ago(60), "cancelled": ago(40)}, NOW) is None
    assert decide(P, idle(90), {"warned": ago(60), "failed": ago(40)}, NOW) is None, "a failed cancel is not retried"
    dry = Policy(warn_after_minutes=30, cancel_after_minutes=20)
    assert decide(dry, idle(51), {"warned": ago(21)}, NOW)[0] == "would_cancel"  # type: ignore[index]


def test_exemptions_and_hardware() -> None:
    assert decide(P, idle(60, partition="debug"), {}, NOW) == ("exempt", "partition debug is exempt")
    assert decide(P, idle(60, partition="debug"), {"exempt": ago(1)}, NOW) is None
    assert decide(P, idle(60, tags={"policy": "off"}), {"warned": ago(30)}, NOW)[0] == "cancelled", "not allowed"  # type: ignore[index]
    allowed = Policy(allow_opt_out=True)
    assert decide(allowed, idle(60, tags={"policy": "off"}), {}, NOW)[0] == "exempt"  # type: ignore[index]
    held = decide(P, idle(600, hardware=True), {"warned": ago(30)}, NOW)
    assert held is not None and held[0] == "held_hardware" and "drain the node" in held[1]


def test_a_bad_policy_file_names_the_setting(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text("[idle_gpu]\naction = 'kill'\n")
    with pytest.raises(ValueError, match="action must be cancel or report"):
        load(f)
    f.write_text("[idle_gpu]\nwarn_after = 3\n")
    with pytest.raises(ValueError, match="unknown settings warn_after"):
        load(f)
    f.write_text("[idle_gpu]\naction = 'cancel'\nwarn_after_minutes = 5\n")
    with pytest.raises(ValueError, match="cancel needs cluster"):
        load(f)
    f.write_text("[idle_gpu]\naction = 'cancel'\ncluster = 'c'\nwarn_after_minutes = 5\nexempt_partitions = ['debug']\n")
    assert load(f) == Policy(warn_after_minutes=5, action="cancel", cluster="c", exempt_partitions=("debug",))


H = Policy(kind="hung", warn_after_minutes=0, cancel_after_minutes=5, action="requeue", cluster="c",
           partitions=("gpu",))


def hung(minutes: float, **over: object) -> dict[str, object]:
    evidence = {"broken": "rank", "how": "exited", "gpu": "n2/GPU5", "ranks": [13], "spinning_gpus": 15}
    return {**idle(minutes, scope_key="", job_id="123"), "evidence": evidence, **over}


def test_a_hung_job_is_warned_at_once_naming_what_broke_then_requeued() -> None:
    warned = decide(H, hung(3), {}, NOW)
    assert warned is not None and warned[0] == "warned"
    assert "job 123 hung since 11:57 UTC" in warned[1] and "rank 13 on n2/GPU5 exited; 15 GPUs waiting" in warned[1]
    assert decide(H, hung(7), {"warned": ago(4)}, NOW) is None
    assert decide(H, hung(9), {"warned": ago(6)}, NOW)[0] == "requeued"  # type: ignore[index]
    lost = decide(H, hung(9, hardware=True, evidence={"broken": "node", "node": "n2", "spinning_gpus": 4}),
                  {"warned": ago(6)}, NOW)
    assert lost is not None and lost[0] == "requeued", "a lost node does not hold a hung job back: it will not resume"
    assert decide(H, hung(9, partition="debug"), {}, NOW) == ("exempt", "partition debug has not opted in")


def test_the_hang_policy_says_which_evidence_it_acts_on_and_never_acts_on_the_weak_form() -> None:
    strong = {"broken": "rank", "how": "went idle", "gpu": "n1/GPU0", "ranks": [0], "spinning_gpus": 15,
              "form": "strong", "basis": "timeout",
              "acts_on": "every rank alive, but the GPUs have waited 11 min, past the job's collective timeout of 10 min"}
    warned = decide(H, hung(11, evidence=strong), {}, NOW)
    assert warned is not None and warned[0] == "warned"
    assert ("acting on the stall outlasted the collective timeout: every rank alive, but the GPUs have waited 11 min"
            in warned[1])
    broken = {**strong, "how": "exited", "basis": "broken part", "acts_on": "rank 0 on n1/GPU0 exited first"}
    assert "acting on a broken part: rank 0 on n1/GPU0 exited first" in decide(H, hung(3, evidence=broken), {}, NOW)[1]  # type: ignore[index]
    weak = {**strong, "form": "weak", "basis": ""}
    assert decide(H, hung(7, evidence=weak), {}, NOW) is None
    assert decide(H, hung(20, evidence=weak), {"warned": ago(15)}, NOW) is None


def test_a_policy_file_with_both_sections(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text("[hung]\naction = 'requeue'\ncluster = 'c'\nwarn_after_minutes = 0\npartitions = ['gpu']\n")
    assert load_all(f) == [Policy(kind="hung", action="requeue", cluster="c", warn_after_minutes=0, partitions=("gpu",))]
    f.write_text("[idle_gpu]\nwarn_after_minutes = 5\n[hung]\n")
    assert [p.kind for p in load_all(f)] == ["idle_gpu", "hung"]
    f.write_text("[idle_gpu]\naction = 'requeue'\ncluster = 'c'\n")
    with pytest.raises(ValueError, match="action must be cancel or report"):
        load_all(f)
