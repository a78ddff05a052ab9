"""Rules on the network between a job's nodes (InfiniBand, RoCE: `fabric_samples`), read only for
jobs on two nodes or more, and only from nodes the job holds alone (a shared node's traffic is the
node's, not the job's):

* ``communication_bound``: the fabric runs at its link's rate while the job's GPUs wait -- the job
  is bound by its collectives; the advice is the researcher's (bucketing, overlap, fewer nodes).
* ``fabric_degraded``: a port of a node narrower or slower than its best (a link trained down), or
  whose link error counters rise: the node's fault, not the job's; a straggler there is named.

`silence` is the statistic the hang rule lists as evidence: the job's fabric silent on every node.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from statistics import median
from typing import Any

from jobpulse.collector.rules.model import Finding, GpuStats, JobView, Read, Rule, Settings, SettingsOf, rounded
from jobpulse.collector.store.read.fabric_reads import PortMinute

QUERY = "fabric"
Key = tuple[str, str, int]  # node, device, port


def _multi_node(job: JobView, settings_of: SettingsOf) -> list[bool]:
    """A job on two nodes or more has a fabric to judge; its ports are read."""
    return [True] if len({g.node for g in job.gpus}) >= 2 else []


READS = (Read(QUERY, _multi_node),)


def _floor(t: datetime, width: int) -> datetime:
    return datetime.fromtimestamp(t.timestamp() // width * width, t.tzinfo)


def _ports(job: JobView, width: int) -> dict[Key, dict[datetime, list[PortMinute]]]:
    """The job's ports, their minutes grouped by the rules' blocks (aligned to the epoch, as theirs)."""
    out: dict[Key, dict[datetime, list[PortMinute]]] = defaultdict(lambda: defaultdict(list))
    for r in job.rows_of(QUERY):
        out[(r.node, r.device, r.port)][_floor(r.minute, width)].append(r)
    return out


def _whole(blocks: dict[datetime, list[PortMinute]]) -> list[datetime]:
    """A port's blocks with at least half the samples of its fullest one, oldest first."""
    counts = {b: sum(r.n for r in rows) for b, rows in blocks.items()}
    most = max(counts.values(), default=0)
    return sorted(b for b, n in counts.items() if n * 2 >= most)


def _load(rows: list[PortMinute]) -> float | None:
    """The share of its link's rate a port carried over a block, in its busier direction (None: not
    up, or no rate yet)."""
    link = min((r.link_kbs for r in rows if r.link_kbs), default=None)
    if link is None or not all(r.active for r in rows):
        return None
    rx = [r.rx_kbs for r in rows if r.rx_kbs is not None]
    tx = [r.tx_kbs for r in rows if r.tx_kbs is not None]
    if not rx and not tx:
        return None
    return max(sum(rx) / len(rx) if rx else 0.0, sum(tx) / len(tx) if tx else 0.0) / link


def _activity(g: GpuStats) -> dict[datetime, float]:
    return {m.start: a for m in g.full_blocks if (a := m.act if m.act is not None else m.duty) is not None}


def _trailing(held: list[tuple[datetime, bool]], need: int) -> datetime | None:
    """The start of the run of held blocks that ends with the newest one, if it is ``need`` long."""
    run: list[datetime] = []
    for start, ok in held:
        run = [*run, start] if ok else []
    return run[0] if len(run) >= need else None


