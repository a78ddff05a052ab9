"""The hooks' requests the agent could not take in time, left for it beside its socket.

A prolog has a hard time bound, and an agent it just started may still be importing, or a running
one may be stopped or swamped: a job's registration (or its end) must not die with its hook. So a hook writes its
request here first (one file per request, named so that the order they were written in is the order
they are read in), tries the socket, and takes the file back once the agent answered. The agent
reads what is left when it starts and at every tick, so a job whose prolog gave up is still
monitored, seconds late, and its epilog's unregistration queued behind it comes after it.

Only root and the agent's own user may leave requests: the directory is theirs (0700), and a file
owned by anyone else is removed unread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeAlias

from jobpulse.agent.control.listen import may_control
from jobpulse.schema import control

Request: TypeAlias = control.Register | control.Unregister
STALE_TMP_S = 60.0  # a hook writes its file in well under this


class Taken(NamedTuple):
    """One queued request read: its job and operation (None: unreadable, dropped), and why not ok."""

    file: str
    job: str | None
    op: str | None
    error: str | None


def queue_dir(control_socket: Path) -> Path:
    return Path(control_socket).with_name(Path(control_socket).name + ".queue")


def _job_of(message: Request) -> str:
    if isinstance(message, control.Register):
        return str(message.job.job_id)  # type: ignore[attr-defined]  # JobSpec is built at import
    return message.job_id


class Left:
    """A request left in the queue, locked by its hook while the hook still tries the socket itself:
    the agent skips a locked file, so a request is never taken twice, and a hook killed at its time
    bound lets go of it with its death."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def take_back(self) -> None:
        """The agent answered on the socket (or none will ever read it): the request is done."""
        self.path.unlink(missing_ok=True)
        self.let_go()

    def let_go(self) -> None:
        """The agent takes it from here."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def put(control_socket: Path, message: Request) -> Left:
    """Leave ``message`` for the agent, held by the caller until it takes it back or lets it go."""
    where = queue_dir(control_socket)
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = where / f"{time.time_ns():020d}-{_job_of(message)}.json"
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, control.encode(message))
    os.replace(tmp, path)  # whole or absent, and already held: the agent never reads half a request
    return Left(path, fd)


def waiting(control_socket: Path, job_id: str) -> list[Path]:
    """The requests for ``job_id`` still waiting for the agent."""
    where = queue_dir(control_socket)
    return sorted(where.glob(f"*-{job_id}.json")) if where.is_dir() else []


def drain(control_socket: Path, handle: Callable[[Request], control.Reply]) -> list[Taken]:
    """Hand every waiting request to ``handle`` in the order written, removing each."""
    where = queue_dir(control_socket)
    try:
        listed = os.listdir(where)
    except FileNotFoundError:
        return []
    for name in listed:  # half-written by a hook killed before its rename: never to be whole
        if name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                if time.time() - (where / name).stat().st_mtime > STALE_TMP_S:
                    (where / name).unlink()
    names = sorted(p for p in listed if p.endswith(".json"))
    taken = []
    for name in names:
        path = where / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue  # its hook took it back: the agent answered it on the socket
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            break  # its hook is still trying the socket: this one and those after it wait, in order
        try:
            with os.fdopen(fd, "rb") as f:
                owner = os.fstat(f.fileno()).st_uid
                if not may_control(owner):
                    raise control.BadRequest(f"left by uid {owner}, who may not control the agent")
                message = control.decode_request(f.read(control.MAX_REQUEST_BYTES + 1))
            if isinstance(message, control.Status):
                raise control.BadRequest("a status request cannot wait")
        except (OSError, control.BadRequest) as exc:
            taken.append(Taken(name, None, None, str(exc)))
        else:
            reply = handle(message)
            taken.append(Taken(name, _job_of(message), type(message).__name__.lower(), reply.error))
        path.unlink(missing_ok=True)
    return taken
