"""Application events: a Unix datagram socket that knows who is talking.

Each datagram arrives with the sender's PID and UID as the kernel saw them (SO_PASSCRED ->
SCM_CREDENTIALS, the per-message form of SO_PEERCRED: a forked DataLoader worker is
reported as itself, not as the parent that opened the socket). Job, step and rank come from
attributing that PID, whatever the message claims; a sender in no job is filed node-level
(job NULL). Datagrams are size-limited, each PID and each user is rate-limited (token buckets), and
what is refused is counted and reported with the next batch. Each event goes out with what it costs
in memory (its datagram, its parsed attributes, its record), so every bound on events (those waiting
for their job, those read at once, a batch's budget) is a bound on the agent's memory.
"""

from __future__ import annotations

import array
import contextlib
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import structlog

from jobpulse.agent.attribution import Attributor, Owner
from jobpulse.schema import event_datagram, wire

log = structlog.get_logger("jobpulse.agent.sources.app_events")
MAX_DATAGRAM = 65_536
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_CMSG_SIZE = socket.CMSG_SPACE(_CREDS.size) + socket.CMSG_SPACE(struct.calcsize("i"))  # and one passed file
SYNCED = b'{"op":"synced"}'  # the answer to a client's `sync` (`jobpulse.agent.client.sync`)
TRACE_KINDS = ("trace_ready", "trace_started", "trace_done", "trace_failed")
OnTrace = Callable[[wire.AppEvent, Any, "int | None"], None]
_MAX_SKEW = timedelta(minutes=5)
HOLD_S = 60.0  # how long an event waits for its sender's job to register before it goes node-level
HOLD_BYTES = 4 * 1024 * 1024  # events held at once, by their cost in memory (beyond: the oldest go node-level)
HOLD_USER_BYTES = 1024 * 1024  # one user's share: past it, that user's events go node-level at once
READ_BYTES = 4 * 1024 * 1024  # datagrams read at once, and events handed on at once, by cost
_OVERHEAD = 512  # bytes an event's record and fixed fields hold besides its datagram and attributes


class TokenBucket:
    """Per-PID rate limit: ``rate`` events per second with bursts up to ``burst``."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = rate, burst
        self._state: dict[int, tuple[float, float]] = {}

    def allow(self, pid: int, now: float) -> bool:
        tokens, last = self._state.get(pid, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens < 1.0:
            self._state[pid] = (tokens, now)
            return False
        self._state[pid] = (tokens - 1.0, now)
        return True

    def forget_idle(self, now: float) -> None:
        """Drop PIDs whose bucket is full again (keeps the table small)."""
        full = [pid for pid, (tokens, last) in self._state.items()
                if tokens + (now - last) * self.rate >= self.burst]
        for pid in full:
            del self._state[pid]


def _timestamp(value: float | None, received: datetime) -> tuple[datetime, bool]:
    """The sender's time when it is plausible, else the receipt time (and say so)."""
    if value is not None:
        try:
            ts = datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return received, False
        if abs(ts - received) <= _MAX_SKEW:
            return ts, True
    return received, False


