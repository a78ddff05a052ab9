"""The labelled scenario library's second half (`scenario_replay.half`: the rest of the tuned jobs and
every held-out one) through the real collector and `jobpulse rules backtest`, scored against the
labels with the floor of `test_scenarios.py`; a file of its own so that another worker replays it
beside the first half."""

from __future__ import annotations

import pytest

from .conftest import RunningCollector
from .scenario_replay import half, replay_and_judge


@pytest.mark.timeout(900)  # ~70 jobs through ingest and a replay of every cycle: minutes on 2 cores
def test_scenario_library_second_half_scores_above_the_acceptance_floor(collector: RunningCollector,
                                                                        dsn: str) -> None:
    tuned, held = half(1)
    assert held, "the held-out jobs are judged in this half"
    replay_and_judge(collector, dsn, tuned, held)
