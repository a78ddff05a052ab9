"""The agent's control socket: the Slurm prolog registers a job, the epilog unregisters it.

Protocol: one JSON object per line in, one JSON object per line out. Only root and the
agent's own user may talk to it (checked with SO_PEERCRED, not by what the peer says).
Requests: ``{"op": "register", "job": {...JobRecord fields, "gpus": ["0", "1"]}}``,
``{"op": "unregister", "job_id": "123", "state": "COMPLETED", "exit_code": 0}``,
``{"op": "status"}``.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("jobpulse.agent.control")
Handler = Callable[[dict[str, Any]], dict[str, Any]]


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
        super().__init__(str(self.path), _Request)
        os.chmod(self.path, 0o666)  # anyone may connect; peer_uid decides who is heard

    def serve_in_thread(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="control", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.path.unlink(missing_ok=True)


class _Request(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        uid = peer_uid(self.request)
        line = self.rfile.readline(65536)
        if uid not in (0, os.getuid()):
            reply: dict[str, Any] = {"ok": False, "error": f"uid {uid} may not control the agent"}
        else:
            try:
                reply = self.server.handle(json.loads(line))
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"ok": False, "error": str(exc)}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


def request(path: Path, message: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """Send one request to a running agent and return its reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(str(path))
        s.sendall(json.dumps(message).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)
