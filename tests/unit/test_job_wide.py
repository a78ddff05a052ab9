"""One flag per cause per job: a GPU rule that holds on every GPU of a job is one job-wide flag naming
the GPUs and their levels; GPUs that differ in cause keep their own flags; an open job-wide flag goes
on naming the GPUs still hit; hardware stays each GPU's."""

from __future__ import annotations

from datetime import timedelta

from jobpulse.collector.report.text import evidence_text
from jobpulse.collector.rules import capture_policy
from jobpulse.collector.rules.causes import job_wide
from jobpulse.collector.rules.engine import judge
from jobpulse.collector.rules.model import JobView

from .test_rules import MINUTES, NOW, T, gpu, minute, proc, stall, then, throttling


def _bubbles(i: int) -> list[tuple[float, int, int, float, int]]:
    """A pipeline stage a third busy: two thirds of each minute's samples idle, a mean near 27 %."""
    return [minute(80.0)] * 3 + [minute(26.0 + i % 3, idle=40, busy=20)] * (MINUTES - 3)


def test_a_cause_on_every_gpu_is_one_job_flag_naming_them_and_their_levels() -> None:
    job = JobView([gpu(i, profile=_bubbles(i)) for i in range(8)])
    (flag,) = judge(job, T)
    assert (flag.rule_id, flag.scope, flag.scope_key) == ("low_utilization", "job", "")
    assert flag.evidence["gpus"] == [g.key for g in job.gpus] and flag.evidence["gpus_flagged"] == 8
    assert [p["gpu"] for p in flag.evidence["per_gpu"]] == [f"n1/GPU{i}" for i in range(8)]
    assert flag.evidence["mean_percent"] == 26.9 and flag.evidence["metric"] == job.gpus[0].metric
    assert "The same on all 8 GPUs of the job: n1/GPU0 26%, n1/GPU1 27%, n1/GPU2 28%" in flag.advice
    assert flag.started_at == min(h.started_at for h in judge(JobView(job.gpus[:1]), T))
    shown = evidence_text(flag.evidence)  # the report's evidence line: not a page of per-GPU evidence
    assert "gpus_flagged=8" in shown and "per_gpu" not in shown and shown.count("upper_bound_percent") == 1


def test_gpus_that_differ_in_cause_keep_their_own_flags() -> None:
    """One GPU of eight idle: its own flag. Four idle and four low: two causes' kinds, each GPU's."""
    busy = [gpu(i) for i in range(7)]
    one = judge(JobView([*busy, gpu(7, profile=then(80, 0, 15))]), T)
    assert [(h.rule_id, h.scope, h.scope_key) for h in one] == [("idle_gpu", "gpu", "n1/GPU-n1-7")]
    mixed = judge(JobView([gpu(i, profile=then(80, 0 if i < 4 else 15, 15)) for i in range(8)]), T)
    assert sorted((h.rule_id, h.scope) for h in mixed) == [("idle_gpu", "gpu")] * 4 + [("low_utilization", "gpu")] * 4


def test_a_one_gpu_job_and_a_hardware_cause_stay_per_gpu() -> None:
    (alone,) = judge(JobView([gpu(0, profile=then(80, 0, 15))]), T)
    assert (alone.rule_id, alone.scope) == ("idle_gpu", "gpu")
    hot = judge(JobView([gpu(i, **throttling(0.3)) for i in range(2)]), T)
    assert [(h.rule_id, h.scope) for h in hot] == [("hw_throttling", "gpu")] * 2


def test_a_gpu_that_stopped_reporting_does_not_split_the_cause_of_the_others() -> None:
    """Judged on the GPUs that report: the silent one is judged for faults only, the rest share a cause."""
    silent = gpu(3, last_ts=NOW - timedelta(minutes=5), reporting=False)
    found = judge(JobView([*(gpu(i, profile=then(80, 0, 15)) for i in range(3)), silent]), T)
    assert [(h.rule_id, h.scope, h.evidence.get("gpus_in_job")) for h in found] == [("idle_gpu", "job", 3)]


