"""A job cannot shield itself from the hang verdict (and so from the hang policy) with events sent from
outside its ranks (issue 64): steps keep a spinning job from being called hung only when a process
seen on one of its GPUs sends them. The same steps from another process of the job's user on the
node (a loop naming the job, with rank 0's rank) are not its ranks' work: the job stuck in its
all-reduce is called hung. Real ingest, fold and rule path, replayed minute by minute."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
import pytest

from jobpulse.collector.rules import backtest
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.tiers import fold
from jobpulse.schema import wire

from .conftest import RunningCollector
from .scenario_replay import _SECTION, CLUSTER, _batches
from .scenarios import Scenario, _spin, place, steady, trained

OUTSIDE_PID = 4_000_000  # no process of the job's GPUs has it


@pytest.mark.parametrize("sender", ["rank", "outside"])
def test_steps_from_outside_the_ranks_do_not_shield_a_hung_job(collector: RunningCollector, dsn: str,
                                                               sender: str) -> None:
    s, = place([Scenario("shield_1x4", "1 node x 4 A100 without GPM: from 5 min every GPU spins in the all-reduce"
                         " at low power while a step event arrives every 30 s", 24, [[0, 1, 2, 3]],
                         trained(steady(96, 1.5)), node_gpus=4, gpm=False, tweak=_spin(300, 90),
                         app_events=[(t, "step", "train") for t in range(90, 24 * 60, 30)])],
               job_base=96_400 + (sender == "outside"), pid_base=91_000, prefix=f"shield{sender}", shared=("", ""))
    t0 = (datetime.now(UTC) - timedelta(minutes=40)).replace(second=0, microsecond=0)
    gen = s.generate(t0)
    agent = wire.AgentInfo(instance=f"{s.nodes[0]}-shield", node=s.nodes[0], cluster=CLUSTER, version="0.1.0",
                           started_at=t0 - timedelta(hours=1))
    seq, raised = 0, []
    with collector.client() as http, psycopg.connect(dsn) as conn:
        for m in range(s.duration_s // 60):
            sections: dict[str, list[Any]] = defaultdict(list)
            if m == 0:
                sections["jobs"].append(s.job_record(0, t0, end=False))
            for _ in range(60):
                for _node, rec in next(gen):
                    if sender == "outside" and isinstance(rec, wire.AppEvent):
                        rec = msgspec.structs.replace(rec, pid=OUTSIDE_PID)
                    sections[_SECTION[type(rec)]].append(rec)
            for body in _batches(agent, seq, t0 + timedelta(minutes=m + 1, seconds=1), sections):
                seq += 1
                r = http.post("/v1/batches", content=body)
                assert r.status_code == 200, r.text
            fold.run(conn, timedelta(0), begin=False)
            now = t0 + timedelta(minutes=m + 1)
            raised += [(m, f.rule_id) for f in backtest.replay(conn, Thresholds(), now, now, timedelta(seconds=30),
                                                                CLUSTER, s.job_id) if f.rule_id == "hung"]
            conn.rollback()
    if sender == "rank":
        assert raised == [], raised  # its ranks report steps: slow, perhaps, but working
    else:
        assert raised, "steps from a process outside the ranks kept the stuck job from being called hung"
