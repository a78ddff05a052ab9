"""Trace capture: a profiler trace of a flagged rank, asked of the job's own in-job client.

Only a process that allowed it (`client.allow_traces()`: its ``trace_ready`` message, from an address
of its own) is ever asked, and only for a capture whose job the agent's own attribution gives it. The
client takes the trace between its `step()` calls and passes the agent the open file (SCM_RIGHTS): the
agent reads what the job's process could read, never a path it names. The trace is summarized here
(`trace_summary`: where the GPU time went) and both leave with the next batch; every failure is an
answer with its reason, and the flag stays as it was.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from jobpulse.agent.capture import bounded
from jobpulse.agent.procfs import ProcFs
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent.capture.trace")
MAX_READ_BYTES = 64 * 2**20  # what is read of a passed trace file at most (the summary's input)
_proc = ProcFs()


@dataclass
class _Client:
    address: Any
    started: int | None  # the process's start time: with the pid, who the process is


def running(pid: int) -> int | None:
    """The process's start time while it runs: with the pid, who it is (None: exited, or a zombie)."""
    stat = _proc.stat(pid)
    return None if stat is None or stat.state in ("Z", "X") else stat.start_ticks


class Tracer:
    """Clients that allowed traces, and the captures waiting on them. ``send(address, bytes)`` reaches a
    client through the event socket."""

    def __init__(self, node: str, job_of_pid: Callable[[int], str | None],
                 send: Callable[[Any, bytes], None]) -> None:
        self.node, self.job_of_pid, self.send, self.started = node, job_of_pid, send, running
        self._clients: dict[int, _Client] = {}
        # capture id -> (answered, the answer, the process asked): only that process may answer
        self._answers: dict[int, tuple[threading.Event, list[tuple[wire.AppEvent, int | None]], int]] = {}
        self._lock = threading.Lock()

    def on_message(self, event: wire.AppEvent, address: Any, fd: int | None) -> None:
        """A client's trace message (the event listener's thread): remembered, or handed to its capture."""
        if event.kind == "trace_ready":
            # (a client without an address of its own cannot be asked anything; one in no job yet says
            # hello again until its job is registered here)
            if address and event.job_id is not None:
                with self._lock:
                    self._clients[event.pid] = _Client(address, self.started(event.pid))
                try:
                    self.send(address, b'{"op": "ready"}')
                except OSError:
                    pass
            return
        ident = event.attrs.get("id")
        with self._lock:
            waiting = self._answers.get(ident) if isinstance(ident, int) else None
            if (waiting is not None and event.kind in ("trace_done", "trace_failed") and event.pid == waiting[2]
                    and not waiting[1]):
                waiting[1].append((event, fd))
                waiting[0].set()
                return
        if fd is not None:
            os.close(fd)

    def run(self, capture: wire.Capture) -> wire.CaptureResult:
        def failed(reason: str) -> wire.CaptureResult:
            return wire.CaptureResult(id=capture.id, job_id=capture.job_id, ok=False, reason=reason[:1024])

        with self._lock:
            chosen = next(((pid, c) for pid in capture.pids if (c := self._clients.get(pid)) is not None
                           and self.job_of_pid(pid) == capture.job_id and c.started == self.started(pid)), None)
        if chosen is None:
            return failed(f"no process of this rank allowed traces on node {self.node} (call "
                          "jobpulse.agent.client.allow_traces() in the training process)")
        pid, client = chosen
        done = threading.Event()
        answers: list[tuple[wire.AppEvent, int | None]] = []
        with self._lock:
            self._answers[capture.id] = (done, answers, pid)
        started = time.monotonic()
        try:
            self.send(client.address, json.dumps({"op": "trace", "id": capture.id,
                                                  "steps": max(1, capture.steps)}).encode())
            done.wait(capture.seconds)
        except OSError as exc:
            with self._lock:
                self._clients.pop(pid, None)
            return failed(f"process {pid} could not be asked for a trace: {exc.strerror or exc}")
        finally:
            with self._lock:  # after this no answer is added: one that came late is still read (or closed)
                self._answers.pop(capture.id, None)
        if not answers:
            gone = self.started(pid) != client.started
            return failed(f"process {pid} exited before its trace was taken" if gone else
                          f"no trace from process {pid} within {capture.seconds:.0f} s (the client takes it over "
                          f"{max(1, capture.steps)} jobpulse step() calls: the process made fewer)")
        event, fd = answers[0]
        if event.kind == "trace_failed":
            return failed(f"process {pid}: {event.attrs.get('reason') or 'no reason given'}")
        if fd is None:
            return failed(f"process {pid} said its trace was taken but passed no file")
        try:
            data = _read(fd)
        except ValueError as exc:
            return failed(f"process {pid}: {exc}")
        finally:
            os.close(fd)
        try:
            summary = summarize(data)
        except bounded.Refused as exc:
            return failed(f"process {pid}'s trace: {exc}")
        kept = len(data) <= capture.max_bytes and data[:2] == b"\x1f\x8b"
        reason = "" if kept else (f"the trace ({len(data) / 2**20:.1f} MiB) is over the collector's "
                                  f"{capture.max_bytes / 2**20:.1f} MiB: its summary is kept, not the trace")
        log.info("trace taken", job=capture.job_id, pid=pid, bytes=len(data), kept=kept)
        return wire.CaptureResult(id=capture.id, job_id=capture.job_id, ok=True, reason=reason,
                                  seconds=min(300.0, round(time.monotonic() - started, 2)), summary=summary,
                                  trace=data if kept else None)


def summarize(data: bytes) -> wire.TraceSummary:
    """The trace's summary, made in a bounded child (`bounded`): a trace that unpacks to a bomb costs
    that child its limits, never the agent's memory or its GPU sampler's time."""
    out = bounded.run("jobpulse.agent.capture.trace_summary", data)
    try:
        return msgspec.json.decode(out, type=wire.TraceSummary)
    except msgspec.DecodeError as exc:
        raise bounded.Refused(f"its summary could not be read: {exc}") from None


def _read(fd: int) -> bytes:
    """A passed file's bytes: a regular file, at most MAX_READ_BYTES (ValueError says why not)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("the file passed is not a regular file")
    if info.st_size > MAX_READ_BYTES:
        raise ValueError(f"the trace file is {info.st_size / 2**20:.0f} MiB, over {MAX_READ_BYTES >> 20} MiB: "
                         "ask for fewer steps")
    chunks, left, offset = [], MAX_READ_BYTES, 0
    while left > 0:
        chunk = os.pread(fd, min(left, 2**20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        left -= len(chunk)
    return b"".join(chunks)
