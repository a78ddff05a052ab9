"""The rule registry: every rule by id, in the order they are judged, and which verdict wins on a
GPU when several could fire. Alerting, docs and tests read rules from here, never by string."""

from __future__ import annotations

from jobpulse.collector.rules import allocation, hardware, placement, utilization
from jobpulse.collector.rules.model import Rule

RULES: dict[str, Rule] = {r.id: r for family in (utilization, hardware, allocation, placement) for r in family.RULES}

EXCLUSIVE_GPU_VERDICTS: tuple[str, ...] = ("idle_gpu", "input_bound", "low_utilization")
"""One cause, one verdict: of these, a GPU gets the first that fires. Idle explains a low mean and
stalls; a GPU waiting for input explains a low mean."""


def ids(category: str | None = None) -> list[str]:
    """Rule ids, optionally of one category (``code`` or ``hardware``)."""
    return [r.id for r in RULES.values() if category is None or r.category == category]
