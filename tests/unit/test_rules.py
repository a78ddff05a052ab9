"""Each rule on given statistics: it fires on a clear case, stays silent on a near miss; the
evidence rule decides as soon as a signal is clear and waits on a noisy one; the precedence gives one
flag per cause; the registry agrees with the thresholds and the alerting."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jobpulse.collector.grafana import provisioning
from jobpulse.collector.rules import engine, registry
from jobpulse.collector.rules.engine import judge
from jobpulse.collector.rules.model import Block, Ecc, Finding, GpuStats, JobView, ProcStats
from jobpulse.collector.rules.placement import cpulist
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.schema.semantics import IDLE_PERCENT

from . import test_fabric_rules, test_hang

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
T = Thresholds()
MINUTES = 21  # the look-back: window_minutes + one


def minute(act: float, *, idle: int | None = None, busy: int | None = None, tensor: float = 40.0,
           fb: int = 48_000) -> tuple[float, int, int, float, int]:
    """One minute of 60 samples at ``act`` % (idle / busy sample counts follow unless given)."""
    return (act, 60 if act <= IDLE_PERCENT and idle is None else idle or 0, 60 if act >= 50 and busy is None else busy or 0,
            tensor, fb)


def stall(act: float = 45.0) -> tuple[float, int, int, float, int]:
    """A minute of bursts with idle gaps: half the samples idle, half busy."""
    return minute(act, idle=28, busy=28)


def gpu(index: int = 0, node: str = "n1", profile: list[tuple[float, int, int, float, int]] | None = None,
        **over: Any) -> GpuStats:
    """A GPU of a job that started 31 minutes ago; by default busy (80 % SM activity, tensor cores,
    48 GB) in every minute of the look-back: no rule fires on it. ``profile``: its minutes, oldest
    first, ending now."""
    profile = profile or [minute(80.0)] * MINUTES
    blocks = tuple(Block(NOW - timedelta(minutes=len(profile) - i), 60, idle, busy, act, act, tensor, fb)
                   for i, (act, idle, busy, tensor, fb) in enumerate(profile))
    base = dict(cluster="c", job_id="1", partition="gpu", node=node, gpu_uuid=f"GPU-{node}-{index}", gpu_index=index,
                model="NVIDIA H100", first_ts=blocks[0].start, last_ts=NOW, job_start=NOW - timedelta(minutes=31),
                blocks=blocks, fb_total_mib=81_559, last_mem_mib=blocks[-1].fb_max, ever_busy=True)
    return GpuStats(**{**base, **over})  # type: ignore[arg-type]


def then(before: float, after: float, last: int) -> list[tuple[float, int, int, float, int]]:
    """The look-back at ``before`` %, its last ``last`` minutes at ``after`` %."""
    return [minute(before)] * (MINUTES - last) + [minute(after)] * last


def throttling(share: float, last: int = MINUTES) -> dict[str, Any]:
    """A busy GPU's blocks, the last ``last`` of them slowed down in hardware in ``share`` of samples."""
    blocks = gpu(0).blocks
    return {"blocks": tuple(dataclasses.replace(b, throttled=round(share * b.n)) if i >= len(blocks) - last else b
                            for i, b in enumerate(blocks))}


def test_a_late_hardware_slowdown_is_judged_from_its_onset() -> None:
    """Throttling that starts late is not diluted by the healthy minutes before it."""
    found = judge(JobView([gpu(0, **throttling(0.3, last=3))]), T)
    assert [h.rule_id for h in found] == ["hw_throttling"] and found[0].started_at == NOW - timedelta(minutes=3)
    assert ids(JobView([gpu(0, **throttling(0.3, last=2))])) == []


def ids(view: JobView) -> list[str]:
    return sorted(h.rule_id for h in judge(view, T))


def proc(pid: int, rank: int | None, cpu: float, uuid: str | None = None, node: str = "n1") -> ProcStats:
    """A process of the job at ``cpu`` % in every minute of the look-back (a GPU's driver with ``uuid``)."""
    return ProcStats(node, pid, rank, uuid, "python" if uuid else "pt_data_worker",
                     {NOW - timedelta(minutes=m): cpu for m in range(MINUTES + 1)})


def test_a_healthy_job_raises_nothing() -> None:
    assert ids(JobView([gpu(0), gpu(1)])) == []


