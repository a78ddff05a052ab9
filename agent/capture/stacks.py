"""Capture: the Python stacks of a flagged rank, sampled for a few seconds when the collector asks.

The collector asks in its answer to a batch (`wire.Capture`: the rank's main process, then its
data-loader workers); the answer (`wire.CaptureResult`) leaves with a later batch. Sampling is
py-spy's (`py-spy record --nonblocking`: the process is read, never paused), one process per py-spy,
all at once, one capture at a time. Only processes of the job the request names are sampled (the
agent's own attribution decides, not the request), and every failure — py-spy missing, a process
that is not Python or that exits meanwhile — is an answer with its reason, never silence.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import structlog

from jobpulse.agent.capture.trace import Tracer
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent.capture.stacks")
RATE_HZ = 50
TOP_PER_ROLE = 5
MIN_SHARE = 0.05  # call paths below this share of a role's samples are left out
QUEUE = 4  # captures waiting on one node; more are answered "too many waiting"
MAX_RAW_BYTES = 4 * 1024 * 1024
_encoder = msgspec.json.Encoder()
_result = msgspec.json.Decoder(wire.CaptureResult)


def py_spy() -> str | None:
    """The py-spy binary: beside this Python (the agent's virtual environment), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def parse_raw(text: str) -> Counter[tuple[str, ...]]:
    """py-spy's raw output (one ``frame;frame;...;leaf COUNT`` per line, caller first) as counts per stack."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def top_paths(role: wire.Role, stacks: Counter[tuple[str, ...]]) -> list[wire.StackShare]:
    """The heaviest call paths of one role: each stack by its leaf and the leaf's caller."""
    total = sum(stacks.values())
    paths: Counter[str] = Counter()
    for stack, n in stacks.items():
        paths[" > ".join(stack[-2:])] += n
    return [wire.StackShare(role=role, frames=path[:2048], share=round(n / total, 3))
            for path, n in paths.most_common(TOP_PER_ROLE) if total and n / total >= MIN_SHARE]


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, who the process is."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _head(path: Path) -> str:
    """py-spy's output, at most MAX_RAW_BYTES of it (a job's stack names cannot swell the agent)."""
    with path.open("rb") as f:
        return f.read(MAX_RAW_BYTES).decode(errors="replace")


def _alive(pid: int, settle_s: float = 0.0) -> bool:
    """Not exited (nor a zombie). ``settle_s``: how long to let an exit finish, when py-spy ended
    early because it saw its process go: the kernel frees a process's memory before it shows it dead."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        except (OSError, IndexError):
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)


def _why(pid: int, stderr: str, alive: bool) -> str:
    text = stderr.lower()
    if not alive or "no such process" in text:
        return f"process {pid} exited during the capture"
    if "python version" in text or "python interpreter" in text or "failed to find python" in text:
        return f"process {pid} is not a Python process: py-spy reads Python stacks only"
    if "permission" in text or "operation not permitted" in text:
        return f"not allowed to read process {pid} (the agent needs root, or ptrace is restricted on this node)"
    return f"process {pid}: py-spy failed: {stderr.strip()[-300:] or 'no message'}"


class Capturer:
    """Runs captures one at a time per kind (stacks; traces, which wait on the job's steps), each kind on
    a thread of its own; answers go to ``answer``. ``allowed(job)`` is the agent's own say: the node's
    switch (`--no-capture`) and the job's `capture=off`."""

    def __init__(self, node: str, job_of_pid: Callable[[int], str | None],
                 answer: Callable[[wire.CaptureResult], None], allowed: Callable[[str], str | None] = lambda _: None,
                 binary: str | None = None, tracer: Tracer | None = None) -> None:
        self.node, self.job_of_pid, self.answer, self.refusal = node, job_of_pid, answer, allowed
        self.binary = binary if binary is not None else py_spy()
        self.tracer = tracer
        self._queues: dict[str, queue.Queue[wire.Capture]] = {}
        self._lock = threading.Lock()

    def submit(self, asked: list[wire.Capture]) -> None:
        for capture in asked:
            with self._lock:
                waiting = self._queues.get(capture.kind)
                if waiting is None:
                    waiting = self._queues[capture.kind] = queue.Queue(maxsize=QUEUE)
                    threading.Thread(target=self._loop, args=(waiting,), name=f"capture-{capture.kind}",
                                     daemon=True).start()
            try:
                waiting.put_nowait(capture)
            except queue.Full:
                self.answer(wire.CaptureResult(id=capture.id, job_id=capture.job_id, ok=False,
                                               reason=f"node {self.node} has too many captures waiting"))

    def _loop(self, waiting: queue.Queue[wire.Capture]) -> None:
        while True:
            capture = waiting.get()
            try:
                result = self.run(capture)
                _result.decode(_encoder.encode(result))  # what the batch would refuse, refused here, with why
            except Exception as exc:  # a capture that fails must still be answered
                log.exception("capture failed")
                result = wire.CaptureResult(id=capture.id, job_id=capture.job_id, ok=False,
                                            reason=f"the capture failed on node {self.node}: {exc}"[:1024])
            self.answer(result)

    def run(self, capture: wire.Capture) -> wire.CaptureResult:
        """Sample the asked processes that belong to the job, all at once, and summarize (or, for a
        trace, ask the rank's client for one)."""
        def failed(reason: str) -> wire.CaptureResult:
            return wire.CaptureResult(id=capture.id, job_id=capture.job_id, ok=False, reason=reason[:1024])

        refused = self.refusal(capture.job_id)
        if refused:
            return failed(refused)
        if capture.kind == "trace":
            if self.tracer is None:
                return failed(f"node {self.node} takes no traces (its agent has no event socket)")
            return self.tracer.run(capture)
        if self.binary is None:
            return failed(f"py-spy is not installed on node {self.node} (pip install py-spy into the agent's "
                          "environment)")
        mine = {pid: start_time(pid) for pid in capture.pids if self.job_of_pid(pid) == capture.job_id}
        if not mine:
            return failed(f"none of the processes {capture.pids} belongs to job {capture.job_id} on node {self.node}")
        started = time.monotonic()
        stacks: dict[wire.Role, Counter[tuple[str, ...]]] = {"main": Counter(), "workers": Counter()}
        problems = []
        with tempfile.TemporaryDirectory(prefix="jobpulse-capture-") as tmp:
            runs: dict[int, subprocess.Popen[str]] = {}
            try:
                for pid in mine:
                    runs[pid] = subprocess.Popen(
                        [self.binary, "record", "--pid", str(pid), "--duration", str(max(1, round(capture.seconds))),
                         "--rate", str(RATE_HZ), "--format", "raw", "--nolineno", "--nonblocking",
                         "--output", str(Path(tmp) / f"{pid}.raw")],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                deadline = started + capture.seconds + 20  # one deadline for all of them
                for pid, proc in runs.items():
                    try:
                        _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        err = f"py-spy did not finish within {capture.seconds + 20:.0f} s"
                    now = start_time(pid)
                    reused = now is not None and now != mine[pid]  # another process under the pid: not the job's
                    early = time.monotonic() - started < capture.seconds - 0.5  # py-spy stopped before its time
                    alive = not reused and _alive(pid, settle_s=1.0 if early else 0.0)
                    out = Path(tmp) / f"{pid}.raw"
                    got = parse_raw(_head(out)) if not reused and out.exists() else Counter()
                    if reused:
                        problems.append(f"process {pid} exited and its pid was taken by another: not sampled")
                    elif not alive or (not got and proc.returncode != 0):  # (alive and idle has none: no problem)
                        problems.append(_why(pid, err or "", alive))
                    stacks["main" if pid == capture.pids[0] else "workers"].update(got)
            finally:
                for proc in runs.values():  # none outlives its capture
                    if proc.poll() is None:
                        proc.kill()
                    try:
                        proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        log.error("py-spy did not exit after SIGKILL", pid=proc.pid)
        seconds = min(120.0, round(time.monotonic() - started, 2))
        samples = {role: sum(s.values()) for role, s in stacks.items()}
        top = [share for role, s in stacks.items() for share in top_paths(role, s)]
        reason = "; ".join(problems)[:1024]
        if not any(samples.values()):
            return failed(reason or "no stacks sampled (the processes ran no Python code meanwhile)")
        log.info("capture done", job=capture.job_id, pids=list(mine), seconds=seconds, samples=samples)
        return wire.CaptureResult(id=capture.id, job_id=capture.job_id, ok=True, seconds=seconds,
                                  samples=samples, top=top[:24], reason=reason)
