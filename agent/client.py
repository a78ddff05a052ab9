"""jobpulse application events: mark phases, steps and log lines from inside a job.

Standard library only (with the datagram's definition, `jobpulse.schema.event_datagram`, itself
standard library only), so it imports in any training environment::

    from jobpulse.agent import client as jp

    jp.event("data loaded", level="info", files=120)
    with jp.phase("epoch", epoch=3):          # phase_start / phase_end with duration
        for i, batch in enumerate(loader):
            ...
            jp.step(i, samples=len(batch), loss=0.31)   # throughput per rank

A job may also allow jobpulse to ask for evidence when it flags a rank: ``jp.allow_traces()`` in the
training process lets the node agent ask it for a PyTorch profiler trace of a few steps (taken
between ``jp.step()`` calls; see ``allow_traces``).

Sends are non-blocking datagrams to the node agent's socket (``$JOBPULSE_EVENTS_SOCKET``, set
by the task prolog; default ``/run/jobpulse/events.sock``). The agent learns who sent each
message from the kernel (SCM_CREDENTIALS), never from the message: job, step and rank are
its business. If no agent listens, events are dropped and counted (``dropped()``), never
raised, and the check costs almost nothing. A short burst the agent cannot take at once
waits in a bounded buffer. Safe across ``fork`` (DataLoader workers get their own socket).
"""

from __future__ import annotations

import array
import atexit
import collections
import functools
import gzip
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from jobpulse.schema import event_datagram as datagram

DEFAULT_SOCKET = "/run/jobpulse/events.sock"
MAX_MESSAGE_BYTES = datagram.MAX_BYTES
BUFFER_LIMIT = 1000  # messages held while the agent's queue is full
RETRY_DOWN_S = 1.0  # with no agent, look again at most this often
LEVELS = datagram.LEVELS

F = TypeVar("F", bound=Callable[..., Any])


class _Sender:
    """One per process: recreated in a forked child so it never shares the parent's state."""

    def __init__(self) -> None:
        self.path = os.environ.get("JOBPULSE_EVENTS_SOCKET", DEFAULT_SOCKET)
        self.sock: socket.socket | None = None
        self.down_until = 0.0
        self.pending: collections.deque[bytes] = collections.deque()
        self.sent = 0
        self.last_sent = 0.0
        self.dropped = 0
        self.lock = threading.Lock()
        self.last_step: dict[str, tuple[float, int]] = {}
        self.answerable = False  # bound to an address of its own, so the agent can send requests back

    def _socket(self) -> socket.socket | None:
        if self.sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.setblocking(False)
            try:
                if self.answerable:  # an abstract address: nothing on disk, gone with the process
                    s.bind(f"\0jobpulse-client-{os.getpid()}-{os.urandom(4).hex()}")
                s.connect(self.path)
            except OSError:
                s.close()
                return None
            self.sock = s
        return self.sock

    def send(self, build: Callable[[], dict[str, Any]]) -> None:
        now = time.monotonic()
        with self.lock:
            if now < self.down_until:
                self.dropped += 1  # no agent: do not even encode
                return
            data = json.dumps(build(), default=str, separators=(",", ":")).encode("utf-8", "replace")
            if len(data) > MAX_MESSAGE_BYTES:
                self.dropped += 1
                return
            self.pending.append(data)
            self._flush(now)

    def _flush(self, now: float) -> None:
        sock = self._socket()
        while self.pending:
            if sock is None:
                self._gone(now)
                return
            try:
                sock.send(self.pending[0])
            except BlockingIOError:  # the agent's queue is full: keep a bounded backlog
                while len(self.pending) > BUFFER_LIMIT:
                    self.pending.popleft()
                    self.dropped += 1
                return
            except OSError:  # agent stopped or restarted: reconnect next time
                sock.close()
                self.sock = None
                self._gone(now)
                return
            self.pending.popleft()
            self.sent += 1
            self.last_sent = now

    def requests(self) -> list[dict[str, Any]]:
        """What the agent asked of this process since the last look (never blocks)."""
        out: list[dict[str, Any]] = []
        with self.lock:
            while self.sock is not None and len(out) < 8:
                try:
                    msg = json.loads(self.sock.recv(4096))
                except (BlockingIOError, InterruptedError):
                    break
                except (OSError, ValueError):
                    continue
                if isinstance(msg, dict):
                    out.append(msg)
        return out

    def send_file(self, message: dict[str, Any], fd: int, timeout_s: float = 5.0) -> bool:
        """One datagram with an open file passed along (SCM_RIGHTS): the agent reads what this process
        could read, never a path it names."""
        data = json.dumps(message, default=str, separators=(",", ":")).encode()
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                sock = self._socket()
                if sock is None:
                    return False
                try:
                    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
                    return True
                except BlockingIOError:
                    pass
                except OSError:
                    return False
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def _gone(self, now: float) -> None:
        self.dropped += len(self.pending)
        self.pending.clear()
        self.down_until = now + RETRY_DOWN_S


