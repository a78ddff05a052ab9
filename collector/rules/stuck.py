"""Jobs stuck without ending: the ``hung`` rule, and what `hardware.node_lost` asks of a job whose
node fell silent (`waits`, `silent_nodes`).

When one rank of a multi-GPU job dies, or its node fails, the survivors sit in a collective: each
GPU's duty cycle reads busy (a kernel is resident and spinning) while it draws near-idle power,
moves no data and makes no step, until the time limit. Duty cycle alone cannot see it; the
evidence of work can: power against the job's own working level (what its GPUs drew when they
worked), SM activity where GPM measures it, PCIe/NVLink traffic, and steps where the job reports
them (steps that go on are work, whatever the GPUs look like). What broke is the place that fell
silent or went idle first: a node whose agent stopped reporting, a GPU whose rank exited.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from jobpulse.collector.rules.evidence import FILLED, RELEASED, per_gpu, per_job, spins, working_level
from jobpulse.collector.rules.model import Block, Finding, GpuStats, JobView, Read, Rule, Settings, SettingsOf, rounded
from jobpulse.collector.rules.network import links
from jobpulse.schema.semantics import APPLICATION_XIDS, phase_kind


def spinning(m: Block, t: Settings, level: float | None) -> bool:
    """A block that spins (`evidence.spins`: busy duty cycle, at hang_duty_percent here, under the
    spinning share of the job's working ``level``) and shows no work otherwise: no SM activity where
    GPM measures it, no traffic where measured, power near idle (under ``hang_idle_power_share`` of
    its limit, where known)."""
    return (spins(m.duty, m.power, t, level, t["hang_duty_percent"])
            and (m.sm_active is None or m.sm_active <= t["hang_sm_percent"])
            and (m.traffic is None or m.traffic <= t["hang_traffic_kbs"])
            and (m.power_limit is None or m.power <= t["hang_idle_power_share"] * m.power_limit))


def quiet(m: Block, t: Settings) -> bool:
    """A block with nothing running: idle in ``idle_share`` of its samples, duty cycle included."""
    return bool(m.n) and m.idle >= t["idle_share"] * m.n and (m.duty is None or m.duty < t["hang_duty_percent"])


@dataclass(frozen=True)
class Waiting:
    """How one reporting GPU has waited: since when (the start of its trailing run of spinning or
    quiet blocks) and how many of those blocks spun."""

    gpu: GpuStats
    since: datetime
    spun: int
    blocks: int


def _waiting(g: GpuStats, t: Settings, level: float | None) -> Waiting | None:
    """The GPU's trailing run of waiting blocks (partial blocks, such as a short agent restart's, are
    skipped, not counted); None when its newest whole block worked."""
    since, spun, n = None, 0, 0
    for m in reversed(g.full_blocks):
        s = spinning(m, t, level)
        if not s and not quiet(m, t):
            break
        since, spun, n = m.start, spun + s, n + 1
    return Waiting(g, since, spun, n) if since is not None else None


@per_gpu
def _shape(g: GpuStats, t: Settings) -> Waiting | None:
    """`_waiting` judged without a level, once per GPU and cycle: a job is asked whether it may be
    stuck by the reads it needs and by both rules that judge it."""
    return _waiting(g, t, None)


@dataclass(frozen=True)
class Hang:
    """A job whose GPUs all wait: since when, which waited, the working level, and what broke."""

    since: datetime
    waiting: list[Waiting]
    level: float
    silent_nodes: dict[str, datetime]  # node -> its last sample
    last_step: datetime | None  # the newest minute with a step, in the look-back


def silent_nodes(job: JobView) -> dict[str, datetime]:
    """Nodes of the job none of whose GPUs reports while another node's does: node -> last sample."""
    nodes: dict[str, list[GpuStats]] = {}
    for g in job.gpus:
        nodes.setdefault(g.node, []).append(g)
    if len(nodes) < 2:
        return {}
    silent = {n: max(g.last_ts for g in gs) for n, gs in nodes.items() if not any(g.reporting for g in gs)}
    return silent if len(silent) < len(nodes) else {}


def waits(job: JobView, t: Settings, level: float | None) -> tuple[datetime, list[Waiting]] | None:
    """Every reporting GPU of a multi-GPU job waiting (spinning or quiet) for ``hang_minutes``, at
    least half of them spinning (now, and over their waiting): since when, and how each waited. A job that ended hung (cancelled,
    timed out) is still judged on its last minutes at its final cycle."""
    reporting = [g for g in job.gpus if g.reporting and g.blocks]
    if len(job.gpus) < 2 or not reporting:
        return None
    # At least half spin now: one block per GPU rules out most jobs, busy or idle, at once.
    if sum(1 for g in reporting if g.full_blocks and spinning(g.full_blocks[-1], t, level)) * 2 < len(reporting):
        return None
    waiting = []
    for g in reporting:
        w = _shape(g, t) if level is None else _waiting(g, t, level)
        if w is None:
            return None
        waiting.append(w)
    if min(w.blocks for w in waiting) * t["evidence_block_seconds"] < t["hang_minutes"] * 60:
        return None
    if sum(1 for w in waiting if w.spun * 2 > w.blocks) * 2 < len(waiting):
        return None  # mostly idle GPUs: idle_gpu's to judge, not a spin-wait
    return max(w.since for w in waiting), waiting


