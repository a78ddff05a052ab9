"""The fabric rules (`collector/rules/network/links.py`) over given statistics: communication-bound at and
below its bars, a link trained down to a quarter width flagged on its node with the straggler named
(its imbalance explained), rising link errors, and the hang's evidence of a silent fabric."""

from __future__ import annotations

from datetime import timedelta

from jobpulse.collector.rules.engine import judge
from jobpulse.collector.rules.model import GpuStats, JobView
from jobpulse.collector.rules.network import links as fabric
from jobpulse.collector.store.read.fabric_reads import PortMinute

from . import test_hang as h
from .test_hang import MINUTES, NOW, T

LINK_KBS = 100e9 / 8 / 1024  # a 100 Gb/s link, KB/s
S = T.for_gpu("gpu", "NVIDIA A100")


def port(node: str, share: float, *, minutes: int = MINUTES, width: int = 4, width_max: int = 4,
         errors: list[int] | None = None, job: str = "1") -> list[PortMinute]:
    """A port's minutes, oldest first, ending now: ``share`` of its 4X EDR link's rate each way."""
    out = []
    for i in range(minutes):
        rate = 25.0 * width
        kbs = share * rate * 1e9 / 8 / 1024
        e = errors[i] if errors else 0
        out.append(PortMinute("c", job, node, "mlx5_0", 1, NOW - timedelta(minutes=minutes - i), 60, kbs, kbs, rate,
                              width, 25.0 * width_max, width_max, 60, "InfiniBand", e, e))
    return out


def job(gpus: list[GpuStats], *ports: list[PortMinute]) -> JobView:
    v = JobView(gpus)
    v.rows[fabric.QUERY] = [r for p in ports for r in p]
    return v


def two_nodes(act: float, act2: float | None = None) -> list[GpuStats]:
    """Four GPUs on each of n1 and n2 at ``act`` % all look-back (n2's at ``act2`` if given)."""
    def level(node: str) -> float:
        return act if node == "n1" or act2 is None else act2
    return [h.gpu(i, [(level(node), level(node), 300.0, 90_000.0, 60_000)] * MINUTES, node=node, gpm=False)
            for node in ("n1", "n2") for i in range(4)]


def at_rate(share: float) -> JobView:
    """A two-node job waiting at 40 % on links at ``share`` of their rate (communication_bound's edge)."""
    return job(two_nodes(40.0), port("n1", share), port("n2", share))


def errors_rising(by: int) -> JobView:
    """A busy two-node job whose n1 link errors rise by ``by`` in the look-back (fabric_degraded's edge)."""
    return job(two_nodes(85.0), port("n1", 0.5, errors=[0] * 15 + [by] * (MINUTES - 15)), port("n2", 0.5))


def test_gpus_waiting_on_a_network_at_its_rate_are_communication_bound() -> None:
    found = fabric.communication_bound(job(two_nodes(40.0), port("n1", 0.9), port("n2", 0.88)), S)
    assert len(found) == 1 and found[0].scope_key == ""
    e = found[0].evidence
    assert e["link_gbps"] == 100.0 and e["link_share_percent"] == 89.0 and e["gpu_activity_percent"] == 40.0
    assert "bucket_cap_mb" in found[0].advice and "fewer nodes" in found[0].advice
    # at the bars: a busy GPU overlaps its communication; a network below the share is not at its rate
    assert fabric.communication_bound(job(two_nodes(S["comm_busy_percent"]), port("n1", 0.9), port("n2", 0.9)), S) == []
    assert fabric.communication_bound(job(two_nodes(40.0), port("n1", 0.69), port("n2", 0.69)), S) == []
    # only the last two minutes at the rate: not yet evidence
    late = [p[:-2] + port(p[0].node, 0.9, minutes=2) for p in (port("n1", 0.1), port("n2", 0.1))]
    assert fabric.communication_bound(job(two_nodes(40.0), *late), S) == []
    # one node's figures only (the other shared, or without RDMA): not judged
    assert fabric.communication_bound(job(two_nodes(40.0), port("n1", 0.9)), S) == []


def test_communication_bound_explains_the_gpus_low_use() -> None:
    hits = judge(job(two_nodes(22.0), port("n1", 0.95), port("n2", 0.95)), T)
    assert [h.rule_id for h in hits] == ["communication_bound"]