class EventListener(threading.Thread):
    def __init__(self, path: Path, attributor: Attributor, emit: Callable[[list[tuple[wire.AppEvent, int]]], None],
                 drop: Callable[[str, int], None], rate: float = 200.0, burst: float = 2000.0,
                 on_trace: OnTrace | None = None) -> None:
        super().__init__(name="app-events", daemon=True)
        self.on_trace = on_trace  # trace messages, with the sender's address and a file it passed (its to close)
        self.path = Path(path)
        self.attributor = attributor
        self.emit = emit
        self.drop = drop
        self.limiter = TokenBucket(rate, burst)
        self.user_limiter = TokenBucket(rate * 5, burst * 2)  # one user's many processes together
        self.stopping = threading.Event()
        self.received = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o666)  # every job may send; the kernel tells us who did
        self.sock.setblocking(False)  # waits happen in poll(); reads drain the queue
        self._wake_r, self._wake_w = os.pipe()  # close() and retry_unowned() write here: no timeout needed
        os.set_blocking(self._wake_w, False)
        self.held: list[tuple[float, wire.AppEvent, int, Owner]] = []  # (since, event, size, claimed job)
        self.held_by_uid: dict[int | None, int] = {}  # bytes held per sender's user

    def run(self) -> None:
        last_cleanup = time.monotonic()
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self.stopping.is_set():
            try:  # no timeout unless events wait for their job: an idle agent stays asleep
                woke = poller.poll(1000 if self.held else None)
                if any(fd == self._wake_r for fd, _ in woke):
                    os.read(self._wake_r, 4096)
                drained = self._drain() if woke else []
            except OSError as exc:
                if self.stopping.is_set():
                    break
                log.warning("event socket error", error=str(exc))
                continue
            now = time.monotonic()
            if now - last_cleanup > 10:
                self.limiter.forget_idle(now)
                self.user_limiter.forget_idle(now)
                last_cleanup = now
            records = self._released(now)
            self._emit(records)
            records, pending = [], 0
            for m in drained:  # each on its own: one bad message never leaves the others (or their files) behind
                try:
                    got = self._accept(m, now)
                except Exception:  # the listener must outlive any one bad message
                    log.exception("event handling failed")
                    self.drop("internal_error", 1)
                    continue
                if got is not None:
                    record, size, claim = got
                    if claim is None or self.held_by_uid.get(claim.uid, 0) + size > HOLD_USER_BYTES:
                        records.append((record, size))  # a user's share of the wait is bounded: node-level
                        pending += size
                        if pending >= READ_BYTES:  # handed on as they come: what is parsed at once is bounded
                            self._emit(records)
                            records, pending = [], 0
                    else:
                        self.held.append((now, record, size, claim))
                        self.held_by_uid[claim.uid] = self.held_by_uid.get(claim.uid, 0) + size
            self._emit(records)
        self._emit(self._released(float("inf")))  # stopping: whatever still waits goes as it came

    def retry_unowned(self) -> None:
        """A job registered: events held for it (`_released`) go at once."""
        if self.stopping.is_set():  # closing: what waits goes out as it came
            return
        with contextlib.suppress(OSError):  # a full pipe wakes the loop already
            os.write(self._wake_w, b"r")

    def _released(self, now: float) -> list[tuple[wire.AppEvent, int]]:
        """Held events of senders whose job was not registered when they came (its prolog's registration
        can reach the agent after the job's first events, its sender be gone by then): with the job's
        fields once it registered to the sender's user, as they came (node-level) after HOLD_S or past
        HOLD_BYTES. Nothing is dropped."""
        out: list[tuple[wire.AppEvent, int]] = []
        keep: list[tuple[float, wire.AppEvent, int, Owner]] = []
        over = sum(size for _, _, size, _ in self.held) - HOLD_BYTES  # beyond: the oldest go first
        for since, record, size, claim in self.held:
            if self.attributor.confirm(claim):
                out.append((msgspec.structs.replace(record, job_id=claim.job_id, step=claim.step, rank=claim.rank,
                                                    local_rank=claim.local_rank), size))
            elif now - since >= HOLD_S or over > 0:
                out.append((record, size))
            else:
                keep.append((since, record, size, claim))
                continue
            over -= size
            self.held_by_uid[claim.uid] -= size
            if not self.held_by_uid[claim.uid]:
                del self.held_by_uid[claim.uid]
        self.held = keep
        return out

    def _emit(self, records: list[tuple[wire.AppEvent, int]]) -> None:
        if not records:
            return
        try:
            self.emit(records)
        except Exception:
            log.exception("event handling failed")
            self.drop("internal_error", len(records))

    def _drain(self) -> list[tuple[bytes, list[Any], int, Any]]:
        """What is queued on the socket, read at once up to READ_BYTES (the rest on the next pass)."""
        got: list[tuple[bytes, list[Any], int, Any]] = []
        read = 0
        while len(got) < 512 and read < READ_BYTES:
            try:
                got.append(self.sock.recvmsg(MAX_DATAGRAM, _CMSG_SIZE))
            except (BlockingIOError, InterruptedError):
                break
            read += len(got[-1][0]) + _OVERHEAD
        return got

    def _accept(self, msg: tuple[bytes, list[Any], int, Any],
                now: float) -> tuple[wire.AppEvent, int, Owner | None] | None:
        data, ancdata, flags, address = msg
        fds = [fd for level, kind, d in ancdata if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for fd in array.array("i", d[:len(d) - len(d) % 4])]
        try:
            if not data:  # a client's `sync`: the datagrams it sent before are taken, say so
                self._synced(ancdata, address, now)
                return None
            got = self._event(data, ancdata, flags, now)
            if got is not None and got[0].kind in TRACE_KINDS and self.on_trace is not None:
                passed = fds.pop(0) if fds and got[0].kind == "trace_done" else None
                try:
                    self.on_trace(got[0], address, passed)
                except BaseException:
                    if passed is not None:
                        os.close(passed)
                    raise
            return got
        finally:
            for fd in fds:  # a file nobody asked for is never kept open
                os.close(fd)

    def _synced(self, ancdata: list[Any], address: Any, now: float) -> None:
        """Answer a sync: only to an abstract address (no path a sender could point elsewhere), within its
        user's rate, from a socket of its own that lives for this one datagram, so answers a sender never
        reads cannot fill the event socket's send buffer (which carries trace requests)."""
        creds = next((_CREDS.unpack(d[:_CREDS.size]) for level, kind, d in ancdata
                      if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), None)
        if not (isinstance(address, bytes) and address[:1] == b"\0" and creds is not None
                and self.user_limiter.allow(creds[1], now)):
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as answer, contextlib.suppress(OSError):
            answer.setblocking(False)
            answer.sendto(SYNCED, address)

    def send_to(self, address: Any, data: bytes) -> None:
        """A request to a client that gave itself an address (OSError when it is gone)."""
        self.sock.sendto(data, address)

    def _event(self, data: bytes, ancdata: list[Any], flags: int,
               now: float) -> tuple[wire.AppEvent, int, Owner | None] | None:
        self.received += 1
        creds = next((_CREDS.unpack(d[:_CREDS.size]) for level, kind, d in ancdata
                      if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), None)
        if creds is None:
            self.drop("no_credentials", 1)
            return None
        if flags & socket.MSG_TRUNC:
            self.drop("too_large", 1)
            return None
        pid, uid, _ = creds
        if not (self.limiter.allow(pid, now) and self.user_limiter.allow(uid, now)):
            self.drop("rate_limited", 1)
            return None
        parsed = self.parse(data, pid, uid, datetime.now(UTC))
        if parsed is None:
            self.drop("malformed", 1)
            return None
        return parsed

    def parse(self, data: bytes, pid: int, uid: int,
              received: datetime) -> tuple[wire.AppEvent, int, Owner | None] | None:
        """A datagram as the event of the process that sent it (job, step, rank from /proc), with what it
        costs in memory, and for a sender whose job is not registered here yet, the job it names
        (`Attributor.claim`)."""
        try:
            msg = event_datagram.parse(data)
        except ValueError:
            return None
        ts, sender_time = _timestamp(msg.ts, received)
        attrs = msg.attrs if sender_time else {**msg.attrs, "sender_ts": msg.ts}
        owner = self.attributor.owner(pid)
        claim = None if owner else self.attributor.claim(pid, uid)
        try:
            return msgspec.convert({
                "ts": ts, "pid": pid, "uid": uid, "level": msg.level, "kind": msg.kind,
                "job_id": owner.job_id if owner else None, "step": owner.step if owner else None,
                "rank": owner.rank if owner else None, "local_rank": owner.local_rank if owner else None,
                "name": msg.name, "message": msg.message, "attrs": attrs}, wire.AppEvent,
                from_attributes=False), len(data) + msg.cost + _OVERHEAD, claim
        except msgspec.ValidationError:
            return None

    def close(self) -> None:
        self.stopping.set()
        with contextlib.suppress(BlockingIOError):  # full: the loop is awake anyway
            os.write(self._wake_w, b"x")
        self.join(timeout=2)
        self.sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.path.unlink(missing_ok=True)
