"""The agent's change-only process samples (`ChangeOnly`): what is held, what goes out, and that
every tick is counted (each row stands for 1 + held ticks)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from jobpulse.agent.sources.processes import ChangeOnly
from jobpulse.schema import wire
from jobpulse.schema.fields import HELD_MAX, HOLD_BIN_S

T0 = datetime(2026, 1, 1, tzinfo=UTC)  # starts a bin


def tick(t: int, cpu_percent: float = 50.0, cpu: int = 3, pids: tuple[int, ...] = (10, 11)) -> list[wire.ProcessSample]:
    return [wire.ProcessSample(ts=T0 + timedelta(seconds=t), pid=p, job_id="7", rank=0, cpu_percent=cpu_percent,
                               cpu=cpu, rss_mib=100, runnable=True) for p in pids]


def weight(rows: list[wire.ProcessSample]) -> int:
    return sum(1 + (r.held or 0) for r in rows)


def test_a_steady_node_sends_a_row_a_process_per_bin_and_every_tick_counts() -> None:
    c = ChangeOnly(numa={})
    out = [r for t in range(35) for r in c(tick(t), T0 + timedelta(seconds=t))]
    out += c.flush()
    assert weight(out) == 35 * 2
    assert len(out) == 2 * (1 + 4)  # the first tick, then each bin's held run (the last one at flush)
    for r in out:  # a held run stays in its bin
        first = r.ts - timedelta(seconds=r.held or 0)
        assert int(first.timestamp()) // HOLD_BIN_S == int(r.ts.timestamp()) // HOLD_BIN_S


def test_a_change_goes_out_at_once_after_the_held_run() -> None:
    c = ChangeOnly(numa={0: 0, 1: 0, 2: 1, 3: 1})
    assert len(c(tick(0), T0)) == 2
    assert c(tick(1, cpu_percent=50.9, cpu=2), T0 + timedelta(seconds=1)) == []  # within tolerance, same NUMA node
    assert c(tick(2), T0 + timedelta(seconds=2)) == []
    out = c(tick(3, cpu=0), T0 + timedelta(seconds=3))  # another NUMA node: the run, then the tick
    assert [(r.ts, r.held, r.cpu) for r in out] == [(T0 + timedelta(seconds=2), 1, 3)] * 2 + [
        (T0 + timedelta(seconds=3), None, 0)] * 2
    assert c(tick(4, cpu_percent=52.0, cpu=0), T0 + timedelta(seconds=4))[0].held is None  # beyond tolerance
    assert len(c(tick(5, cpu=0, pids=(10,)), T0 + timedelta(seconds=5))) == 1  # a process left: a change


def test_nothing_held_when_every_tick_changes() -> None:
    c = ChangeOnly(numa={})
    out = [r for t in range(12) for r in c(tick(t, cpu_percent=float(10 * t)), T0 + timedelta(seconds=t))]
    assert len(out) == 24 and all(r.held is None for r in out) and c.flush() == []


def test_a_held_run_keeps_every_byte_and_a_state_change_goes_out() -> None:
    def io(t: int, write: int | None, state: str = "S") -> list[wire.ProcessSample]:
        return [msgspec.structs.replace(s, io_write_bps=write, state=state) for s in tick(t, pids=(10,))]

    c = ChangeOnly(numa={})
    out = c(io(0, 100), T0)
    for t, w in ((1, 1000), (2, 3000), (3, 2000)):  # writing all along: held, whatever the amount
        out += c(io(t, w), T0 + timedelta(seconds=t))
    assert len(out) == 1
    out += c(io(4, 0), T0 + timedelta(seconds=4))  # stopped writing: the run goes out with its mean
    assert [(r.held, r.io_write_bps) for r in out] == [(None, 100), (2, 2000), (None, 0)]
    assert sum(r.io_write_bps * (1 + (r.held or 0)) for r in out) == 100 + 1000 + 3000 + 2000
    out = c(io(5, 0, state="T"), T0 + timedelta(seconds=5))  # SIGSTOP: at once
    assert [(r.held, r.state) for r in out] == [(None, "T")]
    assert c(io(6, None, state="T"), T0 + timedelta(seconds=6))[0].io_write_bps is None  # unreadable: a change


def test_a_run_of_sub_second_ticks_stands_for_at_most_ten() -> None:
    c = ChangeOnly(numa={})
    out = [r for t in range(20) for r in c(tick(0, pids=(10,)), T0 + timedelta(seconds=t / 2))]  # 0.5 s ticks
    out += c.flush()
    assert max(r.held or 0 for r in out) == HELD_MAX and weight(out) == 20
