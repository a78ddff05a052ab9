"""The library's hang block alone (`scenarios._hangs`: hangs with a broken part, hangs with every rank
alive, checkpoint barriers that resume, and the look-alikes) through the real collector and
`jobpulse rules backtest`, scored against its labels: precision and recall 1.00, every flag on time,
one flag per job, no `hung` on a stall that resumes, a hang with a broken part named within 5 minutes of
its onset and one with every rank alive within 12. Prints each job's flags and their time to flag."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest

from jobpulse.collector.rules.registry import STUCK

from .conftest import RunningCollector
from .scenario_replay import backtest, score, seed, table
from .scenarios import _hangs, library


@pytest.mark.timeout(900)
def test_the_hang_block_is_named_on_time_and_a_barrier_that_resumes_is_a_note(collector: RunningCollector,
                                                                               dsn: str) -> None:
    names = {s.name for s in _hangs()}
    lib = [s for s in library() if s.name in names]
    longest = max(s.duration_s for s in lib)
    t0 = (datetime.now(UTC) - timedelta(seconds=longest + 600)).replace(second=0, microsecond=0)
    started = time.monotonic()
    seed(collector, lib, t0)
    flags = backtest(dsn, t0, t0 + timedelta(seconds=longest + 120))
    sc = score(lib, flags, t0)
    print(f"\nhang block: {len(lib)} jobs, {sum(s.gpus_total for s in lib)} GPUs, "
          f"{time.monotonic() - started:.0f} s to seed and replay")
    print(table(sc))
    by_job: dict[str, list[dict[str, object]]] = defaultdict(list)
    for f in flags:
        by_job[str(f["job_id"])].append(f)
    slow = []
    for s in lib:
        mine = by_job.get(s.job_id, [])
        told = []
        for f in mine:
            kinds: dict[str, str] = f["kind_raised"]  # type: ignore[assignment]
            onset = datetime.fromisoformat(str(f["started_at"]))
            after = {k: (datetime.fromisoformat(v) - onset).total_seconds() / 60 for k, v in kinds.items()}
            told.append(f"{f['rule_id']} ({', '.join(f'{k} {m:.1f} min' for k, m in after.items())} after onset)")
            if "hung" in after:
                broken = f["evidence"]["basis"] == "broken part"  # type: ignore[index]
                if after["hung"] > (5 if broken else 12):
                    slow.append(f"{s.name}: hung {after['hung']:.1f} min after its onset ({f['evidence']['basis']})")  # type: ignore[index]
        print(f"  {s.name:28} {len(mine)} flag(s): {'; '.join(told) or '-'}")
    for p in sc.problems:
        print("  " + p)
    total = sc.total()
    assert total.precision == 1.0 and total.recall == 1.0 and total.late + total.early + total.dup == 0, sc.problems
    assert not slow, slow
    assert all(sum(f["rule_id"] in STUCK for f in v) <= 1 for v in by_job.values()), "one hang flag per job"
    resumed = [s.job_id for s in lib if s.name.startswith("ckpt_barrier")]
    assert resumed and not [f for f in flags if f["job_id"] in resumed and "hung" in f["kinds"]]  # type: ignore[operator]
