"""Each rule on given statistics: it fires on a clear case, stays silent on a near miss; the
precedence gives one verdict per GPU; the registry agrees with the thresholds and the alerting."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from datetime import datetime, timedelta, timezone
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jobpulse.collector.grafana import provisioning
from jobpulse.collector.rules import engine, registry
from jobpulse.collector.rules.engine import judge
from jobpulse.collector.rules.model import Finding, GpuStats, JobView, ProcStats
from jobpulse.collector.rules.placement import cpulist
from jobpulse.collector.rules.thresholds import Thresholds

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
T = Thresholds()


def gpu(index: int = 0, node: str = "n1", **over: Any) -> GpuStats:
    """A busy H100 over a fully covered 30-minute window: no rule fires on it."""
    base = dict(cluster="c", job_id="1", partition="gpu", node=node, gpu_uuid=f"GPU-{node}-{index}", gpu_index=index,
                model="NVIDIA H100", samples=1800, first_ts=NOW - timedelta(minutes=30), last_ts=NOW,
                job_start=NOW - timedelta(minutes=31), last_util=90.0, last_busy=NOW, util_mean=90.0,
                gpm_samples=1800, sm_active_mean=80.0, tensor_max=40.0, peak_mem_share=0.6, peak_mem_mib=48_000,
                last_mem_mib=48_000, hw_throttle_share=0.0, idle_share=0.0, busy_share=1.0)
    return GpuStats(**{**base, **over})  # type: ignore[arg-type]


def ids(view: JobView) -> list[str]:
    return sorted(h.rule_id for h in judge(view, T))


def test_a_healthy_job_raises_nothing() -> None:
    assert ids(JobView([gpu(0), gpu(1)], gpus_requested=2, gpus_ever_used=2)) == []


def test_idle_gpu_by_run_length() -> None:
    idle = gpu(1, last_util=0.0, last_busy=NOW - timedelta(minutes=12), util_mean=20.0, sm_active_mean=20.0)
    assert ids(JobView([idle])) == ["idle_gpu"]  # its low mean is explained by the idling
    recent = dataclasses.replace(idle, last_busy=NOW - timedelta(minutes=8))  # below idle_minutes: not yet
    assert ids(JobView([recent])) == ["low_utilization"]


def test_idle_wins_over_stalls_and_low_use_on_one_gpu() -> None:
    g = gpu(0, last_util=0.0, last_busy=NOW - timedelta(minutes=15), sm_active_mean=10.0, util_mean=10.0,
            idle_share=0.6, busy_share=0.3)
    found = judge(JobView([g]), T)
    assert [h.rule_id for h in found if h.scope == "gpu"] == ["idle_gpu"]


def test_idle_all_window_but_not_yet_long_enough_is_no_verdict() -> None:
    """Idle since the window began, 5 minutes: not idle_gpu yet, and not low use or stalls either."""
    g = gpu(0, first_ts=NOW - timedelta(minutes=5), last_util=0.0, last_busy=None, sm_active_mean=0.0,
            util_mean=0.0, idle_share=1.0, busy_share=0.0, samples=300)
    assert ids(JobView([g])) == []
    assert ids(JobView([dataclasses.replace(g, first_ts=NOW - timedelta(minutes=11))])) == ["idle_gpu"]


def test_input_bound_stall_pattern_and_its_near_miss() -> None:
    stalls = gpu(0, idle_share=0.3, busy_share=0.5, sm_active_mean=45.0)
    assert ids(JobView([stalls])) == ["input_bound"]
    assert ids(JobView([dataclasses.replace(stalls, idle_share=0.2)])) == []


def test_input_bound_cpu_pattern_needs_a_saturated_process() -> None:
    low = gpu(0, sm_active_mean=12.0, util_mean=40.0)
    busy_cpu = ProcStats("n1", 42, 0, "GPU-n1-0", "python", 99.0, {3: 10})
    assert ids(JobView([low], procs=[busy_cpu])) == ["input_bound"]
    calm_cpu = dataclasses.replace(busy_cpu, cpu_mean=60.0)
    assert ids(JobView([low], procs=[calm_cpu])) == ["low_utilization"]


def test_low_utilization_waits_for_a_covered_window() -> None:
    low = gpu(0, sm_active_mean=12.0)
    assert ids(JobView([low])) == ["low_utilization"]
    warming = dataclasses.replace(low, first_ts=NOW - timedelta(minutes=5))
    assert ids(JobView([warming])) == []
    assert ids(JobView([dataclasses.replace(low, sm_active_mean=31.0)])) == []


def test_imbalance_against_the_other_gpus_median() -> None:
    slow = gpu(3, sm_active_mean=30.0)
    found = judge(JobView([gpu(0), gpu(1), gpu(2), slow]), T)
    assert [(h.rule_id, h.scope_key) for h in found] == [("imbalance", slow.key)]
    assert ids(JobView([gpu(0), gpu(1), dataclasses.replace(slow, sm_active_mean=50.0)])) == []


def test_no_tensor_cores_needs_gpm_and_busy_sms() -> None:
    assert ids(JobView([gpu(0, tensor_max=0.0)])) == ["no_tensor_cores"]
    assert ids(JobView([gpu(0, tensor_max=0.0, gpm_samples=0, sm_active_mean=None)])) == []


@pytest.mark.parametrize(("over", "rule"), [
    ({"hw_throttle_share": 0.2}, "hw_throttling"),
    ({"pcie_below_max_share": 0.9, "pcie_link": "4x8/5x16"}, "pcie_downgraded"),
    ({"xids": [79, 79]}, "xid_error"),
])
def test_hardware_rules(over: dict[str, Any], rule: str) -> None:
    found = judge(JobView([gpu(0, **over)]), T)
    assert [h.rule_id for h in found] == [rule]
    assert found[0].category == "hardware"


def test_memory_underused_and_its_near_miss() -> None:
    small = gpu(0, peak_mem_share=0.05, peak_mem_mib=4000)
    assert ids(JobView([small])) == ["memory_underused"]
    assert ids(JobView([dataclasses.replace(small, peak_mem_share=0.11)])) == []


def test_over_allocation_counts_gpus_never_busy() -> None:
    never = gpu(1, last_busy=None, last_util=0.0, sm_active_mean=0.0, util_mean=0.0, idle_share=1.0, busy_share=0.0)
    found = judge(JobView([gpu(0), never], gpus_requested=2, gpus_ever_used=1), T)
    assert "over_allocation" in [h.rule_id for h in found]
    assert ids(JobView([gpu(0), gpu(1)], gpus_requested=2, gpus_ever_used=2)) == []


def test_topology_no_nvlink_and_numa_far() -> None:
    a, b = gpu(0), gpu(1)
    links = {"n1": {a.gpu_uuid: {b.gpu_uuid: "SYS"}, b.gpu_uuid: {a.gpu_uuid: "SYS"}, "GPU-x": {"GPU-y": "NV18"}}}
    assert ids(JobView([a, b], links=links)) == ["topology_no_nvlink"]
    far = ProcStats("n1", 7, 0, a.gpu_uuid, "python", 50.0, {40: 30, 41: 10})
    assert ids(JobView([a], procs=[far], local_cpus={a.key: "0-15"})) == ["numa_far"]
    near = dataclasses.replace(far, cpus={3: 40})
    assert ids(JobView([a], procs=[near], local_cpus={a.key: "0-15"})) == []


def test_cpulist_parsing() -> None:
    assert cpulist("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert cpulist("") == set() and cpulist("x,2-a,5") == {5}


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
    assert set(registry.ids("hardware")) == {"hw_throttling", "pcie_downgraded", "xid_error", "topology_no_nvlink"}


def test_one_cause_one_flag_on_a_gpu() -> None:
    """An idle GPU is below its peers because it is idle; a GPU with an XID is the node's problem."""
    idle = gpu(1, last_util=0.0, last_busy=NOW - timedelta(minutes=12), util_mean=20.0, sm_active_mean=20.0)
    assert ids(JobView([gpu(0), gpu(2), idle])) == ["idle_gpu"]
    broken = gpu(0, xids=[79], sm_active_mean=5.0, util_mean=5.0)
    assert ids(JobView([broken])) == ["xid_error"]