def test_idle_by_the_share_of_a_stretch_not_the_last_busy_sample() -> None:
    assert ids(JobView([gpu(0, profile=then(80, 0, 11))])) == ["idle_gpu"]
    assert ids(JobView([gpu(0, profile=then(80, 0, 9))])) == []  # not yet, and its low minutes are idleness
    # The trick against time-since-last-busy rules: a 4 s burst every third minute keeps nothing busy.
    trick = [minute(80)] * 6 + [minute(6, idle=56, busy=4) if i % 3 == 0 else minute(0) for i in range(15)]
    found = judge(JobView([gpu(0, profile=trick)]), T)
    assert [h.rule_id for h in found] == ["idle_gpu"]
    assert found[0].started_at == NOW - timedelta(minutes=15)  # since the idling began, not the last burst
    assert found[0].evidence["idle_minutes"] == 15.0


def test_idle_since_reaches_past_the_look_back() -> None:
    idle = gpu(0, profile=[minute(0)] * MINUTES, idle_before=NOW - timedelta(hours=3))
    found = judge(JobView([idle]), T)
    assert [h.rule_id for h in found] == ["idle_gpu"] and found[0].evidence["idle_minutes"] == 180.0


def test_a_gpu_never_used_is_over_allocation_alone() -> None:
    never = gpu(1, profile=[minute(0)] * MINUTES, ever_busy=False)
    found = judge(JobView([gpu(0), never]), T)
    assert [h.rule_id for h in found] == ["over_allocation"]  # not idle, not a straggler on top of it
    assert found[0].evidence["gpus"] == [never.key] and found[0].evidence["gpus_used"] == 1


def test_a_job_that_used_none_of_its_gpus_is_idle_not_over_allocated() -> None:
    """No "request --gres=gpu:0": a job that never used any of its GPUs is told they are idle."""
    never = [gpu(i, profile=[minute(0)] * MINUTES, ever_busy=False) for i in range(2)]
    assert ids(JobView(never)) == ["idle_gpu"]  # one job-wide flag naming both
    (alone,) = judge(JobView(never[:1]), T)
    assert alone.rule_id == "idle_gpu" and "gres=gpu:0" not in alone.advice
    assert ids(JobView([gpu(0), never[1]])) == ["over_allocation"]  # one used, one not: over-allocated


def test_memory_not_measured_is_not_read_as_zero() -> None:
    """A recording without a memory column: no 'peak 0 MiB' claim; with readings the rule judges."""
    unread = [gpu(i, profile=[minute(80.0, fb=None)] * MINUTES, fb_total_mib=81_559) for i in range(2)]  # type: ignore[arg-type]
    assert "memory_underused" not in ids(JobView(unread))
    no_total = [gpu(i, profile=[minute(80.0, fb=100)] * MINUTES, fb_total_mib=None) for i in range(2)]
    assert "memory_underused" not in ids(JobView(no_total))
    small = [gpu(i, profile=[minute(80.0, fb=100)] * MINUTES) for i in range(2)]
    assert "memory_underused" in ids(JobView(small))


def test_idle_is_counted_from_the_first_sample_not_the_blocks_aligned_start() -> None:
    """A GPU first sampled in the last seconds of its first block has been idle for seconds, not for
    the whole block (a job's first seconds were flagged over-allocated on a loaded test machine)."""
    idle_minutes = T.defaults["idle_minutes"]
    blocks = int(idle_minutes)  # whole minutes: the stretch reaches idle_minutes only from the blocks' starts
    profile = [minute(0)] * blocks
    first = NOW - timedelta(minutes=blocks) + timedelta(seconds=50)
    never = gpu(1, profile=profile, ever_busy=False, first_ts=first, job_start=first, last_ts=NOW)
    assert ids(JobView([gpu(0), never])) == []
    seen_whole = gpu(1, profile=[minute(0)] * (blocks + 1), ever_busy=False, job_start=first)
    assert "over_allocation" in ids(JobView([gpu(0), seen_whole]))


def test_low_use_decides_after_evidence_minutes_of_clear_signal() -> None:
    found = judge(JobView([gpu(0, profile=then(80, 15, 3))]), T)
    assert [h.rule_id for h in found] == ["low_utilization"]
    assert found[0].started_at == NOW - timedelta(minutes=3)  # since the first low minute
    assert ids(JobView([gpu(0, profile=then(80, 15, 2))])) == []


def test_a_noisy_signal_waits_until_it_is_clear() -> None:
    noisy = [minute(10 if i % 2 else 35) for i in range(MINUTES)]  # mean 22.5, far apart minute to minute
    assert ids(JobView([gpu(0, profile=noisy[-12:], job_start=NOW - timedelta(minutes=14))])) == []
    assert ids(JobView([gpu(0, profile=noisy)])) == ["low_utilization"]


