"""Ship: send spooled batches to the collector in order, with backoff while it is away.

200 = committed (or a duplicate of a committed batch): delete. 5xx, 408, 429 or no answer:
keep it and retry later (honouring Retry-After). Any other 4xx means the collector will never
take this batch: it is dropped, counted and logged, so one bad batch cannot block the rest.
"""

from __future__ import annotations

import gzip
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import msgspec
import structlog

from jobpulse.agent.shipping.batch import Ready
from jobpulse.agent.shipping.http_post import Connection, ProtocolError
from jobpulse.agent.shipping.spool import Spool, Spooled
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent.shipping.send")
RETRYABLE = {408, 429}


class _Asked(msgspec.Struct):
    """What an acknowledgement may ask of the agent besides deleting the batch."""

    captures: Annotated[list[wire.Capture], msgspec.Meta(max_length=16)] = []


_asked = msgspec.json.Decoder(_Asked)


def compress(ready: Ready) -> tuple[bytes, dict[str, int]]:
    """The gzip body to spool and send, and the counts the spool names it by."""
    b = ready.batch
    counts = {"gpu_samples": len(b.gpu_samples), "process_samples": len(b.process_samples), "events": len(b.events),
              **{f"dropped_{k}": v for k, v in msgspec.structs.asdict(b.dropped).items()}}
    return gzip.compress(ready.body, compresslevel=1), counts


class Shipper:
    def __init__(self, url: str, token_file: Path, spool: Spool, on_dropped: Callable[[dict[str, int]], None],
                 timeout_s: float = 10.0, on_captures: Callable[[list[wire.Capture]], None] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--collector must be an http(s) URL, got {url!r}")
        self.token_file = Path(token_file)
        self.spool = spool
        self.on_dropped = on_dropped
        self.on_captures = on_captures
        self.backoff_s = 0.0
        self.sent = 0
        self.failures = 0
        self.conn = Connection(parts, parts.path.rstrip("/") + "/v1/batches",
                               {"Authorization": f"Bearer {self._read_token()}", "Content-Type": "application/json",
                                "Content-Encoding": "gzip"}, timeout_s)
        self._lock = threading.Lock()

    def _read_token(self) -> str:
        mode = self.token_file.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("token file readable by others", file=str(self.token_file), mode=oct(stat.S_IMODE(mode)),
                        fix=f"chmod 600 {self.token_file}")
        for line in self.token_file.read_text().splitlines():
            if line.strip() and not line.strip().startswith("#"):
                return line.strip()
        raise ValueError(f"token file {self.token_file} holds no token")

    def drain(self, deadline_s: float | None = None) -> bool:
        """Send spooled batches oldest first until the spool is empty or one fails; True if empty."""
        with self._lock:
            while (item := self.spool.oldest()) is not None:
                outcome = self._send(item)
                if outcome == "retry":
                    return False
                self.spool.remove(item)
                if outcome == "rejected":
                    self.on_dropped(item.lost())
            return True

    def _send(self, item: Spooled) -> str:
        try:
            body = item.read()
        except FileNotFoundError:
            return "rejected"
        try:
            resp = self.conn.post(body)  # closes itself on any error; the next send reconnects
        except (OSError, ProtocolError) as exc:
            self._failed(None, str(exc) or type(exc).__name__)
            return "retry"
        detail = resp.body[:500].decode(errors="replace")
        if resp.status == 200:
            self.sent += 1
            self.backoff_s = 0.0
            self.failures = 0
            self._asked(resp.body)
            return "sent"
        if resp.status >= 500 or resp.status in RETRYABLE:
            retry_after = resp.headers.get("retry-after", "")
            self._failed(float(retry_after) if retry_after.isdigit() else None, f"HTTP {resp.status}")
            return "retry"
        if resp.status == 401:
            self._failed(None, "HTTP 401: wrong token")  # an admin can fix the token: keep the data
            return "retry"
        log.error("collector refused batch; dropped", status=resp.status, detail=detail, file=item.path.name)
        return "rejected"

    def _asked(self, body: bytes) -> None:
        """Hand on what the collector asked for with its acknowledgement (an older collector asks nothing)."""
        if self.on_captures is None or b'"captures"' not in body:
            return
        try:
            asked = _asked.decode(body).captures
        except msgspec.DecodeError as exc:  # (ValidationError included)
            log.warning("the collector's requests could not be read; ignored", error=str(exc)[:200])
            return
        if asked:
            self.on_captures(asked)

    def _failed(self, retry_after: float | None, reason: str) -> None:
        self.failures += 1
        self.backoff_s = retry_after if retry_after is not None else min(30.0, max(1.0, self.backoff_s * 2))
        if self.failures == 1 or self.failures % 30 == 0:
            log.warning("collector unavailable; spooling", reason=reason, spooled=len(self.spool),
                        retry_in_s=self.backoff_s)