def test_xids_are_the_nodes_or_the_applications_by_nvidias_catalogue() -> None:
    app = judge(JobView([gpu(0, xids=[31])]), T)
    assert [(h.rule_id, h.category) for h in app] == [("xid_application", "code")]
    assert "XID 31: GPU memory page fault" in app[0].advice
    both = judge(JobView([gpu(0, xids=[31, 79])]), T)
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
    return JobView([gpu(0)], procs=[ProcStats("n1", 7, 0, gpu(0).gpu_uuid, "python", 50.0, cpus)],
                   local_cpus={gpu(0).key: "0-15"})


# rule -> (a case at its threshold: fires, the nearest miss: silent), on the default thresholds
EDGES: dict[str, tuple[JobView, JobView]] = {
    "idle_gpu": (JobView([gpu(0, last_util=0.0, last_busy=NOW - timedelta(minutes=10))]),
                 JobView([gpu(0, last_util=0.0, last_busy=NOW - timedelta(minutes=9.9))])),
    "input_bound": (JobView([gpu(0, idle_share=0.25, busy_share=0.25)]),
                    JobView([gpu(0, idle_share=0.24, busy_share=0.25)])),
    "low_utilization": (JobView([gpu(0, sm_active_mean=29.9)]), JobView([gpu(0, sm_active_mean=30.0)])),
    "imbalance": (JobView([gpu(0), gpu(1), gpu(2, sm_active_mean=39.9)]),
                  JobView([gpu(0), gpu(1), gpu(2, sm_active_mean=40.0)])),
    "no_tensor_cores": (JobView([gpu(0, tensor_max=0.9)]), JobView([gpu(0, tensor_max=1.0)])),
    "hw_throttling": (JobView([gpu(0, hw_throttle_share=0.10)]), JobView([gpu(0, hw_throttle_share=0.09)])),
    "pcie_downgraded": (JobView([gpu(0, pcie_below_max_share=0.5, pcie_link="4x8/5x16")]),
                        JobView([gpu(0, pcie_below_max_share=0.49, pcie_link="4x8/5x16")])),
    "xid_error": (JobView([gpu(0, xids=[79])]), JobView([gpu(0, xids=[31])])),
    "xid_application": (JobView([gpu(0, xids=[31])]), JobView([gpu(0, xids=[79])])),
    "memory_underused": (JobView([gpu(0, peak_mem_share=0.09), gpu(1, peak_mem_share=0.05)]),
                         JobView([gpu(0, peak_mem_share=0.10), gpu(1, peak_mem_share=0.05)])),
    "over_allocation": (JobView([gpu(0), gpu(1)], gpus_requested=2, gpus_ever_used=1),
                        JobView([gpu(0), gpu(1)], gpus_requested=2, gpus_ever_used=2)),
    "topology_no_nvlink": (JobView([gpu(0), gpu(1)], links=_links("SYS")),
                           JobView([gpu(0), gpu(1)], links=_links("PIX"))),
    "numa_far": (_rank_on_cpus({40: 5, 3: 5}), _rank_on_cpus({40: 4, 3: 6})),
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
    """Stalls on a GPU with a low mean: both rules fire alone; the GPU gets the first in precedence."""
    view = JobView([gpu(0, idle_share=0.3, busy_share=0.3, sm_active_mean=20.0)])
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


def test_the_readme_rule_table_lists_the_registry() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert set(re.findall(r"^\| `(\w+)` \|", readme, re.MULTILINE)) == set(registry.RULES)