def communication_bound(job: JobView, t: Settings) -> list[Finding]:
    """Most of the job's nodes move their link's rate (comm_link_share of it, either way) while its
    GPUs' mean activity stays under comm_busy_percent, block after block for evidence_minutes; not
    while a link of the job is degraded (`fabric_degraded`: the node's fault)."""
    nodes = sorted({g.node for g in job.gpus})
    width = int(t["evidence_block_seconds"])
    ports = _ports(job, width)
    own = sorted({k[0] for k in ports})
    if len(nodes) < 2 or len(own) < 2 or fabric_degraded(job, t):
        return []  # a degraded link is the cause, and the node's (one cause, one flag)
    by_node: dict[str, dict[datetime, float]] = defaultdict(dict)  # node -> block -> its busiest port's load
    for key, blocks in ports.items():
        for b in _whole(blocks):
            if (load := _load(blocks[b])) is not None:
                by_node[key[0]][b] = max(load, by_node[key[0]].get(b, 0.0))
    acts = [_activity(g) for g in job.gpus if g.reporting]
    starts = sorted({b for a in acts for b in a} & {b for loads in by_node.values() for b in loads})
    held, seen = [], []
    for b in starts:
        gpu = [a[b] for a in acts if b in a]
        loads = [loads[b] for loads in by_node.values() if b in loads]
        mean = sum(gpu) / len(gpu)
        at_rate = sum(x >= t["comm_link_share"] for x in loads)
        ok = at_rate >= t["comm_node_share"] * len(own) and mean < t["comm_busy_percent"]
        held.append((b, ok))
        seen.append((b, mean, sum(loads) / len(loads)))
    since = _trailing(held, round(t["evidence_minutes"] * 60 / width))
    if since is None:
        return []
    run = [(m, x) for b, m, x in seen if b >= since]
    gpu_mean = sum(m for m, _ in run) / len(run)
    load = sum(x for _, x in run) / len(run)
    rate = max((r.rate_gbps or 0.0) for rows in ports.values() for ms in rows.values() for r in ms)
    shared = [n for n in nodes if n not in own]
    return [Finding("", since, {
        "nodes": own, "link_gbps": rounded(rate), "link_share_percent": rounded(100 * load),
        "gpu_activity_percent": rounded(gpu_mean), "shared_or_without_fabric": shared,
        "gpus": [g.key for g in job.gpus]},
        f"The job is bound by its communication: since {since:%H:%M} the network between its nodes runs at "
        f"{100 * load:.0f}% of its {rate:g} Gb/s links while its GPUs average {gpu_mean:.0f}% activity, "
        f"waiting for collectives. Bucket gradients into fewer, larger all-reduces (DDP bucket_cap_mb), "
        f"overlap communication with computation (DDP does when buckets fill during backward; FSDP: "
        f"backward_prefetch and limit_all_gathers), accumulate gradients over more steps between "
        f"all-reduces, or run on fewer nodes with more GPUs each: NVLink within a node is an order of "
        f"magnitude faster than the network." + (f" Nodes {', '.join(shared)} are shared or have no RDMA "
                                                 f"port: their traffic is not counted." if shared else ""))]


def _best(ports: dict[Key, dict[datetime, list[PortMinute]]]) -> dict[str, tuple[float, int]]:
    """The best rate and width of each link layer among the job's ports (their own best included)."""
    best: dict[str, tuple[float, int]] = {}
    for blocks in ports.values():
        for rows in blocks.values():
            for r in rows:
                old = best.get(r.link_layer or "", (0.0, 0))
                best[r.link_layer or ""] = (max(old[0], r.rate_max_gbps or 0.0, r.rate_gbps or 0.0),
                                            max(old[1], r.width_max or 0, r.width or 0))
    return best


def _degraded(key: Key, blocks: dict[datetime, list[PortMinute]], best: tuple[float, int], t: Settings,
              need: int) -> tuple[datetime, dict[str, Any]] | None:
    """Why a port is degraded and since when: narrower or slower than the best for the last ``need``
    whole blocks (up all along), or its link errors rising by fabric_error_increase in the look-back."""
    whole = _whole(blocks)
    rows = [r for b in whole for r in blocks[b]]
    if not rows or not all(r.active for r in blocks[whole[-1]]):
        return None
    rate_best, width_best = best
    last = blocks[whole[-1]][-1]
    found: dict[str, Any] = {"port": f"{key[1]}/{key[2]}", "width": last.width, "width_best": width_best,
                             "rate_gbps": last.rate_gbps, "rate_best_gbps": rate_best}
    low = [(b, any((r.width or width_best) < width_best or (r.rate_gbps or rate_best) < rate_best
                   for r in blocks[b]) and all(r.active for r in blocks[b])) for b in whole]
    since = _trailing(low, need)
    ordered = sorted(rows, key=lambda r: r.minute)
    rise = ordered[-1].errors_hi - ordered[0].errors_lo
    if rise >= t["fabric_error_increase"]:
        first = next(r.minute for r in ordered if r.errors_hi > ordered[0].errors_lo)
        found["link_errors"] = rise
        since = min(since, first) if since else first
    return (since, found) if since else None