def test_warm_up_is_not_judged() -> None:
    started = NOW - timedelta(minutes=4)
    assert ids(JobView([gpu(0, profile=[minute(10)] * 4, job_start=started)])) == []
    # Memory still growing toward its peak: still warming up (a model loading), even after 5 min.
    growing = [minute(10, fb=fb) for fb in (1_000, 8_000, 16_000, 24_000, 32_000, 40_000)]
    assert ids(JobView([gpu(0, profile=growing, job_start=NOW - timedelta(minutes=6))])) == []


def test_the_newest_block_still_filling_is_not_a_whole_minute_of_evidence() -> None:
    profile = then(80, 15, 3)
    last = profile[-1]
    partial = gpu(0, profile=profile)
    partial = dataclasses.replace(partial, blocks=(*partial.blocks[:-1], dataclasses.replace(partial.blocks[-1], n=30)))
    assert last[0] == 15 and ids(JobView([partial])) == []  # 2.5 min of low samples: not yet
    assert ids(JobView([gpu(0, profile=then(80, 15, 3))])) == ["low_utilization"]


def test_a_restarted_rank_warms_up_again() -> None:
    """A rank crashed (its memory freed), came back and is loading: its reload is not low use."""
    crash = then(80, 80, 0)[:-4] + [minute(0, fb=0), minute(8, fb=20_000), minute(10, fb=44_000), minute(12, fb=48_000)]
    assert ids(JobView([gpu(0, profile=crash)])) == []
    # Without the release of memory, the same low minutes are low use.
    held = then(80, 80, 0)[:-4] + [minute(8)] + [minute(10)] * 3
    assert ids(JobView([gpu(0, profile=held)])) == ["low_utilization"]


def test_sparse_work_gets_the_idle_rules_patience() -> None:
    """Mostly idle minutes with short test runs (an interactive session): idle if it goes on idling,
    low use only once it has lasted idle_minutes."""
    session = [minute(80)] * 10 + [minute(12, idle=50, busy=10)] * 5
    assert ids(JobView([gpu(0, profile=session)])) == []
    long_session = [minute(80)] * 4 + [minute(12, idle=50, busy=10)] * 11
    assert ids(JobView([gpu(0, profile=long_session)])) == ["low_utilization"]


def test_a_stretch_begins_where_the_condition_began() -> None:
    """A strong stall signal must not carry the stretch back into the busy minutes before it: the
    flag's since is the first stalled minute and the workers' CPU is judged from there."""
    g = gpu(0, profile=[minute(80)] * 10 + [stall(40)] * 11)
    early, late = NOW - timedelta(minutes=11), {NOW - timedelta(minutes=m): 97.0 for m in range(12)}
    workers = [ProcStats("n1", 11 + i, 0, None, "pt_data_worker",
                         {**{NOW - timedelta(minutes=m): 50.0 for m in range(12, MINUTES + 1)}, **late})
               for i in range(2)]
    found = judge(JobView([g], procs=[proc(10, 0, 30.0, g.gpu_uuid), *workers]), T)
    assert [h.rule_id for h in found] == ["input_bound"]
    assert found[0].started_at == early and found[0].evidence["worker_cpu_percent"] == 97.0
    assert found[0].evidence["mean_percent"] == 40.0  # the GPU's activity, not the stall share


def test_input_bound_needs_its_own_ranks_pipeline_saturated() -> None:
    g = gpu(0, profile=then(80, 0, 0)[:-5] + [stall()] * 5)
    main = proc(10, 0, 30.0, g.gpu_uuid)
    found = judge(JobView([g], procs=[main, proc(11, 0, 96.0), proc(12, 0, 94.0)]), T)
    assert [h.rule_id for h in found] == ["input_bound"]
    assert found[0].evidence["pattern"] == "workers_saturated" and found[0].evidence["workers"] == 2
    assert found[0].started_at == NOW - timedelta(minutes=5)
    # Another rank's busy workers on the node are not this GPU's pipeline; stalls alone are bursts.
    assert ids(JobView([g], procs=[main, proc(21, 1, 96.0), proc(22, 1, 94.0)])) == []
    # No workers: a single-threaded main process at one full core while the GPU stalls.
    assert ids(JobView([g], procs=[proc(10, 0, 99.0, g.gpu_uuid)])) == ["input_bound"]
    assert ids(JobView([g], procs=[proc(10, 0, 130.0, g.gpu_uuid)])) == []  # multi-threaded: not the loader


