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


@pytest.mark.timeout(900)  # ~60 jobs through ingest and a replay of every cycle: minutes on 2 cores
def test_scenario_library_scores_above_the_acceptance_floor(collector: RunningCollector, dsn: str) -> None:
    tuned, held = half(0)
    replay_and_judge(collector, dsn, tuned, held)
