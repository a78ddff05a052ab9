"""The control protocol between the Slurm hooks (or `jobpulse-agent register|unregister|status`) and
the node agent: one JSON request per line on the agent's Unix socket, one JSON reply per line.

Requests are a union tagged by ``op``; only root and the agent's own user may send them (the agent
checks SO_PEERCRED, not what the peer says). A request longer than ``MAX_REQUEST_BYTES`` is refused.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from jobpulse.schema import wire

MAX_REQUEST_BYTES = 64 * 1024

# The job as the prolog knows it: JobRecord's fields, with Slurm's GPU indexes (``SLURM_JOB_GPUS``:
# "0,1" or ["0", "1"]) instead of resolved GPUs, and the sampling interval the job asked for.
JobSpec = msgspec.defstruct(
    "JobSpec",
    [("job_id", wire.JobId),
     *((f.name, f.type, msgspec.field(default_factory=f.default_factory) if f.default is msgspec.NODEFAULT
        else f.default) for f in msgspec.structs.fields(wire.JobRecord) if f.name not in ("job_id", "gpus")),
     ("gpus", Annotated[list[str] | str, Meta(description="Slurm GPU indexes or NVML UUIDs")],
      msgspec.field(default_factory=list)),
     ("interval_s", float | None, None),
     ("shared", Annotated[bool, Meta(description="the job shares its GPUs with other jobs (Slurm shards, MPS): "
                                     "each is judged from its own processes; unset, it takes them over")], False),
     ("share", Annotated[float, Meta(gt=0, le=1, description="the share of each of its GPUs the job holds, when "
                                     "known (Slurm MPS); counts its GPU-hours")] | None, None)],
    frozen=True, module=__name__, forbid_unknown_fields=True, omit_defaults=True)


class Register(Struct, frozen=True, tag_field="op", tag="register", forbid_unknown_fields=True,
               omit_defaults=True):
    """The prolog: a job starts on this node with these GPUs."""

    job: JobSpec  # type: ignore[valid-type]
    # When the hook made the request (epoch seconds): one the agent reads only after the job's end
    # (a prolog that gave up, its request still in the socket's backlog) is stale and refused.
    sent: float | None = None


class Unregister(Struct, frozen=True, tag_field="op", tag="unregister", forbid_unknown_fields=True):
    """The epilog: the job ended, in this state."""

    job_id: wire.JobId
    state: Annotated[str, Meta(pattern=r"^[A-Z_]+$", max_length=32)] | None = None
    exit_code: int | None = None


class Status(Struct, frozen=True, tag_field="op", tag="status", forbid_unknown_fields=True):
    """Is the agent there, and what does it hold?"""


Request = Register | Unregister | Status


class Reply(Struct, frozen=True, omit_defaults=True):
    """``ok`` and, for a refusal, the reason; the rest depends on the request."""

    ok: bool
    error: str | None = None
    job_id: str | None = None
    gpus: list[str] | None = None
    node: str | None = None
    instance: str | None = None
    jobs: list[str] | None = None
    spooled: int | None = None


# strict=False: the prolog passes the environment's strings
_requests: msgspec.json.Decoder[Request] = msgspec.json.Decoder(Request, strict=False)


class BadRequest(ValueError):
    """A request that is not one of the protocol's messages (the reason says why)."""


def decode_request(line: bytes) -> Register | Unregister | Status:
    if len(line) > MAX_REQUEST_BYTES:
        raise BadRequest(f"request of {len(line)} bytes exceeds {MAX_REQUEST_BYTES} bytes")
    try:
        return _requests.decode(line)
    except msgspec.MsgspecError as exc:
        raise BadRequest(str(exc)) from None


def encode(message: Register | Unregister | Status | Reply) -> bytes:
    return msgspec.json.encode(message) + b"\n"


def decode_reply(line: bytes) -> Reply:
    """The agent's reply; ValueError when there is none or it is not one."""
    try:
        return msgspec.json.decode(line, type=Reply)
    except msgspec.MsgspecError as exc:
        raise ValueError(f"not a reply from the agent: {exc}") from None


def job_spec(**fields: Any) -> Any:
    """A JobSpec from keyword fields, leaving out those that are None, descriptive text clipped to its
    limit (`wire.clipped`)."""
    kept, _ = wire.clipped(wire.JobRecord, {k: v for k, v in fields.items() if v is not None})
    return msgspec.convert(kept, JobSpec, strict=False)


def request(path: Path, message: Register | Unregister | Status,
            timeout_s: float = 5.0) -> Reply:
    """Send one request to a running agent and return its reply; OSError names the socket."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(path))
            s.sendall(encode(message))
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise OSError(f"no agent listens on {path} ({exc.strerror}): is `jobpulse-agent run` running, "
                      f"with this --control-socket?") from None
    return decode_reply(data)


def wait_answering(path: Path, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> Reply | None:
    """The agent's status once it answers on ``path``, waited for up to ``timeout_s`` while ``alive()``
    (its process runs); None if it never did. Its socket's file exists before it listens: a loaded
    machine makes that gap long, and a slow agent is not a missing one."""
    deadline = time.monotonic() + timeout_s
    while alive() and time.monotonic() < deadline:
        if path.exists():
            try:
                return request(path, Status(), timeout_s=max(0.5, min(5.0, deadline - time.monotonic())))
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    return None
