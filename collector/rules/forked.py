"""Work done in a forked child beside this process, with this process as its fallback.

A rule cycle's Python grows with GPUs and runs on one core; the database is idle while jobs are
judged. A child forked after the cycle's reads shares the views copy-on-write (nothing is copied to
start it), judges its share while this process judges the rest, and sends its hits back through a
pipe. The child touches no connection, lock or log, and leaves with ``os._exit``; a child that
fails, dies or outlives its deadline is killed and reaped, and the caller does its work itself, so
a cycle's result never depends on it.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

AVAILABLE = hasattr(os, "fork") and (os.cpu_count() or 1) > 1
"""A second core to judge on (and a platform that forks)."""


class Child(Generic[T]):
    """``work`` running in a forked child; `result` collects what it returned."""

    def __init__(self, work: Callable[[], T]) -> None:
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: work, send, leave without running anything of the parent's
            code = 1
            try:
                os.close(read)
                data = pickle.dumps(work(), pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write, "wb") as out:
                    out.write(data)
                code = 0
            except BaseException:  # noqa: BLE001, S110 - the parent does the work instead
                pass
            finally:
                os._exit(code)
        os.close(write)
        self._fd = read

    def result(self, timeout: float) -> T | None:
        """What the child's work returned, or None if it failed, died, or did not finish within
        ``timeout`` seconds (it is killed then). The child is reaped either way."""
        deadline, chunks, done = time.monotonic() + timeout, [], False
        try:
            while (left := deadline - time.monotonic()) > 0:
                if not select.select([self._fd], [], [], left)[0]:
                    continue
                chunk = os.read(self._fd, 1 << 20)
                if not chunk:
                    done = True
                    break
                chunks.append(chunk)
        finally:
            os.close(self._fd)
            if not done:
                os.kill(self.pid, signal.SIGKILL)
            _, status = os.waitpid(self.pid, 0)
        if not done or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        return pickle.loads(b"".join(chunks))  # type: ignore[no-any-return]
