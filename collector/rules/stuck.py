"""Jobs stuck without ending: the ``hung`` rule, and what `hardware.node_lost` asks of a job whose
node fell silent (`waits`, `silent_nodes`).

When one rank of a multi-GPU job dies, or its node fails, the survivors sit in a collective: each
GPU's duty cycle reads busy (a kernel is resident and spinning) while it draws near-idle power,
moves no data and makes no step, until the time limit. Duty cycle alone cannot see it; the
evidence of work can: power against the job's own working level (what its GPUs drew when they
worked), SM activity where GPM measures it, PCIe/NVLink traffic, and steps where the job reports
them (steps that go on are work, whatever the GPUs look like). What broke is the place that fell
silent or went idle first: a node whose agent stopped reporting, a GPU whose rank exited.

A healthy job looks the same while its ranks wait in a barrier for one that writes a checkpoint to
slow storage, so the claim has two forms (`claim`). Strong, the `hung` flag a policy may act on: a
broken part is seen (a node silent, a GPU's hardware fault, a rank's process gone or a zombie), or
every rank is alive but the stall has outlasted the job's collective timeout (after which NCCL would
have ended it). Weak, the `stalled` note on the job's timeline: no broken part, not yet past the
timeout; it names the ranks that work on the host meanwhile (alive, reading or writing). Both are
kinds of one flag (`registry.cause_of`): a stall that turns into a hang keeps its flag, one that
resumes closes as a note.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from jobpulse.collector.rules.evidence import FILLED, RELEASED, per_gpu, per_job, spins, working_level
from jobpulse.collector.rules.model import Block, Finding, GpuStats, JobView, Read, Rule, Settings, SettingsOf, rounded
from jobpulse.collector.rules.network import links
from jobpulse.collector.store.read.rule_reads import RankActivity
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
    dead = {(a.node, a.pid) for a in job.rows_of("rank_activity") if a.state in EXITED}

    def gone(g: GpuStats) -> bool:
        return _released(g) or (seen and not job.drivers(g)) or any((p.node, p.pid) in dead for p in job.drivers(g))
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


EXITED = ("Z", "X")
"""State letters of a process that has exited (a zombie, dead): its rank is gone."""


@dataclass(frozen=True)
class Claim:
    """The hang claim's form: strong (a broken part, or the stall past the job's collective timeout:
    a policy may act on it) or weak (a note), with what it rests on."""

    hang: Hang
    strong: bool
    basis: str  # "broken part", "timeout", or "" (weak)
    what: str  # what broke, or the rank that went idle or began waiting first
    where: dict[str, object]  # `broken`'s evidence
    minutes: float  # how long the GPUs have waited
    timeout: float  # the job's collective timeout, minutes
    timeout_from: str  # where that comes from
    working: tuple[RankActivity, ...]  # processes working on the host meanwhile


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", re.IGNORECASE)


def declared_minutes(value: str | None) -> float | None:
    """A duration a job wrote in a tag: minutes, or with a unit (``1800s``, ``30m``, ``1h``); None
    where it is not one."""
    m = _DURATION.fullmatch(value or "")
    if m is None or float(m.group(1)) <= 0:
        return None
    return float(m.group(1)) * {"s": 1 / 60, "sec": 1 / 60, "h": 60.0}.get((m.group(2) or "m").lower(), 1.0)


def timeout(job: JobView, t: Settings) -> tuple[float, str]:
    """The job's collective timeout in minutes and where it comes from: its tag ``collective_timeout``
    where it wrote one that reads as a duration, else the rules' ``hang_timeout_minutes``."""
    site = t["hang_timeout_minutes"], "hang_timeout_minutes"
    for r in job.rows_of("declared_timeout"):
        minutes = declared_minutes(r.value)
        if minutes is None:
            return site[0], f"hang_timeout_minutes (the job's tag collective_timeout={r.value[:40]!r} is not a duration)"
        return minutes, f"the job's tag collective_timeout={r.value}"
    return site


def working(job: JobView, t: Settings) -> tuple[RankActivity, ...]:
    """The job's processes that work on the host now: alive (not stopped, not exited), running or in
    I/O wait in most of their last minute's samples, and reading or writing at ``hang_working_io_bps``
    or more (a rank writing its checkpoint while the others wait for it in a barrier)."""
    return tuple(a for a in job.rows_of("rank_activity")
                 if a.state not in (*EXITED, "T", "t") and (a.running or 0) >= 0.5
                 and max(a.read_bps or 0, a.write_bps or 0) >= t["hang_working_io_bps"])


@per_job
def claim(job: JobView, t: Settings) -> Claim | None:
    """The job's hang claim (`diagnose`), strong or weak. Strong at once where a part is seen broken
    (a node silent, a GPU's hardware fault, a rank that exited); with every rank alive, only once the
    stall has lasted the job's collective timeout (`timeout`). A timeout longer than the look-back
    holds cannot be seen to pass: the stall stays weak."""
    h = diagnose(job, t)
    if h is None:
        return None
    what, where = broken(h, job)
    minutes = (max(g.last_ts for g in job.gpus if g.reporting) - h.since).total_seconds() / 60
    limit, source = timeout(job, t)
    if where["broken"] in ("node", "gpu") or where.get("how") == "exited":
        return Claim(h, True, "broken part", what, where, minutes, limit, source, working(job, t))
    return Claim(h, minutes >= limit, "timeout" if minutes >= limit else "", what, where, minutes, limit, source,
                 working(job, t))


