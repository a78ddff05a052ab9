"""Held-out scenarios: labelled jobs written after the rules were tuned on `scenarios.library`, from
the same documented rule semantics (see that module's docstring) and never used to tune them. Their
scores are reported apart: they say how the rules do on jobs they have not seen."""

from __future__ import annotations

from tests.scenarios import Scenario


def holdout() -> list[Scenario]:
    """Every held-out scenario, with job ids, nodes and PID ranges of their own."""
    lst: list[Scenario] = []
    for k, s in enumerate(lst, start=1):
        s.job_id = str(97_000 + k)
        s.pid_base = 40_000 + 300 * k
        s.nodes = [f"ho{k:02d}{chr(ord('a') + i)}" for i in range(len(s.gpus))]
    return lst
