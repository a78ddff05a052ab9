"""A held process row stands only for ticks that fit in time: the store weighs a row by 1 + held.

The agent holds a process's unchanged ticks and sends the run's last one with ``held`` ticks
before it (agent/sources/processes.py): the run lies within one `HOLD_BIN_S` bin and after the
process's previous row, at the agent's process interval. So a row at ``ts`` may stand for at most
``ceil((ts - since) / interval)`` ticks beyond itself, ``since`` the later of its bin's start and
its process's previous row plus one interval (give or take one tick: a tick sampled a little
late). A row over it is refused (422 naming it): a node's token cannot make one row of a process
outweigh the seconds it covered, within a batch or across batches (the newest row time of each
process each node sent is remembered, a bounded number a node; a collector restart forgets them and
the bin bound still holds; a spooled batch replayed late is held to its bin and its own rows).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from datetime import datetime
from typing import Any

from jobpulse.collector.errors import Rejected
from jobpulse.schema import wire
from jobpulse.schema.fields import HOLD_BIN_S

KEPT_PER_NODE = 4096  # processes remembered a node: more than a node runs at once


def _slack(seconds: float, interval: float) -> int:
    """Ticks that fit in ``seconds`` at ``interval``, a tick of slack included."""
    return max(0, math.ceil(seconds / interval - 1e-6))


class HeldBound:
    def __init__(self) -> None:
        self._last: dict[tuple[str, str], OrderedDict[int, datetime]] = {}

    def check(self, batch: wire.Batch) -> None:
        """Raises `Rejected` (422) at the first process row whose ``held`` does not fit its time."""
        rows: list[Any] = batch.process_samples  # a struct made from the field table: typed as Any
        if not any(r.held for r in rows):
            return
        interval = batch.agent.process_interval_s
        last = self._last.get((batch.agent.cluster, batch.agent.node), OrderedDict())
        newest: dict[int, tuple[datetime, datetime | None]] = {}  # per pid: its newest row time, the one before
        for i in sorted(range(len(rows)), key=lambda k: rows[k].ts):
            r = rows[i]
            top, under = newest.get(r.pid) or (last.get(r.pid), None)
            prev = under if top is not None and top >= r.ts else top  # the newest row strictly earlier
            if r.held:
                t = r.ts.timestamp()
                bin_start = t // HOLD_BIN_S * HOLD_BIN_S
                since = bin_start if prev is None else max(bin_start, prev.timestamp() + interval)
                if r.held > _slack(t - since, interval):
                    what = "its bin began" if since == bin_start else f"process {r.pid}'s previous row"
                    raise Rejected(422, f"held {r.held} ticks do not fit in the {max(0.0, t - since):.1f} s since"
                                        f" {what} (at {interval:g} s a tick)", f"$.process_samples[{i}].held")
            if top is None or r.ts > top:
                newest[r.pid] = (r.ts, top)

    def remember(self, batch: wire.Batch) -> None:
        """After the batch is stored: each process's newest row time, for the node's next batches."""
        if not batch.process_samples:
            return
        last = self._last.setdefault((batch.agent.cluster, batch.agent.node), OrderedDict())
        rows: list[Any] = batch.process_samples
        for r in rows:
            if (seen := last.get(r.pid)) is None or r.ts > seen:
                last[r.pid] = r.ts
                last.move_to_end(r.pid)
        while len(last) > KEPT_PER_NODE:
            last.popitem(last=False)