def fabric_degraded(job: JobView, t: Settings) -> list[Finding]:
    """A node of the job whose port runs below its best, or whose link errors rise: the node's fault.
    Its GPUs' use is then the link's doing (their imbalance is not raised), and a node whose GPUs lag
    the others' is named the job's straggler."""
    width = int(t["evidence_block_seconds"])
    ports = _ports(job, width)
    best = _best(ports)
    need = round(t["evidence_minutes"] * 60 / width)
    by_node: dict[str, list[tuple[datetime, dict[str, Any]]]] = defaultdict(list)
    for key, blocks in ports.items():
        layer = next((r.link_layer or "" for rows in blocks.values() for r in rows), "")
        if found := _degraded(key, blocks, best[layer], t, need):
            by_node[key[0]].append(found)
    out = []
    for node, hits in sorted(by_node.items()):
        since = min(s for s, _ in hits)
        straggler = _lags(job, node, since, t)
        links = "; ".join(
            f"{f['port']} at {f['width']}X {f['rate_gbps']:g} Gb/s of {f['width_best']}X {f['rate_best_gbps']:g} Gb/s"
            + (f", {f['link_errors']} link errors" if "link_errors" in f else "") for _, f in hits)
        out.append(Finding(node, since, {
            "node": node, "ports": [f for _, f in hits], "straggler": node if straggler else None,
            "gpus": [g.key for g in job.gpus if g.node == node]},
            (f"{node} is the job's straggler, behind a degraded network link: " if straggler else
             f"A network link of {node} is degraded: ") + links + ". This is the node's fault, not the job's: "
            f"admins, reseat or replace the cable and check the switch port (ibstat, perfquery); meanwhile "
            f"resubmit with --exclude={node}."))
    return out


def _lags(job: JobView, node: str, since: datetime, t: Settings) -> bool:
    """The node's GPUs run below imbalance_ratio of the others' median since ``since``."""
    def mean(g: GpuStats) -> float | None:
        acts = [a for b, a in _activity(g).items() if b >= since]
        return sum(acts) / len(acts) if acts else None
    mine = [m for g in job.gpus if g.node == node and (m := mean(g)) is not None]
    others = [m for g in job.gpus if g.node != node and (m := mean(g)) is not None]
    return bool(mine and others) and sum(mine) / len(mine) < t["imbalance_ratio"] * median(others)


def silence(job: JobView, since: datetime, t: Settings) -> dict[str, Any] | None:
    """The job's fabric since ``since``: each node's busiest port (its highest minute's traffic, KB/s),
    and whether every node with figures of its own stayed under fabric_silent_kbs (a hang leaves the
    network silent; a checkpoint to a parallel file system or a straggler's collective does not).
    None: no node has figures of the job's own (a single node, shared nodes, no RDMA ports)."""
    peak: dict[str, float] = {}
    for r in job.rows_of(QUERY):
        if r.minute >= _floor(since, 60):
            peak[r.node] = max(peak.get(r.node, 0.0), r.traffic_kbs)
    if not peak:
        return None
    return {"silent": all(v <= t["fabric_silent_kbs"] for v in peak.values()),
            "busiest_kbs": {n: rounded(v, 0) for n, v in sorted(peak.items())},
            "without_figures": sorted({g.node for g in job.gpus} - set(peak))}


RULES = (
    Rule("communication_bound", "job", "code", "warning", "the network runs at its link's rate while the GPUs wait",
         ("blocks", "rows"), ("comm_link_share", "comm_node_share", "comm_busy_percent", "evidence_minutes",
                                "evidence_block_seconds"), job_check=communication_bound),
    Rule("fabric_degraded", "job", "hardware", "warning", "a network link trained down or failing (errors rising)",
         ("rows", "blocks"), ("fabric_error_increase", "evidence_minutes", "evidence_block_seconds",
                                "imbalance_ratio", "fabric_silent_kbs"), job_check=fabric_degraded),
)
