"""Spool: batches on disk (in memory while the disk refuses them), oldest first, bounded in bytes.

Every batch is written here before it is sent and deleted once the collector acknowledged
it, so a collector outage, a database outage or an agent restart loses nothing. When the
spool is full the oldest batches are dropped, and what they held is counted (and reported
to the collector in the next batch). File names sort in creation order and carry the number
of records and of the drops the batch itself reports, so dropping one loses no count and
needs no decompression.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("jobpulse.agent.spool")

KINDS = ("gpu_samples", "process_samples", "events")
_TAGS = {"g": "gpu_samples", "p": "process_samples", "e": "events",  # records in the batch
         "G": "dropped_gpu_samples", "P": "dropped_process_samples", "E": "dropped_events", "B": "dropped_batches"}


@dataclass(frozen=True)
class Spooled:
    path: Path
    counts: dict[str, int]
    body: bytes | None = None  # in memory: the disk refused it (full, read-only), or it is the newest, just written

    def read(self) -> bytes:
        return self.body if self.body is not None else self.path.read_bytes()

    def lost(self) -> dict[str, int]:
        """What is gone if this batch is discarded: its records, the drops it reports, itself."""
        lost = {k: self.counts.get(k, 0) + self.counts.get(f"dropped_{k}", 0) for k in KINDS}
        lost["batches"] = 1 + self.counts.get("dropped_batches", 0)
        return lost


def _name(counts: dict[str, int]) -> str:
    tags = "-".join(f"{tag}{counts.get(key, 0)}" for tag, key in _TAGS.items())
    return f"{time.time_ns():020d}-{tags}.json.gz"


def _write(path: str, body: bytes) -> None:
    """The file's bytes through one descriptor (no file object: this runs every flush)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)  # less the umask, as open()
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _counts(name: str) -> dict[str, int]:
    parts = name.split(".")[0].split("-")[1:]
    return {_TAGS[p[0]]: int(p[1:]) for p in parts if p[:1] in _TAGS and p[1:].isdigit()}


class Spool:
    """The folder is listed once at start; after that an in-memory index (oldest first) avoids
    listing and stat-ing the folder on every flush."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)  # a write interrupted by a crash
        # [path, size, body]: body is the batch while only memory holds it
        self._index: deque[list[Any]] = deque([p, p.stat().st_size, None] for p in sorted(self.dir.glob("*.json.gz")))
        self._bytes = sum(size for _, size, _ in self._index)
        self._disk_failed = False
        # The newest batch, also kept in memory once written: with the collector up it is sent next,
        # and sending it needs no read of the file just written.
        self._newest: tuple[Path, bytes] | None = None

    def size(self) -> int:
        return self._bytes

    def put(self, body: bytes, counts: dict[str, int]) -> dict[str, int]:
        """Store a batch; returns what had to be dropped to make room (records and batches). A disk
        that refuses the write (full, read-only) never loses the batch: it waits in memory, within
        the same bound, and is written when the disk takes it again."""
        dropped = {"gpu_samples": 0, "process_samples": 0, "events": 0, "batches": 0}
        with self._lock:
            while self._index and self._bytes + len(body) > self.max_bytes:
                path, size, _ = self._index.popleft()
                self._bytes -= size
                for k, n in Spooled(path, _counts(path.name)).lost().items():
                    dropped[k] += n
                path.unlink(missing_ok=True)
            path = self.dir / _name(counts)
            self._index.append([path, len(body), body])
            self._bytes += len(body)
            self._newest = (path, body)
            self._persist()
        return dropped

    def _persist(self) -> None:
        """Write the batches only memory holds, oldest first; stop at the first refusal."""
        for entry in self._index:
            path, _, body = entry
            if body is None:
                continue
            tmp = f"{path}.tmp"
            try:
                _write(tmp, body)
                os.replace(tmp, path)
            except OSError as exc:
                Path(tmp).unlink(missing_ok=True)
                if not self._disk_failed:
                    log.warning("spool disk refused a batch: holding batches in memory", error=str(exc),
                                spool=str(self.dir))
                self._disk_failed = True
                return
            entry[2] = None
        if self._disk_failed:
            log.info("spool disk writable again", spool=str(self.dir))
        self._disk_failed = False

    def held_in_memory(self) -> int:
        with self._lock:
            return sum(1 for _, _, body in self._index if body is not None)

    def oldest(self) -> Spooled | None:
        with self._lock:
            if not self._index:
                return None
            path, _, body = self._index[0]
            if body is None and self._newest is not None and self._newest[0] == path:
                body = self._newest[1]
        return Spooled(path, _counts(path.name), body)

    def remove(self, item: Spooled) -> None:
        with self._lock:
            if self._index and self._index[0][0] == item.path:
                _, size, _ = self._index.popleft()
                self._bytes -= size
        item.path.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._index)

    def pending(self) -> dict[str, int]:
        """Records waiting in the spool, by kind."""
        with self._lock:
            names = [path.name for path, _, _ in self._index]
        total = dict.fromkeys(KINDS, 0)
        for name in names:
            for kind, n in _counts(name).items():
                if kind in total:
                    total[kind] += n
        return total
