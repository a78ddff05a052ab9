"""Rules: read and judge in processes of their own, each a share of the jobs.

A rule cycle is mostly Python (each GPU's window built from its blocks, then judged): in one
process it takes one core for over a second at 8,000 GPUs, and in the collector that leads it
holds the interpreter lock the ingest event loop needs. `Judges` starts ``processes`` workers
(spawned, not forked: the collector runs threads and an event loop a fork would copy mid-flight).
Each connects to the database, judges the jobs of its share (a hash of cluster and job,
`inputs.Share`) and keeps their caches cycle after cycle; the leader merges the verdicts and
writes the flags in one transaction as before. A cycle is all or nothing: a worker that fails,
dies or overruns fails the cycle (no flag is closed for want of a verdict), and the next cycle
starts a new worker, which reads its share's whole window once.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from dataclasses import dataclass
from datetime import datetime
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import structlog

from jobpulse.collector.rules import inputs
from jobpulse.collector.rules.engine import Verdicts, verdicts, without_cyclic_gc
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.connect import connect
from jobpulse.collector.store.read import rule_reads

log = structlog.get_logger("jobpulse.rules")


class JudgeFailed(RuntimeError):
    """A worker could not give its share's verdicts this cycle."""


@dataclass(frozen=True)
class _Failed:
    error: str


def _serve(dsn: str, rules_path: Path | None, share: inputs.Share, log_level: str | None,
           pipe: Connection) -> None:
    """A worker: for each cycle time received, its share's verdicts (or why not) sent back."""
    if log_level:
        from jobpulse.schema import logs
        logs.configure(log_level)
    thresholds = Thresholds(rules_path)
    blocks = inputs.Blocks()  # its share's settled blocks and minutes, kept between cycles
    with connect(dsn) as conn, contextlib.closing(blocks):
        while True:
            try:
                now: datetime = pipe.recv()
            except (EOFError, OSError):  # the leader closed its end, or died (a kill may reset the pipe): stop
                return
            try:
                rule_reads.set_up(conn)
                with without_cyclic_gc():
                    found: Verdicts | _Failed = verdicts(conn, thresholds, blocks, now, share)
                conn.rollback()  # read only: no transaction left open between cycles
            except Exception as exc:  # noqa: BLE001 - reported to the leader, which fails the cycle
                found = _Failed(repr(exc)[:500])
            try:
                pipe.send(found)
            except OSError:  # the leader is gone (killed): so is the reason to judge
                return
            if isinstance(found, _Failed):
                return  # the next cycle starts a fresh worker (connection and caches)


class Judges:
    """``processes`` workers, each judging a share of the jobs; started when first needed."""

    def __init__(self, dsn: str, rules_path: Path | None, processes: int, *, timeout_s: float = 300.0,
                 log_level: str | None = None) -> None:
        if processes < 1:
            raise ValueError("rule processes must be 1 or more")
        self._args = (dsn, rules_path)
        self._log_level = log_level
        self._timeout_s = timeout_s
        self._workers: list[tuple[BaseProcess, Connection] | None] = [None] * processes
        self._context = multiprocessing.get_context("spawn")
        self._pending: tuple[list[Connection], float] | None = None  # a cycle sent: its pipes and deadline

    def send(self, now: datetime) -> None:
        """Start a cycle at ``now`` in every worker (a worker not running is started first)."""
        if self._pending is not None:
            raise RuntimeError("a cycle's verdicts were not received")
        self._pending = ([self._running(part) for part in range(len(self._workers))],
                         time.monotonic() + self._timeout_s)
        for pipe in self._pending[0]:
            try:
                pipe.send(now)
            except OSError:  # died since: `receive` finds its pipe closed and says so
                pass

    def receive(self) -> Verdicts:
        """The verdicts of the cycle sent, merged; `JudgeFailed` if any share has none. Every worker's
        answer is taken, so that none is left for the next cycle."""
        if self._pending is None:
            raise RuntimeError("no cycle was sent")
        (pipes, deadline), self._pending = self._pending, None
        found, failures = [], []
        for part, pipe in enumerate(pipes):
            try:
                found.append(self._receive(part, pipe, deadline))
            except JudgeFailed as exc:
                failures.append(str(exc))
        if failures:
            raise JudgeFailed("; ".join(failures))
        return Verdicts({k: v for f in found for k, v in f.jobs.items()}, {},
                        sum(f.gpus for f in found), sum(f.failed for f in found))

    def verdicts(self, now: datetime) -> Verdicts:
        """The jobs' verdicts at ``now`` (the GPUs no job holds are judged by the caller)."""
        self.send(now)
        return self.receive()

    def _running(self, part: int) -> Connection:
        worker = self._workers[part]
        if worker is not None and worker[0].is_alive():
            return worker[1]
        if worker is not None:
            self._stop(part)
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=_serve, name=f"jobpulse-rules-{part}", daemon=True,
                                        args=(*self._args, (part, len(self._workers)), self._log_level, theirs))
        process.start()
        theirs.close()
        self._workers[part] = (process, ours)
        return ours

    def _receive(self, part: int, pipe: Connection, deadline: float) -> Verdicts:
        """One worker's answer; a worker that fails, dies or passes the deadline is stopped."""
        try:
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                raise JudgeFailed(f"rule process {part} gave no verdicts within {self._timeout_s:g} s")
            answer: Verdicts | _Failed = pipe.recv()
        except (EOFError, OSError) as exc:
            self._stop(part)
            raise JudgeFailed(f"rule process {part} ended: {exc!r}") from None
        except JudgeFailed:
            self._stop(part)
            raise
        if isinstance(answer, _Failed):
            self._stop(part)
            raise JudgeFailed(f"rule process {part} failed: {answer.error}")
        return answer

    def _stop(self, part: int) -> None:
        worker, self._workers[part] = self._workers[part], None
        if worker is None:
            return
        process, pipe = worker
        pipe.close()  # a worker waiting for a cycle ends on it
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()

    def close(self) -> None:
        for part in range(len(self._workers)):
            self._stop(part)
