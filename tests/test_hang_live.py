"""The hang rules live, where arrival order matters: a node whose agent spools (the collector out of
its reach) delivers minutes late; until then the rules see it silent, but its job's other GPUs keep
working, so neither `node_lost` nor `hung` is raised -- while the same silence with the others
spinning is both, within five minutes. Each cycle runs the real rule path at the time the data had
arrived by (a replay cycle over what is stored so far), after the real ingest."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from jobpulse.collector.rules import backtest
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.tiers import fold
from jobpulse.schema import wire

from .conftest import RunningCollector
from .scenario_replay import _SECTION, CLUSTER, _batches
from .scenarios import Scenario, _spin, place, steady, trained

HELD = range(8, 14)  # minutes of node 1's batches its agent spools, delivered with minute 14's


@pytest.mark.parametrize("dead", [False, True], ids=["late", "dead"])
def test_a_late_node_whose_job_works_on_raises_nothing(collector: RunningCollector, dsn: str, dead: bool) -> None:
    s, = place([Scenario("late_node_2x4", "2 nodes x 4 H100 training; node 1's batches arrive 6 min late",
                         20, [[0, 1, 2, 3], [0, 1, 2, 3]], trained(steady(88)), node_gpus=4,
                         tweak=_spin(HELD.start * 60, 110) if dead else None)],
               job_base=95_500 + dead, pid_base=90_000, prefix=f"late{int(dead)}", shared=("", ""))
    t0 = (datetime.now(UTC) - timedelta(minutes=40)).replace(second=0, microsecond=0)
    gen = s.generate(t0)
    agents = {n: wire.AgentInfo(instance=f"{n}-i1", node=n, cluster=CLUSTER, version="0.1.0",
                                started_at=t0 - timedelta(hours=1)) for n in s.nodes}
    seq = dict.fromkeys(s.nodes, 0)
    spooled: list[tuple[datetime, dict[str, list[Any]]]] = []
    thresholds = Thresholds()
    raised: list[tuple[int, str, str]] = []
    with collector.client() as http, psycopg.connect(dsn) as conn:
        for m in range(s.duration_s // 60):
            per_node: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
            if m == 0:
                for i, node in enumerate(s.nodes):
                    per_node[node]["jobs"].append(s.job_record(i, t0, end=False))
            for _ in range(60):
                for node, rec in next(gen):
                    per_node[node][_SECTION[type(rec)]].append(rec)
            created = t0 + timedelta(minutes=m + 1, seconds=1)
            late = s.nodes[1]
            if m >= HELD.start and (dead or m in HELD):
                spooled.append((created, per_node.pop(late)))
            sends = [(node, created, sections) for node, sections in sorted(per_node.items())]
            if m == HELD.stop and not dead:  # the spool drains, oldest first, before the newest batch
                sends = [(late, at, sections) for at, sections in spooled] + sends
            for node, at, sections in sends:
                for body in _batches(agents[node], seq[node], at, sections):
                    seq[node] += 1
                    r = http.post("/v1/batches", content=body)
                    assert r.status_code == 200, r.text
            fold.run(conn, timedelta(0), begin=False)  # what a leader's fold would have made by now
            now = t0 + timedelta(minutes=m + 1)
            for f in backtest.replay(conn, thresholds, now, now, timedelta(seconds=30), CLUSTER, s.job_id):
                raised.append((m, f.rule_id, f.scope_key))
            conn.rollback()
    if not dead:
        assert raised == [], raised
        return
    first = {rule: m for m, rule, _ in reversed(raised)}
    assert set(first) == {"hung", "node_lost"}, raised  # one of each, nothing per GPU
    assert all(HELD.start < m < HELD.start + 5 for m in first.values()), first  # within 5 min of the onset
