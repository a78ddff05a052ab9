"""The labelled scenario library (tests/scenarios.py, tests/scenarios_holdout.py) without a server:
its expectations name known rules and lie within their jobs, and the two halves the replays take
(`scenario_replay.half`) hold every job once."""

from __future__ import annotations

from ..scenario_replay import half
from ..scenarios import ALL_RULES, Expect, library
from ..scenarios_holdout import holdout


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
