"""The rule registry: every rule by id, in the order they are judged, and which verdict wins on a
GPU when several could fire. Alerting, docs and tests read rules from here, never by string."""

from __future__ import annotations

from jobpulse.collector.rules import allocation, hardware, placement, utilization
from jobpulse.collector.rules.model import Rule

RULES: dict[str, Rule] = {r.id: r for family in (utilization, hardware, allocation, placement) for r in family.RULES}

EXCLUSIVE_GPU_VERDICTS: tuple[str, ...] = ("idle_gpu", "input_bound", "low_utilization")
"""One cause, one verdict: of these, a GPU gets the first that fires. Idle explains a low mean and
stalls; a GPU waiting for input explains a low mean."""


EXPLAINS: dict[str, tuple[str, ...]] = {
    "xid_error": tuple(r for r, rule in RULES.items() if rule.category == "code" and rule.scope == "gpu"),
    "idle_gpu": ("imbalance", "no_tensor_cores"),
}
"""A finding on a GPU that explains others on the same GPU: a GPU with an XID is the node's fault,
so its utilization is not the code's; an idle GPU is below its peers because it is idle. The
explained ones are not raised."""


def ids(category: str | None = None) -> list[str]:
    """Rule ids, optionally of one category (``code`` or ``hardware``)."""
    return [r.id for r in RULES.values() if category is None or r.category == category]