def test_a_loader_kept_waiting_for_its_cpus_is_saturated() -> None:
    """Workers sharing too few CPUs use half a core each but are runnable all the time: what the
    GPU waits for. Workers that sleep half the time are not."""
    g = gpu(0, profile=then(80, 0, 0)[:-5] + [stall()] * 5)

    def worker(pid: int, runnable: float) -> ProcStats:
        w = proc(pid, 0, 50.0)
        w.runnable_by_minute.update({m: runnable for m in w.cpu_by_minute})
        return w
    found = judge(JobView([g], procs=[proc(10, 0, 30.0, g.gpu_uuid), worker(11, 100.0), worker(12, 98.0)]), T)
    assert [h.rule_id for h in found] == ["input_bound"]
    assert found[0].evidence["worker_cpu_percent"] == 50.0 and found[0].evidence["worker_demand_percent"] == 99.0
    assert ids(JobView([g], procs=[proc(10, 0, 30.0, g.gpu_uuid), worker(11, 50.0), worker(12, 52.0)])) == []


def test_a_busy_wait_host_thread_beside_a_steady_low_gpu_is_low_use() -> None:
    g = gpu(0, profile=then(80, 20, 5))
    assert ids(JobView([g], procs=[proc(10, 0, 100.0, g.gpu_uuid)])) == ["low_utilization"]


def test_an_input_pipeline_in_threads_that_fills_its_cpus_is_input_bound() -> None:
    """tf.data or DALI decoding in threads: no worker processes, the main process at every CPU it may
    use; the same process with room left is low use, and without its affinity measured it is judged
    as before (not measured is not saturated)."""
    g = gpu(0, profile=then(80, 20, 5))

    def main(cpu: float, allowed: int | None) -> ProcStats:
        p = proc(10, 0, cpu, g.gpu_uuid)
        if allowed:
            p.allowed_by_minute.update(dict.fromkeys(p.cpu_by_minute, allowed))
        return p

    found = judge(JobView([g], procs=[main(780.0, 8)]), T)
    assert [h.rule_id for h in found] == ["input_bound"] and found[0].evidence["pattern"] == "threads_saturated"
    assert "all 8 of its CPUs" in found[0].advice and "--cpus-per-task" in found[0].advice
    assert ids(JobView([g], procs=[main(400.0, 8)])) == ["low_utilization"]
    assert ids(JobView([g], procs=[main(780.0, None)])) == ["low_utilization"]


def test_an_idle_onset_is_not_a_stall() -> None:
    g = gpu(0, profile=then(80, 0, 5))
    assert ids(JobView([g], procs=[proc(10, 0, 100.0, g.gpu_uuid)])) == []


def test_imbalance_minute_by_minute_against_the_others_median() -> None:
    slow = gpu(2, profile=then(80, 30, 4))
    found = judge(JobView([gpu(0), gpu(1), slow]), T)
    assert [(h.rule_id, h.scope_key) for h in found] == [("imbalance", slow.key)]
    assert found[0].evidence["others_median_percent"] == 80.0
    assert ids(JobView([gpu(0), gpu(1), gpu(2, profile=then(80, 41, 4))])) == []


def test_a_barrier_that_all_gpus_enter_at_once_is_no_imbalance() -> None:
    """Every GPU goes from work to waiting in the same block (a checkpoint barrier's first): the
    others' median is high in that block only, and that one block does not make them working
    through the stretch (its mean of three was over the bar alone)."""
    peers = [minute(80.0)] * (MINUTES - 3) + [minute(97.0), minute(13.0), minute(13.0)]
    waiting = [minute(80.0)] * (MINUTES - 3) + [minute(44.0, busy=30), minute(3.0), minute(3.0)]
    job = JobView([gpu(0, profile=peers), gpu(1, profile=peers), gpu(2, profile=waiting)])
    assert "imbalance" not in ids(job)


def test_a_gpu_that_started_working_is_not_flagged_idle_after_the_fact() -> None:
    """Idle for 12 minutes of CPU preprocessing, working in the newest minute: raising idle now
    would be about a time that has ended."""
    started = gpu(0, profile=then(0, 0, MINUTES)[:-1] + [minute(70, idle=20, busy=40)], ever_busy=True)
    assert "idle_gpu" not in ids(JobView([started]))
    still = gpu(0, profile=then(0, 0, MINUTES)[:-1] + [minute(5, idle=50, busy=10)], ever_busy=True)
    assert ids(JobView([still])) == ["idle_gpu"], "a burst in the newest minute is not work resumed"


def test_xid_45_alone_at_the_jobs_end_is_a_cancellation_not_a_fault() -> None:
    at = NOW - timedelta(seconds=30)
    cancelled = JobView([gpu(0, xids={45: at})], ended_at=NOW)
    assert ids(cancelled) == []
    assert ids(JobView([gpu(0, xids={45: at})])) == [], "still running: wait, a killed job stops reporting"
    kept_running = JobView([gpu(0, xids={45: NOW - timedelta(minutes=3)})])
    assert ids(kept_running) == ["xid_application"], "the job went on: the cleanup of a faulting process"
    assert ids(JobView([gpu(0, xids={45: at, 31: at})], ended_at=NOW)) == ["xid_application"]


