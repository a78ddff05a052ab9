"""The rule registry: every rule by id, in the order they are judged, which verdict wins on a GPU
when several could fire, and what the families ask to read. Code outside the rules names a rule
by the constants below (`HUNG`, `IDLE_GPU`, ...), never by a string of its own."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from jobpulse.collector.rules import allocation, hardware, inputs, placement, stuck, utilization
from jobpulse.collector.rules.model import Read, Rule
from jobpulse.collector.rules.network import links
from jobpulse.collector.store.read.rule_reads import JOB_READS

FAMILIES: tuple[ModuleType, ...] = (utilization, hardware, allocation, placement, stuck, links)
"""The family modules, each declaring its rules in a ``RULES`` tuple and what it needs read beyond
the window in a ``READS`` tuple (none: the window is enough)."""


def _declared(families: Iterable[ModuleType]) -> dict[str, Rule]:
    """Id -> rule in declaration order; an id declared twice is an error, not a silent overwrite."""
    rules: dict[str, Rule] = {}
    for family in families:
        for rule in family.RULES:
            if rule.id in rules:
                raise ValueError(f"rule {rule.id!r} is declared twice ({family.__name__})")
            rules[rule.id] = rule
    return rules


RULES: dict[str, Rule] = _declared(FAMILIES)


def _reads(families: Iterable[ModuleType]) -> tuple[Read, ...]:
    """Every family's reads in family order, each once (two families may ask the same one); a read
    that names neither a reader of its own nor a per-job read of the store is an error."""
    reads: dict[int, Read] = {}
    for family in families:
        for read in getattr(family, "READS", ()):
            if read.query not in (*inputs.READERS, *JOB_READS):
                raise ValueError(f"{family.__name__} asks for {read.query!r}, which nothing reads")
            reads.setdefault(id(read), read)
    return tuple(reads.values())


READS: tuple[Read, ...] = _reads(FAMILIES)
"""What the engine reads after the window, in this order (a later read's ask sees what an earlier
one found)."""

# The ids code outside the rules names (reports, notices, policy, import's survey).
IDLE_GPU, INPUT_BOUND, LOW_UTILIZATION, IMBALANCE, HELD_BACK = (
    RULES[r].id for r in ("idle_gpu", "input_bound", "low_utilization", "imbalance", "held_back"))
OVER_ALLOCATION, HUNG, STALLED, NODE_LOST = (RULES[r].id for r in ("over_allocation", "hung", "stalled", "node_lost"))
XID_ERROR, GPU_LOST, ECC_UNCORRECTABLE = (RULES[r].id for r in ("xid_error", "gpu_lost", "ecc_uncorrectable"))
MEMORY_UNDERUSED, HW_THROTTLING, NO_TENSOR_CORES = (
    RULES[r].id for r in ("memory_underused", "hw_throttling", "no_tensor_cores"))

EXCLUSIVE_GPU_VERDICTS: tuple[str, ...] = ("idle_gpu", "input_bound", "low_utilization")
"""One cause, one verdict: of these, a GPU gets the first that fires. Idle explains a low mean and
stalls; a saturated data pipeline is the cause of a low mean, so it is named instead of it."""

FAULTS: tuple[str, ...] = ("xid_error", "gpu_lost", "ecc_uncorrectable", "node_lost")
"""Hardware faults that break a job: from the fault on, how the job uses its GPUs is the node's
doing, not the code's, so its usage rules are not raised on any of its GPUs."""

USAGE: tuple[str, ...] = tuple(r.id for r in (*utilization.RULES, *allocation.RULES))

EXPLAINS: dict[str, tuple[str, ...]] = {
    "xid_error": ("gpu_lost", "ecc_uncorrectable", "ecc_correctable", "xid_application"),
    "ecc_uncorrectable": ("ecc_correctable",),
    "over_allocation": ("idle_gpu", "imbalance"),
    "idle_gpu": ("imbalance", "no_tensor_cores"),
    "held_back": ("low_utilization", "imbalance"),
    "hung": ("idle_gpu", "input_bound", "low_utilization", "imbalance", "held_back"),
    "stalled": ("idle_gpu", "input_bound", "low_utilization", "imbalance", "held_back"),
    "communication_bound": ("low_utilization", "imbalance"),
    "fabric_degraded": ("imbalance",),
}
"""Precedence on one GPU (its own, or the GPUs its evidence lists as ``gpus``): a finding explains
these others, which are then not raised — the XID before the lost GPU and the ECC counters it
reports, allocation before idleness, idleness before imbalance; a hung job's waiting GPUs are the
hang (one flag naming what broke), not idle, low or imbalanced each; GPUs waiting on a network at its
link's rate are communication-bound, not low; a straggler behind a degraded link is the node's. With `FAULTS` and
`EXCLUSIVE_GPU_VERDICTS`: hardware before allocation before idle before input-bound before low use."""


GPU_USE: tuple[str, ...] = ("idle_gpu", "input_bound", "imbalance", "low_utilization")
"""One cause, how a GPU is used, seen as four kinds, in precedence: a GPU has at most one of them
open at a time, in one cycle and for the life of its job. A condition that worsens or eases
(low use becoming idleness, a straggler whose pipeline turns out saturated) changes the kind of
the flag it already has; the same cause that stops and returns reopens that flag."""


JOB_WIDE: frozenset[str] = frozenset(r.id for r in RULES.values() if r.scope == "gpu" and r.category == "code")
"""The GPU rules whose verdicts become one job-wide flag where they hold on every GPU of a job
(`causes.job_wide`): the code's, whose cause is the job's code; a hardware fault stays each GPU's, the
admins' to find by GPU."""


STUCK: tuple[str, ...] = ("hung", "stalled")
"""One cause, a job whose GPUs all wait, in its two forms (`stuck.claim`): a stall that outlasts its
collective timeout, or whose broken part shows, turns its `stalled` note into the `hung` flag."""


def cause_of(rule_id: str) -> tuple[str, ...]:
    """The rules that share a flag with this one on a place (itself alone for most)."""
    return next((kinds for kinds in (GPU_USE, STUCK) if rule_id in kinds), (rule_id,))


def _check_precedence() -> None:
    """The precedence and what explains what name declared rules; exclusive verdicts judge a GPU."""
    named = {*EXCLUSIVE_GPU_VERDICTS, *FAULTS, *EXPLAINS, *GPU_USE, *STUCK,
             *(r for explained in EXPLAINS.values() for r in explained)}
    if named - set(RULES):
        raise ValueError(f"precedence names rules the registry lacks: {sorted(named - set(RULES))}")
    if not all(RULES[r].gpu_check for r in EXCLUSIVE_GPU_VERDICTS):
        raise ValueError("an exclusive GPU verdict has no GPU check")


_check_precedence()


def ids(category: str | None = None) -> list[str]:
    """Rule ids, optionally of one category (``code`` or ``hardware``)."""
    return [r.id for r in RULES.values() if category is None or r.category == category]