_sender = _Sender()


def _after_fork() -> None:
    global _sender, _traces
    _sender = _Sender()
    _traces = None  # a forked worker is not the process that allowed traces


os.register_at_fork(after_in_child=_after_fork)


def _message(kind: str, message: str, level: str, name: str | None, attrs: dict[str, Any]) -> dict[str, Any]:
    return datagram.build(kind, message, level, name, attrs, time.time())


def event(message: str, level: str = "info", **attrs: Any) -> None:
    """A log-like event on the job's timeline. ``attrs`` must be JSON-serializable (else str())."""
    _sender.send(lambda: _message("log", message, level, None, attrs))


def step(n: int, samples: int | None = None, **metrics: Any) -> None:
    """Step ``n`` done; with ``samples``, the agent's data gets samples/s since the previous step. Where
    traces are allowed, this is also where one starts, counts its steps and ends."""
    if _traces is not None:
        _traces.on_step()
    def build() -> dict[str, Any]:
        now = time.time()
        attrs: dict[str, Any] = {"step": n, **metrics}
        if samples is not None:
            attrs["samples"] = samples
            prev = _sender.last_step.get("step")
            if prev and now > prev[0]:
                attrs["samples_per_s"] = round(samples / (now - prev[0]), 3)
        _sender.last_step["step"] = (now, n)
        return _message("step", f"step {n}", "info", "step", attrs)
    _sender.send(build)


def phase_start(name: str, **attrs: Any) -> None:
    """Mark the start of a phase (for code that cannot wrap it in ``with phase(...)``)."""
    _sender.send(lambda: _message("phase_start", f"{name} started", "info", name, attrs))


def phase_end(name: str, status: str = "ok", **attrs: Any) -> None:
    """Mark the end of a phase; pass ``duration_s`` when known (else the start pairs it)."""
    attrs = {**attrs, "status": status}
    _sender.send(lambda: _message("phase_end", f"{name} {'ended' if status == 'ok' else 'failed'}",
                                  "info" if status == "ok" else "error", name, attrs))


class phase:
    """A named phase: ``phase_start`` on entry, ``phase_end`` with ``duration_s`` and ``status``
    on exit. A context manager and a decorator."""

    def __init__(self, name: str, **attrs: Any) -> None:
        self.name = name
        self.attrs = attrs
        self._started: list[float] = []

    def __enter__(self) -> phase:
        self._started.append(time.monotonic())
        phase_start(self.name, **self.attrs)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        duration = round(time.monotonic() - self._started.pop(), 6)
        if exc_type is None:
            phase_end(self.name, duration_s=duration, **self.attrs)
        else:
            phase_end(self.name, status="error", duration_s=duration, error=f"{exc_type.__name__}: {exc}",
                      **self.attrs)

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with phase(self.name, **self.attrs):
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]


# -- traces asked for by the agent (the job's consent: allow_traces) -------------------------------
class TraceProfiler(Protocol):
    """A profiler the client drives between steps: ``start``, ``step`` at each step's end, then ``stop``
    writing a Chrome trace JSON (Kineto's format; gzip or not) to ``path``."""

    def start(self) -> None: ...

    def step(self) -> None: ...

    def stop(self, path: str) -> None: ...


class TorchProfiler:
    """``torch.profiler`` with CPU and, where there is one, CUDA activity."""

    def __init__(self) -> None:
        self._prof: Any = None

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._prof = profile(activities=activities)
        self._prof.start()

    def step(self) -> None:
        self._prof.step()

    def stop(self, path: str) -> None:
        self._prof.stop()
        self._prof.export_chrome_trace(path)