def test_memory_is_judged_after_minutes_of_work_not_of_runtime() -> None:
    """Five busy minutes after warm-up decide (not ten of runtime), and an idle prelude never does."""
    busy_small = [minute(80, fb=2_000)] * 8
    job = gpu(0, profile=busy_small, job_start=NOW - timedelta(minutes=8))
    assert ids(JobView([job])) == ["memory_underused"], "warm-up 2 min + 5 busy minutes"
    prelude = then(0, 80, 4)
    assert ids(JobView([gpu(0, profile=[(a, i, b, t_, 2_000) for a, i, b, t_, _ in prelude])])) == []


def _no_gpm(g: GpuStats, watts: float) -> GpuStats:
    """The GPU without GPM (duty-cycle utilization only), drawing ``watts`` in every block."""
    return dataclasses.replace(g, blocks=tuple(dataclasses.replace(b, sm_active=None, tensor_max=None, power=watts)
                                               for b in g.blocks))


def test_busy_looking_gpus_that_draw_a_fraction_of_their_working_power_wait() -> None:
    """Without GPM, ranks spinning in a collective for a straggler show 100 % utilization: the power
    they draw against the job's working level says they wait (one held_back flag naming the
    straggler); the same job drawing working power everywhere is healthy."""
    busy = [minute(100.0)] * MINUTES
    job = JobView([_no_gpm(gpu(i, profile=busy), 150.0) for i in range(7)] + [_no_gpm(gpu(7, profile=busy), 650.0)])
    found = judge(job, T)
    assert [(h.rule_id, h.evidence["holding_back"], h.evidence["waiting_gpus"]) for h in found] == [
        ("held_back", ["n1/GPU7"], 7)]
    assert "power drawn" in found[0].evidence["metric"] and "650 W" in found[0].evidence["metric"]
    assert ids(JobView([_no_gpm(gpu(i, profile=busy), 640.0 + i) for i in range(8)])) == []
    one_of_24 = JobView([_no_gpm(gpu(i, profile=busy), 150.0) for i in range(23)]
                        + [_no_gpm(gpu(23, profile=busy), 650.0)])
    assert [(h.rule_id, h.evidence["waiting_gpus"]) for h in judge(one_of_24, T)] == [("held_back", 23)]


def test_the_advice_fits_a_one_gpu_job() -> None:
    """"Request fewer GPUs" is no advice to a job that holds one."""
    idle_one = judge(JobView([gpu(0, profile=then(80, 0, 15))]), T)
    low_one = judge(JobView([gpu(0, profile=then(80, 15, 6))]), T)
    assert [h.rule_id for h in idle_one + low_one] == ["idle_gpu", "low_utilization"]
    assert all("fewer GPUs" not in h.advice for h in idle_one + low_one)
    assert "without --gres" in idle_one[0].advice and "MIG slice" in low_one[0].advice
    two = judge(JobView([gpu(0), gpu(1, profile=then(80, 0, 15))]), T)
    assert "request fewer GPUs" in next(h.advice for h in two if h.rule_id == "idle_gpu")


def test_a_straggler_is_one_flag_in_one_cycle_not_also_low_use() -> None:
    """A GPU at 12 % beside peers at 80 % is both below low_percent and below half its peers: one
    cause, so one flag, the more telling kind (imbalance names the peers it holds back)."""
    slow = gpu(2, profile=then(80, 12, 6))
    assert engine.RULES["low_utilization"].gpu_check(slow, T.for_gpu("gpu", "NVIDIA H100"), JobView([slow]))
    found = judge(JobView([gpu(0), gpu(1), slow]), T)
    assert [(h.rule_id, h.scope_key) for h in found] == [("imbalance", slow.key)]


def test_no_tensor_cores_needs_gpm_and_busy_sms() -> None:
    fp32 = gpu(0, profile=[minute(80, tensor=0.0)] * MINUTES)
    assert ids(JobView([fp32])) == ["no_tensor_cores"]
    duty = dataclasses.replace(fp32, blocks=tuple(dataclasses.replace(b, sm_active=None) for b in fp32.blocks))
    assert ids(JobView([duty])) == []


