"""The agent's control socket: the Slurm prolog registers a job, the epilog unregisters it.

Messages are `jobpulse.schema.control`'s: one JSON request per line in, one reply per line out.
Only root and the agent's own user may talk to it (checked with SO_PEERCRED, not by what the peer
says). Connections are capped and each must send its request within a few seconds, so idle or
slow peers cannot pile up threads; a request over 64 KiB gets a refusal the prolog logs.
"""

from __future__ import annotations

import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobpulse.schema import control

Handler = Callable[[control.Register | control.Unregister | control.Status], control.Reply]
MAX_CONNECTIONS = 16
REQUEST_TIMEOUT_S = 5.0


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, handle: Handler) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.handle = handle
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0
        super().__init__(str(self.path), _Request)
        os.chmod(self.path, 0o666)  # anyone may connect; peer_uid decides who is heard

    def process_request(self, request: Any, client_address: Any) -> None:
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
        uid = peer_uid(self.request)
        try:
            line = self.rfile.readline(control.MAX_REQUEST_BYTES + 1)
        except TimeoutError:
            return
        if uid not in (0, os.getuid()):
            reply = control.Reply(ok=False, error=f"uid {uid} may not control the agent")
        else:
            try:
                reply = self.server.handle(control.decode_request(line))
            except control.BadRequest as exc:
                reply = control.Reply(ok=False, error=f"bad request: {exc}")
        self.wfile.write(control.encode(reply))


def request(path: Path, message: control.Register | control.Unregister | control.Status,
            timeout_s: float = 5.0) -> control.Reply:
    """Send one request to a running agent and return its reply; OSError names the socket."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(path))
            s.sendall(control.encode(message))
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise OSError(f"no agent listens on {path} ({exc.strerror}): is `jobpulse-agent run` running, "
                      f"with this --control-socket?") from None
    return control.decode_reply(data)
