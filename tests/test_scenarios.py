"""The labelled scenario library (tests/scenarios.py) through the real collector, its first half
(`scenario_replay.half`; the second is `test_scenarios_second_half.py`, so two workers replay them at
once): every job sent over HTTP as its node's agent would send it, `jobpulse rules backtest` over the
stored history, each replayed flag scored against the labels (`scenario_replay`).

Acceptance floor: precision >= 0.95, recall >= 0.95, every expected flag on time (first raised in
[evidence - 90 s, evidence + 120 s]) and no cause flagged twice (two flags with one rule and scope
key on one job); the held-out jobs precision and recall >= 0.94 and no cause twice."""

from __future__ import annotations

import pytest

from .conftest import RunningCollector
from .scenario_replay import half, replay_and_judge
from .scenarios import ALL_RULES, Expect, library
from .scenarios_holdout import holdout


@pytest.mark.timeout(900)  # ~60 jobs through ingest and a replay of every cycle: minutes on 2 cores
def test_scenario_library_scores_above_the_acceptance_floor(collector: RunningCollector, dsn: str) -> None:
    tuned, held = half(0)
    replay_and_judge(collector, dsn, tuned, held)


def test_the_labels_are_well_formed() -> None:
    """Every expectation names a rule, resolves to a concrete key, and lies within its job; names and
    job ids are unique; the two halves hold every job once."""
    lib, held = library(), holdout()
    both = lib + held
    assert len(lib) >= 48
    assert len({s.job_id for s in both}) == len(both) and len({s.name for s in both}) == len(both)
    halves = [s.name for tuned, out in (half(0), half(1)) for s in tuned + out]
    assert sorted(halves) == sorted(s.name for s in both)
    assert all(tuned for tuned, _ in (half(0), half(1))), "each half judges jobs the rules were tuned on"
    for s in both:
        for e in s.expected():
            assert isinstance(e, Expect) and not e.where.startswith("@"), (s.name, e)
            assert 0 <= e.evidence_at_s <= s.duration_s, (s.name, e)
            for rule in e.rule_id.split("|"):
                assert rule in ALL_RULES and rule not in s.forbid, (s.name, e)