class _Traces:
    """One trace at a time: asked for by the agent, taken over the next steps, handed over as an open file."""

    HELLO_EVERY_S = 5.0
    LOOK_EVERY_S = 0.25  # how often step() looks for the agent's requests (a syscall): not every step

    def __init__(self, profiler: TraceProfiler) -> None:
        self.profiler = profiler
        self.active: tuple[int, int] | None = None  # (request id, steps left)
        self.heard = False  # the agent took our hello (it knew our job then)
        self.hello_at = 0.0
        self.looked_at = 0.0

    def hello(self) -> None:
        """Say that traces are allowed; again every few seconds until an agent that knows our job says so
        (the agent may start, or restart, after the job's processes)."""
        self.hello_at = time.monotonic()
        _sender.send(lambda: _message("trace_ready", "traces allowed", "info", "trace",
                                      {"profiler": type(self.profiler).__name__}))

    def on_step(self) -> None:
        if self.active is not None:
            ident, left = self.active
            try:
                self.profiler.step()
            except Exception as exc:  # noqa: BLE001 - a profiler's trouble must never break the job
                self._failed(ident, f"the profiler failed: {type(exc).__name__}: {exc}")
                return
            if left > 1:
                self.active = (ident, left - 1)
            else:
                self._finish(ident)
            return
        now = time.monotonic()
        if now - self.looked_at < self.LOOK_EVERY_S:
            return
        self.looked_at = now
        for req in _sender.requests():
            asked, count = req.get("id"), req.get("steps")
            if req.get("op") == "ready":
                self.heard = True
            elif req.get("op") == "trace" and isinstance(asked, int) and isinstance(count, int) and count >= 1:
                self.heard = True
                self._start(asked, min(count, 100))
                return
        if not self.heard and now - self.hello_at > self.HELLO_EVERY_S:
            self.hello()

    def _start(self, ident: int, steps: int) -> None:
        try:
            self.profiler.start()
        except Exception as exc:  # noqa: BLE001 - e.g. no torch in this environment
            self._failed(ident, f"no profiler in this process: {type(exc).__name__}: {exc}")
            return
        self.active = (ident, steps)
        _sender.send(lambda: _message("trace_started", f"trace of {steps} steps started", "info", "trace",
                                      {"id": ident, "steps": steps}))

    def _finish(self, ident: int) -> None:
        self.active = None
        fd, path = tempfile.mkstemp(prefix="jobpulse-trace-", suffix=".json")
        os.close(fd)
        try:
            self.profiler.stop(path)
        except Exception as exc:  # noqa: BLE001
            os.unlink(path)
            self._failed(ident, f"the profiler failed: {type(exc).__name__}: {exc}")
            return
        threading.Thread(target=self._hand_over, args=(ident, path), name="jobpulse-trace", daemon=True).start()

    def _hand_over(self, ident: int, path: str) -> None:
        """Compress (off the training thread), then pass the agent the open file; nothing stays on disk."""
        try:
            with open(path, "rb") as raw, tempfile.TemporaryFile(prefix="jobpulse-trace-") as packed:
                if raw.read(2) == b"\x1f\x8b":
                    raw.seek(0)
                    shutil.copyfileobj(raw, packed)
                else:
                    raw.seek(0)
                    with gzip.GzipFile(fileobj=packed, mode="wb", compresslevel=6) as gz:
                        shutil.copyfileobj(raw, gz)
                packed.flush()
                packed.seek(0)
                size = os.fstat(packed.fileno()).st_size
                message = _message("trace_done", f"trace taken ({size} bytes)", "info", "trace",
                                   {"id": ident, "bytes": size})
                if not _sender.send_file(message, packed.fileno()):
                    _sender.dropped += 1
        except OSError as exc:
            self._failed(ident, f"could not write the trace: {exc}")
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass

    def _failed(self, ident: int, reason: str) -> None:
        self.active = None
        _sender.send(lambda: _message("trace_failed", "trace not taken", "warning", "trace",
                                      {"id": ident, "reason": reason[:1000]}))


_traces: _Traces | None = None


def allow_traces(profiler: TraceProfiler | None = None) -> None:
    """Allow jobpulse to ask this process for a profiler trace of a few steps when it flags this rank
    (at most one per flag; taken between ``step()`` calls, handed to the node agent, kept for the job's
    owner and the admins). Call it in each rank's training process. ``profiler``: torch.profiler by
    default; any object with ``start``, ``step`` and ``stop(path)`` for other frameworks."""
    global _traces
    _traces = _Traces(profiler or TorchProfiler())
    with _sender.lock:
        _sender.answerable = True
        if _sender.sock is not None:  # re-open with an address of its own
            _sender.sock.close()
            _sender.sock = None
        _sender.down_until = 0.0
    _traces.hello()


def flush(timeout_s: float = 1.0) -> None:
    """Hand buffered events to the agent, waiting up to ``timeout_s``; what is left is dropped
    (and counted). Runs at interpreter exit."""
    deadline = time.monotonic() + timeout_s
    while True:
        with _sender.lock:
            _sender._flush(time.monotonic())
            if not _sender.pending:
                return
            if time.monotonic() >= deadline:
                _sender.dropped += len(_sender.pending)
                _sender.pending.clear()
                return
        time.sleep(0.005)


