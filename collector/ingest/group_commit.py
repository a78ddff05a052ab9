"""Group commit: batches that arrive together are stored in one transaction, each request
answered only after that transaction committed.

A batch costs the database a fixed ~5 ms of round trips, roll-up fold and commit fsync whatever
its size; an agent's batch is small (one second of one node). Waiting a few milliseconds for the
batches other agents send meanwhile turns N of those fixed costs into one. Requests are
validated before they get here, so only a batch the database itself refuses can fail a group:
then its members are stored one by one and only the bad one is answered with the error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from jobpulse.collector.errors import Rejected
from jobpulse.collector.store.database import StoreResult, ValidBatch

Store = Callable[[list[ValidBatch]], Awaitable[list[StoreResult]]]
_LIVE = timedelta(minutes=1)  # a batch made this recently is live (a minute: clocks a little apart, a short outage)
_REPLAY_WAIT_S = 0.005  # the quiet gap after a batch made earlier (a spool replayed one batch at a time)


@dataclass
class _Pending:
    valid: ValidBatch
    done: asyncio.Future[StoreResult] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupCommit:
    """A queue of validated batches and ``writers`` tasks that take turns to take the first waiting
    batch and those that follow it until none comes for ``wait_s`` (at most ``max_batches``, for
    at most ``max_wait_s``) and store them as one group, while the others store theirs."""

    def __init__(self, store: Store, *, wait_s: float, max_wait_s: float, max_batches: int,
                 writers: int = 2, on_group: Callable[[int], None] = lambda n: None,
                 senders: Callable[[], int] | None = None) -> None:
        self._store = store
        self._senders = senders  # clients that could send a batch now (open connections); None: unknown
        self._unanswered = 0  # batches submitted and not yet answered
        self._wait_s = wait_s
        self._max_wait_s = max(wait_s, max_wait_s)
        self._max = max_batches
        self._writers = writers
        self._on_group = on_group
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._gathering = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._write()) for _ in range(self._writers)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def submit(self, valid: ValidBatch) -> StoreResult:
        """Store the batch with whatever arrives beside it; returns after its group committed."""
        pending = _Pending(valid)
        self._unanswered += 1
        pending.done.add_done_callback(self._answered)
        self._queue.put_nowait(pending)
        return await asyncio.shield(pending.done)  # a client that hangs up does not cancel its group

    def _answered(self, _: asyncio.Future[StoreResult]) -> None:
        self._unanswered -= 1

    def _everyone_waits(self) -> bool:
        """Every open connection has a batch waiting for its answer: none can send another (a client
        sends its next batch after the last one's answer), so a longer gather only delays them all."""
        return self._senders is not None and self._unanswered >= self._senders()

    async def _gather(self) -> list[_Pending]:
        """Agents ship on the same tick, but their batches arrive spread over tens to hundreds of milliseconds
        (sampling, compression, the network; a loaded node later): gathering until they stop
        coming, not for a fixed time after the first, stores a tick's batches in one group instead
        of one per ``wait_s`` of the spread, and a group costs both sides a fixed ~1-2 ms of CPU
        (round trips, statement start-up, commit). A lone batch still waits ``wait_s``; a replayed
        one (`_quiet`) 5 ms; none waits once every open connection has a batch waiting
        (`_everyone_waits`: many clients each sending as soon as their last batch is answered, as
        agents catching up after a short outage do, would otherwise idle the whole gap every group)."""
        group = [await self._queue.get()]
        loop = asyncio.get_running_loop()
        end = loop.time() + self._max_wait_s
        while len(group) < self._max:
            left = end - loop.time()
            everyone = self._everyone_waits()
            # (no wait_for on get(): it can lose an item)
            if left > 0 and self._queue.qsize() < self._max - len(group) and not everyone:
                await asyncio.sleep(min(self._quiet(group[-1].valid), left))
            had = len(group)
            while len(group) < self._max and not self._queue.empty():
                group.append(self._queue.get_nowait())
            # a quiet wait (the burst is over), the longest, or no one left who could send
            if len(group) == had or loop.time() >= end or everyone:
                break
        return group

    def _quiet(self, last: ValidBatch) -> float:
        """How long a group waits for more after ``last``: ``wait_s`` after a batch made within the
        last minute, whose node's neighbours ship at the same instant; 5 ms after one made earlier (an
        agent replaying its spool after an outage sends its batches one at a time, each after the last
        one's answer: a long wait would set its pace). Only the last batch counts: a replayed one
        arriving last closes a live group after 5 ms, as every group closed before."""
        fresh = datetime.now(UTC) - last.batch.created_at < _LIVE
        return self._wait_s if fresh else min(self._wait_s, _REPLAY_WAIT_S)

    async def _write(self) -> None:
        while True:
            # One writer gathers at a time, the others write: batches that arrive together (agents
            # ship on the same second) make one group instead of one per writer waiting.
            async with self._gathering:
                group = await self._gather()
            self._on_group(len(group))
            try:
                await self._commit(group)
            except BaseException as exc:  # the requests hear of it; this writer goes on
                for p in group:
                    if not p.done.done():
                        p.done.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise

    async def _commit(self, group: list[_Pending]) -> None:
        try:
            results = await self._store([p.valid for p in group])
        except Rejected:
            if len(group) == 1:
                raise
            for p in group:  # find the one the database refuses; the others are stored
                try:
                    p.done.set_result((await self._store([p.valid]))[0])
                except Rejected as exc:
                    p.done.set_exception(exc)
            return
        for p, result in zip(group, results, strict=True):
            p.done.set_result(result)