@pytest.mark.parametrize(("over", "rule"), [
    ({"blocks": "throttled 0.3"}, "hw_throttling"),
    ({"pcie_below_max_share": 1.0, "pcie_loaded_samples": 600, "pcie_link": "3x8/4x16"}, "pcie_downgraded"),
    ({"xids": {79: NOW}}, "xid_error"),
    ({"lost_at": NOW}, "gpu_lost"),
    ({"ecc": Ecc(dbe_increase=1)}, "ecc_uncorrectable"),
    ({"ecc": Ecc(remap_pending=True)}, "ecc_uncorrectable"),
    ({"ecc": Ecc(sbe_increase=500)}, "ecc_correctable"),
])
def test_hardware_rules(over: dict[str, Any], rule: str) -> None:
    if over.get("blocks") == "throttled 0.3":
        over = throttling(0.3)
    found = judge(JobView([gpu(0, **over)]), T)
    assert [(h.rule_id, h.category) for h in found] == [(rule, "hardware")]


def test_memory_underused_and_its_near_miss() -> None:
    small = [minute(80, fb=1_500)] * MINUTES
    assert ids(JobView([gpu(0, profile=small)])) == ["memory_underused"]
    assert ids(JobView([gpu(0, profile=[minute(80, fb=8_200)] * MINUTES)])) == []


def test_topology_no_nvlink_is_the_jobs_flag_and_numa_far() -> None:
    found = judge(JobView([gpu(0), gpu(1)], links=_links("SYS")), T)
    assert [(h.rule_id, h.scope, h.scope_key) for h in found] == [("topology_no_nvlink", "job", "n1")]
    assert ids(JobView([gpu(0), gpu(1)], links=_links("NV4"))) == []
    assert ids(_rank_on_cpus({40: 10})) == ["numa_far"]
    assert ids(_rank_on_cpus({3: 10})) == []