SYNC_WAIT_S = 2.0


def sync(timeout_s: float = SYNC_WAIT_S) -> bool:
    """Wait until the agent has taken every event this process sent (True), at most ``timeout_s``.
    The agent learns a sender's job from /proc/PID, which vanishes when the process exits: a
    short-lived sender (`jobpulse-agent emit` in a script) must outlive its events' attribution, and
    a fixed wait is too short on a loaded node. An empty datagram, from an address of its own so the
    agent can answer, queues behind this process's events; the agent answers it once it got there."""
    deadline = time.monotonic() + timeout_s
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind(f"\0jobpulse-sync-{os.getpid()}-{os.urandom(4).hex()}")
        s.connect(_sender.path)
        s.settimeout(timeout_s)
        s.send(b"")
        s.settimeout(max(0.001, deadline - time.monotonic()))
        return json.loads(s.recv(256)).get("op") == "synced"
    except (OSError, ValueError, AttributeError):  # no agent, one that never answered, or garbage
        return False
    finally:
        s.close()


def _at_exit() -> None:
    """Flush, then, after a recent send, wait for the agent to take it (`sync`)."""
    flush(0.5)
    if _sender.sent and time.monotonic() - _sender.last_sent < 60:
        sync()


atexit.register(_at_exit)


def dropped() -> int:
    """Events this process could not hand to the agent (none listening, queue full, too large)."""
    return _sender.dropped


def sent() -> int:
    return _sender.sent


class Handler(logging.Handler):
    """A stdlib logging handler: ``logging.getLogger().addHandler(jp.Handler())``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = record.levelname.lower()
            attrs = {"logger": record.name}
            if record.exc_info:
                attrs["exception"] = self.format(record).splitlines()[-1]
            event(record.getMessage(), level="warning" if level == "warn" else level, **attrs)
        except Exception:  # noqa: BLE001 - logging must never break the job
            self.handleError(record)


def structlog_processor(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """A structlog processor that also sends each log event: add it before the renderer."""
    fields = {k: v for k, v in event_dict.items() if k not in ("event", "level", "timestamp")}
    event(str(event_dict.get("event", "")), level=str(event_dict.get("level", method_name)), **fields)
    return event_dict


# -- training-framework callbacks (each imports its framework only when asked for) -----------------
class _TrainingHooks:
    """Framework-neutral behaviour shared by the callbacks below."""

    _epoch_phase: phase | None = None

    def _epoch_start(self, epoch: int) -> None:
        self._epoch_phase = phase("epoch", epoch=epoch)
        self._epoch_phase.__enter__()

    def _epoch_end(self, **metrics: Any) -> None:
        if self._epoch_phase is not None:
            self._epoch_phase.attrs.update({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))})
            self._epoch_phase.__exit__(None, None, None)
            self._epoch_phase = None

    def _step(self, n: int, samples: int | None = None, **metrics: Any) -> None:
        step(n, samples=samples, **{k: float(v) for k, v in metrics.items() if _is_number(v)})


def _is_number(v: Any) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def lightning_callback(batch_size: int | None = None) -> Any:
    """A PyTorch Lightning callback: epochs as phases, every training batch as a step."""
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback

    class JobpulseLightning(_TrainingHooks, Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self._epoch_start(int(trainer.current_epoch))

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self._epoch_end(**{k: float(v) for k, v in trainer.callback_metrics.items() if _is_number(v)})

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self._step(int(trainer.global_step), samples=batch_size)

    return JobpulseLightning()


def keras_callback(batch_size: int | None = None) -> Any:
    """A Keras callback: epochs as phases, every training batch as a step (with its logs)."""
    import keras

    class JobpulseKeras(_TrainingHooks, keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._epoch_start(epoch)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._epoch_end(**(logs or {}))

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._step(batch, samples=batch_size, **(logs or {}))

    return JobpulseKeras()


def huggingface_callback(batch_size: int | None = None) -> Any:
    """A Hugging Face ``TrainerCallback``: epochs as phases, optimizer steps, logs as events."""
    from transformers import TrainerCallback

    class JobpulseHF(_TrainingHooks, TrainerCallback):
        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._epoch_start(int(state.epoch or 0))

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._epoch_end()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._step(int(state.global_step), samples=batch_size)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            event("trainer log", **{k: v for k, v in (logs or {}).items() if _is_number(v)})

    return JobpulseHF()