def _level(job: JobView) -> float | None:
    """The job's working level (`evidence.working_level`), or what its GPUs drew working since it
    started where the look-back holds less (`worked_power`: a hang longer than the window)."""
    worked = [r.level for r in job.rows_of("worked_power") if r.level is not None]
    return max((x for x in (working_level(job), *worked) if x is not None), default=None)


@per_job
def diagnose(job: JobView, t: Settings) -> Hang | None:
    """The job's GPUs all wait (`waits`) below ``hang_power_share`` of its working level, its ranks
    report no step since and declare no checkpoint or evaluation that explains the wait. Derived
    once a job and cycle."""
    if waits(job, t, None) is None:  # most jobs: a GPU's newest minute worked (a look at one block each)
        return None
    level = _level(job)
    if level is None:
        return None  # never seen working: a job that has not started cannot have hung
    found = waits(job, t, level)
    if found is None:
        return None
    since, waiting = found
    last_step = max((r.minute for r in job.rows_of("last_step")), default=None)
    if last_step is not None and last_step > since:
        return None  # its ranks still report steps: slow, perhaps, but working
    if _declared(job, since, t):
        return None  # a rank says it checkpoints or evaluates while the others wait in a barrier
    return Hang(since, waiting, level, silent_nodes(job), last_step)


def _declared(job: JobView, since: datetime, t: Settings) -> bool:
    """A checkpoint or evaluation phase the job declared explains the waiting since ``since``: still
    running for less than ``hang_phase_minutes``, or ended less than ``hang_minutes`` ago (the ranks
    leave the barrier after it)."""
    newest = max(g.last_ts for g in job.gpus if g.reporting)
    for p in job.rows_of("phases"):
        name, began, ended = p.phase, p.began, p.ended
        if phase_kind(name) is None or (ended is not None and ended < since):
            continue
        if ended is None and newest - began < timedelta(minutes=t["hang_phase_minutes"]):
            return True
        if ended is not None and newest - ended < timedelta(minutes=t["hang_minutes"]):
            return True
    return False


def _released(g: GpuStats) -> bool:
    """The GPU's memory was filled and has been released: its rank's process has gone."""
    peak, last = g.peak_mem_mib, g.last_mem_mib
    return peak is not None and peak > 0 and last is not None and last < RELEASED * peak and any(
        (m.fb_max or 0) >= FILLED * peak for m in g.blocks)


def broken(h: Hang, job: JobView) -> tuple[str, dict[str, object]]:
    """What broke, in words and as evidence: a silent node, else a GPU the hardware broke (lost, a
    node's XID), else the GPU whose rank exited or that went quiet first, else the GPU that began
    waiting first."""
    if h.silent_nodes:
        node, last = min(h.silent_nodes.items(), key=lambda x: x[1])
        return (f"node {node} stopped reporting at {last:%H:%M}",
                {"broken": "node", "node": node, "last_sample": last.isoformat()})
    faulted = sorted((g for g in job.gpus if g.lost_at or set(g.xids) - set(APPLICATION_XIDS)),
                     key=lambda g: min([*(x for c, x in g.xids.items() if c not in APPLICATION_XIDS),
                                        *([g.lost_at] if g.lost_at else [])]))
    if faulted:  # a GPU's hardware broke the job (its own flag says how): the survivors wait on it
        g = faulted[0]
        codes = sorted(c for c in g.xids if c not in APPLICATION_XIDS)
        how = "was lost" + (f" (XID {', '.join(map(str, codes))})" if codes else "") if g.lost_at else \
            f"reported XID {', '.join(map(str, codes))}"
        return f"{g.where} {how}", {"broken": "gpu", "gpu": g.where, "node": g.node, "xids": codes}
    quiet_first = sorted((w for w in h.waiting if w.spun * 2 <= w.blocks), key=lambda w: (w.since, w.gpu.where))
    seen = any(job.drivers(g) for g in job.gpus)  # processes measured: a GPU without one has lost its rank

    def gone(g: GpuStats) -> bool:
        return _released(g) or (seen and not job.drivers(g))
    exited = [w for w in quiet_first if gone(w.gpu)]
    pick = (exited or quiet_first or sorted(h.waiting, key=lambda w: (w.since, w.gpu.where)))[0]
    g = pick.gpu
    ranks = job.ranks_on(g)
    rank = f"rank {', '.join(map(str, ranks))} on " if ranks else "the rank on "
    how = ("exited" if gone(g) else "went idle") if pick in quiet_first else "waits"
    words = (f"{rank}{g.where} {how}{' (its memory released)' * _released(g)} first" if pick in quiet_first
             else f"{g.where} began waiting first")
    return words, {"broken": "rank" if pick in quiet_first else "unknown", "how": how, "gpu": g.where,
                   "node": g.node, **({"ranks": ranks} if ranks else {}), "since": pick.since.isoformat()}


