"""The agent's control socket: the Slurm prolog registers a job, the epilog unregisters it.

Messages are `jobpulse.schema.control`'s: one JSON request per line in, one reply per line out.
Only root and the agent's own user may talk to it: the socket is theirs alone (mode 0600), and
SO_PEERCRED is checked on accept, so any other peer is answered and closed at once without taking
one of the capped request slots. Each request must arrive within a few seconds, so idle or slow
peers cannot pile up threads; a request over 64 KiB gets a refusal the prolog logs.

One agent per node by construction: an agent takes an exclusive lock (``agent_lock``) before it
opens its spool or binds its socket, so a live agent's socket is never unlinked by a second one,
and the prolog asks the lock, not the socket, whether an agent runs.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from jobpulse.schema import control

Handler = Callable[[control.Register | control.Unregister | control.Status], control.Reply]
MAX_CONNECTIONS = 16
REQUEST_TIMEOUT_S = 5.0


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def may_control(uid: int) -> bool:
    return uid in (0, os.getuid())


class AlreadyRunning(OSError):
    """Another agent holds this node's agent lock."""


def lock_path(control_socket: Path) -> Path:
    return Path(control_socket).with_name(Path(control_socket).name + ".lock")


def agent_lock(control_socket: Path, wait_s: float = 3.0) -> IO[str]:
    """The node's agent lock, held for the life of the returned file (the process). Waits ``wait_s``
    for a prolog's probe (``agent_running``) to let go; AlreadyRunning when an agent holds it."""
    path = lock_path(control_socket)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600), "r+")  # no one else may hold it open
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                raise AlreadyRunning(errno.EEXIST, f"another agent holds {path}: one agent per node") from None
            time.sleep(0.05)
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def agent_running(control_socket: Path) -> bool:
    """Does an agent hold this node's lock? (A probe: it takes the lock for an instant when free.)"""
    try:
        fd = os.open(lock_path(control_socket), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class ControlServer(socketserver.ThreadingUnixStreamServer):
    """Bind only while holding the agent lock (`agent_lock`): then a socket file already there is a
    dead agent's."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of connections waits instead of failing

    def __init__(self, path: Path, handle: Handler) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.handle = handle
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0
        old = os.umask(0o177)  # created 0600: no window in which others could connect
        try:
            super().__init__(str(self.path), _Request)
        finally:
            os.umask(old)

    def process_request(self, request: Any, client_address: Any) -> None:
        uid = peer_uid(request)
        if not may_control(uid):  # answered and closed here: no thread, no slot
            self.refused += 1
            request.setblocking(False)
            try:
                request.send(control.encode(control.Reply(ok=False, error=f"uid {uid} may not control the agent")))
            except OSError:
                pass
            self.shutdown_request(request)
            return
        if not self.slots.acquire(blocking=False):  # full: close at once instead of queueing a thread
            self.refused += 1
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def serve_in_thread(self) -> threading.Thread:
        """Serve with no poll timeout: an idle agent's control thread sleeps until a connection
        comes or ``close`` wakes it."""
        t = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": None}, name="control", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.socket.shutdown(socket.SHUT_RDWR)  # wakes the wait; accepts fail until the loop sees the shutdown
        self.shutdown()
        self.server_close()
        self.path.unlink(missing_ok=True)


class _Request(socketserver.StreamRequestHandler):
    server: ControlServer
    timeout = REQUEST_TIMEOUT_S  # socket timeout: a silent peer is dropped

    def handle(self) -> None:
        try:
            line = self.rfile.readline(control.MAX_REQUEST_BYTES + 1)
        except OSError:  # silent past the timeout, or gone
            return
        try:
            reply = self.server.handle(control.decode_request(line))
        except control.BadRequest as exc:
            reply = control.Reply(ok=False, error=f"bad request: {exc}")
        try:
            self.wfile.write(control.encode(reply))
        except OSError:  # the client stopped waiting (a prolog past its bound queued it too): carried out anyway
            pass
