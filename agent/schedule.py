"""Decide which GPUs are due for a sample at each tick: jobs may ask for a faster interval than
the agent's default, and only their GPUs are then sampled faster."""

from __future__ import annotations

import math
from collections.abc import Callable


class Schedule:
    def __init__(self, default_s: float, interval_of_gpu: Callable[[str], float | None],
                 job_intervals: Callable[[], list[float]]) -> None:
        self.default_s = default_s
        self.interval_of_gpu = interval_of_gpu
        self.job_intervals = job_intervals
        self._next_due: dict[str, float] = {}
        self._next_processes = 0.0
        self._tick_at: float | None = None  # the wall-clock time of the tick last booked

    def tick_s(self) -> float:
        """The main loop's period: the default, or faster when a job asked for it."""
        return min([self.default_s, *self.job_intervals()])

    def next_tick(self, wall: float) -> float:
        """Seconds from wall-clock time ``wall`` to the next tick (and that tick booked): ticks fall on
        whole multiples of the period in wall-clock time, so every node samples at the same instants (a
        multi-node job's ranks compare sample by sample, and the collector gets every node's batch at
        once and stores them together). The next tick is the one after the last booked, however long
        sampling took, unless its time has passed: then the next still ahead (no catch-up burst)."""
        tick = self.tick_s()
        k = math.ceil(wall / tick - 1e-6)  # the next grid point ahead (or now)
        if self._tick_at is not None:  # but never the tick just taken again
            k = max(k, math.floor(self._tick_at / tick + 1e-6) + 1)
        self._tick_at = k * tick
        return max(0.0, self._tick_at - wall)

    def gpu_due(self, uuid: str, now: float) -> bool:
        """True (and the next time booked) when the GPU's interval has passed, give or take half a
        tick (a tick that starts a little late or early); a late tick never makes a burst of
        catch-up samples."""
        if now + self.tick_s() / 2 < self._next_due.get(uuid, 0.0):
            return False
        interval = self.interval_of_gpu(uuid) or self.default_s
        self._next_due[uuid] = self._next(self._next_due.get(uuid, now), interval, now)
        return True

    @staticmethod
    def _next(due: float, interval: float, now: float) -> float:
        """On time: one interval after the last due time (no drift); late: one interval from now."""
        return due + interval if due + interval > now else now + interval

    def processes_due(self, now: float) -> bool:
        """Processes are sampled at the default interval whatever the jobs ask."""
        if now + self.tick_s() / 2 < self._next_processes:
            return False
        self._next_processes = self._next(self._next_processes, self.default_s, now)
        return True