def test_cpulist_parsing() -> None:
    assert cpulist("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert cpulist("") == set() and cpulist("x,2") == {2}


def test_registry_is_consistent_with_thresholds_and_alerting() -> None:
    defaults = tomllib.loads(resources.files("jobpulse.collector.rules").joinpath("rules_default.toml").read_text())
    known = set(defaults["defaults"])
    for rule in registry.RULES.values():
        assert set(rule.thresholds) <= known, (rule.id, set(rule.thresholds) - known)
        assert (rule.gpu_check is None) != (rule.job_check is None), rule.id
        assert rule.category in ("code", "hardware") and rule.severity in ("info", "warning", "critical")
        reads = {f.name for f in dataclasses.fields(GpuStats)} | {f.name for f in dataclasses.fields(JobView)}
        assert set(rule.reads) <= reads, (rule.id, set(rule.reads) - reads)
    assert all(registry.RULES[r].gpu_check for r in registry.EXCLUSIVE_GPU_VERDICTS)
    alert_sql = " ".join(a["sql"] for a in provisioning.ALERTS)
    for rule_id in ("idle_gpu", "low_utilization", "input_bound", "imbalance"):
        assert f"'{rule_id}'" in alert_sql
    assert set(registry.ids("hardware")) == {"hw_throttling", "pcie_downgraded", "xid_error", "gpu_lost",
                                             "ecc_uncorrectable", "ecc_correctable", "topology_no_nvlink", "node_lost",
                                             "fabric_degraded"}


def test_a_hardware_fault_explains_the_jobs_usage() -> None:
    """A GPU that fell off the bus: the job's other GPUs wait, idle — the node's fault, one flag."""
    broken = gpu(0, profile=then(80, 0, 12), xids={79: NOW - timedelta(minutes=12)}, lost_at=NOW - timedelta(minutes=12))
    waiting = gpu(1, profile=then(80, 0, 12))
    found = judge(JobView([broken, waiting]), T)
    assert [(h.rule_id, h.scope_key) for h in found] == [("xid_error", broken.key)]
    assert found[0].started_at == NOW - timedelta(minutes=12)


def test_a_silent_gpu_is_judged_for_faults_only() -> None:
    silent = gpu(0, profile=then(80, 0, 12), reporting=False, ecc=Ecc(dbe_increase=2))
    assert ids(JobView([silent])) == ["ecc_uncorrectable"]


def test_xids_are_the_nodes_or_the_applications_by_nvidias_catalogue() -> None:
    app = judge(JobView([gpu(0, xids={31: NOW})]), T)
    assert [(h.rule_id, h.category) for h in app] == [("xid_application", "code")]
    assert "XID 31: GPU memory page fault" in app[0].advice
    both = judge(JobView([gpu(0, xids={31: NOW, 79: NOW})]), T)
    assert [(h.rule_id, h.category, h.evidence["xids"]) for h in both] == [("xid_error", "hardware", [79])]


def alone(rule_id: str, view: JobView) -> list[Finding]:
    """One rule's own check, called directly with the default thresholds: no precedence, nothing
    explained away."""
    rule = registry.RULES[rule_id]
    t = T.for_gpu(view.gpus[0].partition, view.gpus[0].model)
    if rule.gpu_check:
        return [f for g in view.gpus if (f := rule.gpu_check(g, t, view))]
    assert rule.job_check
    return rule.job_check(view, t)


def _links(link: str) -> dict[str, dict[str, dict[str, str]]]:
    """Node n1 has an NVLink pair elsewhere; the job's GPUs 0 and 1 meet over ``link``."""
    a, b = gpu(0).gpu_uuid, gpu(1).gpu_uuid
    return {"n1": {a: {b: link}, b: {a: link}, "GPU-x": {"GPU-y": "NV18"}}}


def _rank_on_cpus(cpus: dict[int, int]) -> JobView:
    return JobView([gpu(0)], procs=[ProcStats("n1", 7, 0, gpu(0).gpu_uuid, "python", cpus=cpus)],
                   local_cpus={gpu(0).key: "0-15"})


# rule -> (a case at its threshold: fires, the nearest miss: silent), on the default thresholds
EDGES: dict[str, tuple[JobView, JobView]] = {
    "idle_gpu": (JobView([gpu(0, profile=then(80, 0, 10))]), JobView([gpu(0, profile=then(80, 0, 9))])),
    "input_bound": (JobView([gpu(0, profile=then(80, 0, 0)[:-3] + [stall()] * 3)],
                            procs=[proc(10, 0, 30.0, gpu(0).gpu_uuid), proc(11, 0, 90.0)]),
                    JobView([gpu(0, profile=then(80, 0, 0)[:-3] + [stall()] * 3)],
                            procs=[proc(10, 0, 30.0, gpu(0).gpu_uuid), proc(11, 0, 89.9)])),
    "low_utilization": (JobView([gpu(0, profile=then(80, 29.9, 3))]), JobView([gpu(0, profile=then(80, 30.0, 3))])),
    "imbalance": (JobView([gpu(0), gpu(1), gpu(2, profile=then(80, 39.9, 3))]),
                  JobView([gpu(0), gpu(1), gpu(2, profile=then(80, 40.0, 3))])),
    "no_tensor_cores": (JobView([gpu(0, profile=[minute(80, tensor=0.9)] * MINUTES)]),
                        JobView([gpu(0, profile=[minute(80, tensor=1.0)] * MINUTES)])),
    "hw_throttling": (JobView([gpu(0, **throttling(0.10))]), JobView([gpu(0, **throttling(0.09))])),
    "pcie_downgraded": (JobView([gpu(0, pcie_below_max_share=0.5, pcie_loaded_samples=10, pcie_link="4x8/5x16")]),
                        JobView([gpu(0, pcie_below_max_share=0.49, pcie_loaded_samples=10, pcie_link="4x8/5x16")])),
    "xid_error": (JobView([gpu(0, xids={79: NOW})]), JobView([gpu(0, xids={31: NOW})])),
    "gpu_lost": (JobView([gpu(0, lost_at=NOW)]), JobView([gpu(0)])),
    "ecc_uncorrectable": (JobView([gpu(0, ecc=Ecc(dbe_increase=1))]), JobView([gpu(0, ecc=Ecc(sbe_increase=99))])),
    "ecc_correctable": (JobView([gpu(0, ecc=Ecc(sbe_increase=100))]), JobView([gpu(0, ecc=Ecc(sbe_increase=99))])),
    "xid_application": (JobView([gpu(0, xids={31: NOW})]), JobView([gpu(0, xids={79: NOW})])),
    "memory_underused": (JobView([gpu(0, profile=[minute(80, fb=8_150)] * MINUTES)]),
                         JobView([gpu(0, profile=[minute(80, fb=8_156)] * MINUTES)])),
    "held_back": (JobView([gpu(i, profile=then(80, 12, 6)) for i in range(5)] + [gpu(5)]),
                  JobView([gpu(i, profile=then(80, 12, 6)) for i in range(3)] + [gpu(3), gpu(4), gpu(5)])),
    "over_allocation": (JobView([gpu(0), gpu(1, profile=then(80, 0, MINUTES - 10), ever_busy=False)]),
                        JobView([gpu(0), gpu(1, profile=then(80, 0, MINUTES - 10), ever_busy=True)])),
    "topology_no_nvlink": (JobView([gpu(0), gpu(1)], links=_links("SYS")),
                           JobView([gpu(0), gpu(1)], links=_links("PIX"))),
    "numa_far": (_rank_on_cpus({40: 5, 3: 5}), _rank_on_cpus({40: 4, 3: 6})),
    "hung": (test_hang.spinning_for(3), test_hang.spinning_for(2)),
    "stalled": (test_hang.alive_spinning_for(3), test_hang.alive_spinning_for(2)),
    "node_lost": (test_hang.node_silent(3), test_hang.node_silent(2)),
    "communication_bound": (test_fabric_rules.at_rate(0.7), test_fabric_rules.at_rate(0.69)),
    "fabric_degraded": (test_fabric_rules.errors_rising(10), test_fabric_rules.errors_rising(9)),
}


def test_every_rule_has_its_edge_cases() -> None:
    assert set(EDGES) == set(registry.RULES)


@pytest.mark.parametrize("rule_id", list(EDGES))
def test_each_rule_alone_fires_at_its_threshold_and_not_just_below(rule_id: str) -> None:
    clear, near_miss = EDGES[rule_id]
    found = alone(rule_id, clear)
    assert len(found) == 1, found
    assert found[0].evidence and found[0].advice
    assert alone(rule_id, near_miss) == []
    assert [h.rule_id for h in judge(clear, T)] == [rule_id]  # and nothing else on the clear case


def test_precedence_is_the_declared_order_not_branch_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A low GPU whose workers are saturated: both rules fire alone; the GPU gets the first in precedence."""
    low = gpu(0, profile=then(80, 20, 5))
    view = JobView([low], procs=[proc(10, 0, 30.0, low.gpu_uuid), proc(11, 0, 95.0)])
    assert alone("input_bound", view) and alone("low_utilization", view)
    assert ids(view) == ["input_bound"]
    monkeypatch.setattr(engine, "EXCLUSIVE_GPU_VERDICTS", ("low_utilization", "input_bound", "idle_gpu"))
    assert ids(view) == ["low_utilization"]


def test_registry_ids_are_unique_and_the_precedence_names_declared_rules() -> None:
    declared = [r.id for family in registry.FAMILIES for r in family.RULES]
    assert len(declared) == len(set(declared)) == len(registry.RULES)
    twice = SimpleNamespace(__name__="twice", RULES=(registry.RULES["idle_gpu"],) * 2)
    with pytest.raises(ValueError, match="declared twice"):
        registry._declared([twice])  # type: ignore[list-item]
    assert registry.EXCLUSIVE_GPU_VERDICTS == ("idle_gpu", "input_bound", "low_utilization")
    explained = {r for rs in registry.EXPLAINS.values() for r in rs}
    assert {*registry.EXCLUSIVE_GPU_VERDICTS, *registry.EXPLAINS, *explained} <= set(registry.RULES)


def test_every_rule_id_and_category_the_alerting_names_is_in_the_registry() -> None:
    sql = " ".join(a["sql"] for a in provisioning.ALERTS)
    named = {i for group in re.findall(r"rule_id IN \(([^)]*)\)", sql) for i in re.findall(r"'(\w+)'", group)}
    assert named and named <= set(registry.RULES), named - set(registry.RULES)
    categories = set(re.findall(r"category = '(\w+)'", sql))
    assert categories == {"hardware"} and categories <= {r.category for r in registry.RULES.values()}
    with pytest.raises(KeyError):
        provisioning._rule_ids("no_such_rule")


def test_the_documented_rule_table_lists_the_registry() -> None:
    root = Path(__file__).parents[2]
    tables = {page.name: set(re.findall(r"^\| `(\w+)` \|", page.read_text(), re.MULTILINE))
              for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]}
    assert set(registry.RULES) in tables.values(), "no page's rule table lists exactly the registry's rules"


def test_no_module_outside_the_rules_spells_a_rule_id() -> None:
    """Code outside collector/rules names a rule by the registry's constants, never by a string of its
    own: a renamed rule then breaks an import, not a report or a policy silently."""
    import ast

    root = Path(__file__).parents[2] / "collector"
    spelled = [f"{p.relative_to(root)}:{n.lineno} {n.value!r}" for p in sorted(root.rglob("*.py"))
               if p.relative_to(root).parts[0] != "rules"
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Constant) and n.value in registry.RULES]
    assert not spelled, spelled


def test_a_rule_that_raises_loses_only_its_own_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """One idle GPU and one GPU with an application XID: the idle rule raising on this job drops the
    idle verdict alone; the XID is still flagged and the failure is named."""
    view = JobView([gpu(0, profile=then(80, 0, 12)), gpu(1, xids={31: NOW})])
    assert ids(view) == ["idle_gpu", "xid_application"]

    def broken(*_: object) -> None:
        raise ZeroDivisionError("bad data")
    monkeypatch.setitem(registry.RULES, "idle_gpu", dataclasses.replace(registry.RULES["idle_gpu"], gpu_check=broken))
    failed: list[str] = []
    assert [h.rule_id for h in judge(view, T, failed)] == ["xid_application"]
    assert failed == ["idle_gpu"]