def _words(a: RankActivity) -> str:
    """A working process in words: which rank, where, and what it does."""
    who = f"rank {a.rank}" if a.rank is not None else f"pid {a.pid}"
    rates = [f"{verb} {rate / 1e6:.0f} MB/s" for verb, rate in (("writes", a.write_bps), ("reads", a.read_bps))
             if rate and rate >= 1e6] or ["reads and writes"]
    cpu = f", {a.cpu:.0f} % CPU" if a.cpu is not None else ""
    return f"{who} on {a.node} ({a.command or 'process'}, state {a.state or '?'}{cpu}) {' and '.join(rates)}"


def _activity(a: RankActivity) -> dict[str, object]:
    return {"node": a.node, "pid": a.pid, "rank": a.rank, "command": a.command, "state": a.state,
            "cpu_percent": rounded(a.cpu), "read_bps": a.read_bps, "write_bps": a.write_bps}


def _evidence(c: Claim, job: JobView, t: Settings) -> tuple[dict[str, object], list[str], float]:
    """What both forms show: the waiting GPUs, their power against the working level, the signals used."""
    h = c.hang
    spin = [w for w in h.waiting if w.spun * 2 > w.blocks]
    powers = [m.power for w in spin for m in w.gpu.full_blocks if m.start >= w.since and m.power is not None]
    power = sum(powers) / len(powers) if powers else 0.0
    used = _evidence_used(h, job)
    network = links.silence(job, h.since, t)  # None: no node of the job has figures of its own
    if network is not None and network["silent"]:
        used.append("the network between its nodes silent")
    return ({**c.where, "waiting_gpus": len(h.waiting), "spinning_gpus": len(spin), "spin_power_w": rounded(power),
             "working_power_w": rounded(h.level), "minutes": rounded(c.minutes), "evidence_used": used,
             "fabric": network, "gpus": [w.gpu.key for w in h.waiting], "timeout_minutes": rounded(c.timeout),
             "timeout_from": c.timeout_from, "working_ranks": [_activity(a) for a in c.working]},
            used, power)


def hung(job: JobView, t: Settings) -> list[Finding]:
    """One flag per hung job, the strong claim only (`claim`): naming what broke, or the timeout the
    stall outlasted, and which evidence showed it."""
    c = claim(job, t)
    if c is None or not c.strong:
        return []
    h, where = c.hang, c.where
    evidence, used, power = _evidence(c, job, t)
    acts_on = (c.what if c.basis == "broken part" else
               f"every rank alive, but the GPUs have waited {c.minutes:.0f} min, past the job's collective timeout "
               f"of {c.timeout:g} min ({c.timeout_from})")
    node = where["node"]
    return [Finding("", h.since, {**evidence, "form": "strong", "basis": c.basis, "acts_on": acts_on},
                    f"The job has hung since {h.since:%H:%M}: {acts_on}; {evidence['spinning_gpus']} GPUs wait in a "
                    f"collective (busy by duty cycle at {power:.0f} W, against {h.level:.0f} W when working; evidence: "
                    f"{', '.join(used)}). Cancel it and look at "
                    + (f"node {node}" if where["broken"] == "node" else
                       f"{node}'s hardware (resubmit excluding it: --exclude={node})" if where["broken"] == "gpu" else
                       f"{where['gpu']} and its rank's log")
                    + "; set TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a collective timeout well below the time "
                    "limit (init_process_group(timeout=...)) so a broken rank ends the job, and checkpoint often "
                    "enough that a restart loses little.")]


def stalled(job: JobView, t: Settings) -> list[Finding]:
    """The weak claim: a note that every GPU waits with no part seen broken and the stall not yet past
    the job's collective timeout, naming the ranks that work on the host meanwhile."""
    c = claim(job, t)
    if c is None or c.strong:
        return []
    h = c.hang
    evidence, used, _ = _evidence(c, job, t)
    doing = ("; meanwhile " + "; ".join(map(_words, c.working[:3])) + (" (and more)" if len(c.working) > 3 else "")
             if c.working else "")
    return [Finding("", h.since, {**evidence, "form": "weak",
                                  "hang_at": (h.since + timedelta(minutes=c.timeout)).isoformat()},
                    f"The job's GPUs have waited since {h.since:%H:%M} ({c.minutes:.0f} min) with no part seen broken "
                    f"(every rank alive, every node reporting, no hardware fault){doing}: a checkpoint or another "
                    f"barrier, most likely. It would be a hang only past the job's collective timeout of "
                    f"{c.timeout:g} min ({c.timeout_from}), at {h.since + timedelta(minutes=c.timeout):%H:%M}; "
                    f"nothing is done before. Evidence: {', '.join(used)}. Declare such phases "
                    "(jobpulse.client.phase('checkpoint')) and they are not noted at all.")]


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
         Read("rank_activity", _may_hang), Read("declared_timeout", _may_hang), Read("gpu_ranks", _exited_unnamed))
"""For a job whose GPUs look stuck: its working level since it started (a hang longer than the
look-back), its newest step and its declared phases (work, or a barrier it explains), what its
processes do on the host (working, or exited), the collective timeout it declared, and the ranks
that drove GPUs whose process has gone."""


_THRESHOLDS = ("hang_minutes", "hang_duty_percent", "hang_sm_percent", "hang_traffic_kbs", "hang_power_share",
               "hang_idle_power_share", "idle_share", "hang_phase_minutes", "hang_timeout_minutes",
               "hang_working_io_bps")
RULES = (
    Rule("hung", "job", "code", "critical", "every GPU of the job waits (spinning at near-idle power, or idle) "
         "after a rank or node broke, or longer than the job's collective timeout",
         ("blocks", "last_ts", "reporting", "procs", "rows"), _THRESHOLDS, job_check=hung),
    Rule("stalled", "job", "code", "info", "every GPU of the job waits with no part seen broken, not yet past "
         "its collective timeout (a note: a checkpoint barrier looks the same)",
         ("blocks", "last_ts", "reporting", "procs", "rows"), _THRESHOLDS, job_check=stalled),
)