def _evidence_used(h: Hang, job: JobView) -> list[str]:
    """Which signals showed the waiting GPUs doing no work."""
    blocks = [m for w in h.waiting for m in w.gpu.full_blocks if m.start >= w.since]
    used = ["duty cycle", "power"] + ([f"no step since {h.last_step:%H:%M}"] if h.last_step else [])
    if any(m.sm_active is not None for m in blocks):
        used.append("SM activity (GPM)")
    if any(m.traffic is not None for m in blocks):
        used.append("PCIe/NVLink traffic")
    return used


def hung(job: JobView, t: Settings) -> list[Finding]:
    """One flag per hung job (`diagnose`), naming what broke and which evidence showed it."""
    h = diagnose(job, t)
    if h is None:
        return []
    what, where = broken(h, job)
    spin = [w for w in h.waiting if w.spun * 2 > w.blocks]
    powers = [m.power for w in spin for m in w.gpu.full_blocks if m.start >= w.since and m.power is not None]
    power = sum(powers) / len(powers) if powers else 0.0
    used = _evidence_used(h, job)
    network = links.silence(job, h.since, t)  # None: no node of the job has figures of its own
    if network is not None and network["silent"]:
        used.append("the network between its nodes silent")
    minutes = (max(g.last_ts for g in job.gpus if g.reporting) - h.since).total_seconds() / 60
    node = where["node"]
    return [Finding("", h.since,
                    {**where, "waiting_gpus": len(h.waiting), "spinning_gpus": len(spin),
                     "spin_power_w": rounded(power), "working_power_w": rounded(h.level),
                     "minutes": rounded(minutes), "evidence_used": used, "fabric": network,
                     "gpus": [w.gpu.key for w in h.waiting]},
                    f"The job has hung since {h.since:%H:%M}: {what}; {len(spin)} GPUs wait in a collective "
                    f"(busy by duty cycle at {power:.0f} W, against {h.level:.0f} W when working; evidence: "
                    f"{', '.join(used)}). Cancel it and look at "
                    + (f"node {node}" if where["broken"] == "node" else
                       f"{node}'s hardware (resubmit excluding it: --exclude={node})" if where["broken"] == "gpu" else
                       f"{where['gpu']} and its rank's log")
                    + "; set TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a collective timeout well below the time "
                    "limit (init_process_group(timeout=...)) so a broken rank ends the job, and checkpoint often "
                    "enough that a restart loses little.")]


def _may_hang(job: JobView, settings_of: SettingsOf) -> list[bool]:
    """Could the job be hung? Its GPUs wait by their look alone (no level): its working power since
    it started, its steps and phases are then read."""
    return [True] if waits(job, settings_of(job.gpus[0]), None) is not None else []


def _exited_unnamed(job: JobView, settings_of: SettingsOf) -> list[bool]:
    """A job that may be hung whose quiet GPUs have no rank now (their process exited): which ranks
    drove them is read, so the flag can name the rank."""
    found = waits(job, settings_of(job.gpus[0]), None)
    return [True] if found is not None and not silent_nodes(job) and any(
        w.spun * 2 <= w.blocks and not job.ranks_on(w.gpu) for w in found[1]) else []


READS = (Read("worked_power", _may_hang), Read("last_step", _may_hang), Read("phases", _may_hang),
         Read("gpu_ranks", _exited_unnamed))
"""For a job whose GPUs look stuck: its working level since it started (a hang longer than the
look-back), its newest step and its declared phases (work, or a barrier it explains), and the
ranks that drove GPUs whose process has gone."""


RULES = (
    Rule("hung", "job", "code", "critical", "every GPU of the job waits (spinning at near-idle power, or idle) "
         "after a rank or node broke", ("blocks", "last_ts", "reporting", "procs", "rows"),
         ("hang_minutes", "hang_duty_percent", "hang_sm_percent", "hang_traffic_kbs", "hang_power_share",
          "hang_idle_power_share", "idle_share", "hang_phase_minutes"), job_check=hung),
)