def test_an_open_job_wide_flag_goes_on_naming_the_gpus_still_hit() -> None:
    """A stage that recovers for a cycle: the job-wide flag names the seven still low, no per-GPU flags
    open; a cause the open flag is not (another rule) is left as it is."""
    (flag,) = judge(JobView([gpu(i, profile=_bubbles(i)) for i in range(8)]), T)
    between = [minute(80.0)] * 3 + [minute(35.0, idle=20, busy=25)] * (MINUTES - 3)  # neither low nor busy
    seven = judge(JobView([gpu(0, profile=between), *(gpu(i, profile=_bubbles(i)) for i in range(1, 8))]), T)
    assert {(h.rule_id, h.scope) for h in seven} == {("low_utilization", "gpu")} and len(seven) == 7
    (carried,) = job_wide.carry_on(seven, {"low_utilization": flag.evidence})
    assert carried.scope == "job" and carried.evidence["gpus"] == flag.evidence["gpus"][1:]
    assert "The same on 7 of the 8 GPUs of the job: n1/GPU1 27%" in carried.advice
    assert job_wide.carry_on(seven, {"idle_gpu": flag.evidence}) == seven
    assert job_wide.carry_on(seven, {"low_utilization": {"gpus": "not a list"}}) == seven


def test_input_bound_on_every_rank_is_one_flag_with_each_ranks_pipeline() -> None:
    """What differs between the GPUs (the rank's PID) stays in each GPU's own evidence."""
    gpus = [gpu(i, profile=[minute(80.0)] * 3 + [stall()] * (MINUTES - 3)) for i in range(2)]
    procs = [p for i, g in enumerate(gpus) for p in
             (proc(10 + 10 * i, i, 30.0, g.gpu_uuid), proc(11 + 10 * i, i, 97.0), proc(12 + 10 * i, i, 96.0))]
    (flag,) = judge(JobView(gpus, procs=procs), T)
    assert (flag.rule_id, flag.scope) == ("input_bound", "job")
    assert "pid" not in flag.evidence and [p["pid"] for p in flag.evidence["per_gpu"]] == [10, 20]


def test_a_slow_load_on_every_gpu_is_one_start_up_flag() -> None:
    """A 1-minute GPU check, then 20 minutes of a few copies and kernels while memory grows: the
    warm-up's cap ends before the load does; the job-wide low-use flag tells start-up, not "larger
    batches". A steady low GPU whose memory filled early is low use as before."""
    load = [minute(90.0, fb=2_000)] + [minute(4.0, idle=50, busy=0, fb=2_000 + 2_900 * i) for i in range(1, MINUTES)]
    start = NOW - timedelta(minutes=MINUTES)
    (flag,) = judge(JobView([gpu(i, profile=load, job_start=start) for i in range(4)]), T)
    assert (flag.rule_id, flag.scope, flag.evidence.get("start_up")) == ("low_utilization", "job", True)
    assert "local disk" in flag.advice and "Larger batches" not in flag.advice
    (steady,) = judge(JobView([gpu(i, profile=[minute(15.0)] * MINUTES, job_start=start) for i in range(4)]), T)
    assert "start_up" not in steady.evidence and "Larger batches" in steady.advice


def test_gpus_idle_long_after_the_work_are_not_told_start_up() -> None:
    """Idle for 30 minutes after 8 minutes of work, the work now older than the look-back: not start-up
    (no "stage the data"), the idle flag's own advice."""
    found = judge(JobView([gpu(i, profile=[minute(0.0)] * MINUTES, job_start=NOW - timedelta(minutes=38),
                               idle_before=NOW - timedelta(minutes=30)) for i in range(8)]), T)
    (flag,) = found
    assert (flag.rule_id, flag.scope, flag.evidence["idle_minutes"]) == ("idle_gpu", "job", 30.0)
    assert "start_up" not in flag.evidence and "fewer GPUs" in flag.advice


def test_a_job_wide_flag_asks_its_first_gpus_rank_for_stacks() -> None:
    """The captures of a job-wide input-bound flag go to its first GPU's node, GPU and rank's PID."""
    gpus = [gpu(i, profile=[minute(80.0)] * 3 + [stall()] * (MINUTES - 3)) for i in range(2)]
    procs = [p for i, g in enumerate(gpus) for p in
             (proc(10 + 10 * i, i, 30.0, g.gpu_uuid), proc(11 + 10 * i, i, 97.0), proc(12 + 10 * i, i, 96.0))]
    (flag,) = judge(JobView(gpus, procs=procs), T)
    stored = {"scope": flag.scope, "scope_key": flag.scope_key, "evidence": flag.evidence}
    assert capture_policy._where(stored) == ("n1", "GPU-n1-0", 10)
