"""Who a user is, as the site's MUNGE says: the credential a user makes with ``munge -n`` (the daemon
Slurm itself authenticates with), checked by ``unmunge`` against the same key. A credential is good
for one request: munged refuses a replay, it expires after its TTL (5 minutes by default), and its
payload must name what it is for, so one made for another request is refused.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from jobpulse.collector.errors import Rejected

_UID = re.compile(r"^UID:\s+\S+ \((\d+)\)$", re.M)
_STATUS = re.compile(r"^STATUS:\s+(.*)$", re.M)
MAX_CREDENTIAL = 4096


@dataclass(frozen=True)
class Identity:
    uid: int
    payload: bytes


async def verify(credential: str, socket: Path | None, timeout_s: float = 5.0) -> Identity:
    """The uid and payload of a MUNGE credential; Rejected (401) saying why it is not good."""
    if not credential.startswith("MUNGE:") or len(credential) > MAX_CREDENTIAL or not credential.isprintable():
        raise Rejected(401, "expected a MUNGE credential (`munge -n -s PAYLOAD`)", "Authorization")
    binary = shutil.which("unmunge")
    if binary is None:
        raise Rejected(401, "this collector cannot check MUNGE credentials (unmunge is not installed)",
                       "Authorization")
    proc = await asyncio.create_subprocess_exec(
        binary, *(["--socket", str(socket)] if socket else []), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(credential.encode()), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise Rejected(401, "munged did not answer in time", "Authorization") from None
    head, _, payload = out.partition(b"\n\n")
    text = head.decode(errors="replace")
    status, uid = _STATUS.search(text), _UID.search(text)
    if proc.returncode != 0 or status is None or uid is None:
        why = status.group(1) if status else (err.decode(errors="replace").strip()[-200:] or "no answer")
        raise Rejected(401, f"MUNGE credential refused: {why}", "Authorization")
    return Identity(int(uid.group(1)), payload)