def test_a_link_at_a_quarter_width_is_the_nodes_fault_and_names_the_straggler() -> None:
    gpus = two_nodes(85.0, act2=30.0)  # n2's GPUs lag behind its 1X link
    v = job(gpus, port("n1", 0.5), port("n2", 0.95, width=1))
    found = fabric.fabric_degraded(v, S)
    assert [(f.scope_key, f.evidence["straggler"]) for f in found] == [("n2", "n2")]
    assert found[0].evidence["ports"][0] | {} == {"port": "mlx5_0/1", "width": 1, "width_best": 4, "rate_gbps": 25.0,
                                                  "rate_best_gbps": 100.0}
    assert found[0].advice.startswith("n2 is the job's straggler") and "--exclude=n2" in found[0].advice
    hits = judge(v, T)
    assert {(h.rule_id, h.scope_key) for h in hits} == {("fabric_degraded", "n2")}  # not imbalance on n2's GPUs
    # the port's own best is not known, but the job's other ports of the same layer are 4X
    peers = job(gpus, port("n1", 0.5), port("n2", 0.95, width=1, width_max=1))
    assert [f.scope_key for f in fabric.fabric_degraded(peers, S)] == ["n2"]
    # trained down only in the last two minutes: not yet; healthy links: nothing
    recent = port("n2", 0.5)[:-2] + port("n2", 0.5, minutes=2, width=1)
    assert fabric.fabric_degraded(job(gpus, port("n1", 0.5), recent), S) == []
    assert fabric.fabric_degraded(job(two_nodes(85.0), port("n1", 0.5), port("n2", 0.5)), S) == []


def test_rising_link_errors_flag_the_node_without_naming_a_straggler() -> None:
    rising = [0] * 10 + [3 * i for i in range(1, MINUTES - 9)]
    found = fabric.fabric_degraded(job(two_nodes(85.0), port("n1", 0.5, errors=rising), port("n2", 0.5)), S)
    assert [(f.scope_key, f.evidence["straggler"], f.evidence["ports"][0]["link_errors"]) for f in found] == \
        [("n1", None, 33)]
    assert found[0].started_at == NOW - timedelta(minutes=MINUTES - 10)
    few = [0] * 15 + [9] * (MINUTES - 15)  # under fabric_error_increase
    assert fabric.fabric_degraded(job(two_nodes(85.0), port("n1", 0.5, errors=few), port("n2", 0.5)), S) == []


def test_silence_is_the_hangs_evidence_of_a_quiet_fabric() -> None:
    since = NOW - timedelta(minutes=5)
    quiet = [p[:-6] + port(p[0].node, 0.00001, minutes=6) for p in (port("n1", 0.8), port("n2", 0.8))]
    s = fabric.silence(job(two_nodes(100.0), *quiet), since, S)
    assert s is not None and s["silent"] and s["without_figures"] == [] and set(s["busiest_kbs"]) == {"n1", "n2"}
    loud = fabric.silence(job(two_nodes(100.0), quiet[0], port("n2", 0.3)), since, S)
    assert loud is not None and not loud["silent"]
    assert fabric.silence(job(two_nodes(100.0)), since, S) is None  # no figures of the job's own


def test_a_hung_multi_node_jobs_evidence_lists_the_silent_fabric() -> None:
    gpus = [h.gpu(0, h.then((16, h.WORK), (5, h.GONE)), node="n1", gpm=False)] + [
        h.gpu(i, h.then((16, h.WORK), (5, h.SPIN)), node=node, gpm=False)
        for node in ("n1", "n2") for i in range(1 if node == "n1" else 0, 4)]
    quiet = [p[:-5] + port(p[0].node, 0.000001, minutes=5) for p in (port("n1", 0.6), port("n2", 0.6))]
    view = JobView(gpus, procs=h.procs(gpus, {gpus[0].gpu_uuid}))
    view.rows[fabric.QUERY] = [r for p in quiet for r in p]
    found = judge(view, h.T)
    assert [x.rule_id for x in found] == ["hung"]
    ev = found[0].evidence
    assert "the network between its nodes silent" in ev["evidence_used"]
    assert ev["fabric"]["silent"] and set(ev["fabric"]["busiest_kbs"]) == {"n1", "n2"}
    view.rows[fabric.QUERY] = []  # no figures of the job's own: the hang stands on the GPUs' evidence alone
    again = judge(view, h.T)
    assert [x.rule_id for x in again] == ["hung"] and again[0].evidence["fabric"] is None
