"""Spool: batches on disk (in memory while the disk refuses them), oldest first, bounded in bytes.

Every batch is written here before it is sent and deleted once the collector acknowledged
it, so a collector outage, a database outage or an agent restart loses nothing. When the
spool is full the oldest batches are dropped, and what they held is counted (and reported
to the collector in the next batch). File names sort in creation order and carry the number
of records and of the drops the batch itself reports, so dropping one loses no count and
needs no decompression.

A stop must not lose what only memory holds. The spool keeps a reserve file (an eighth of its bound,
at most 8 MiB) that it gives up at stop, when the disk refused batches, to write them; what still
does not fit is counted in a small tally file (made at start, written in place, so counting needs
no free space) that the next start reports as dropped. A disk full from the start has no room for
that file: the count then goes to a second folder (the agent's runtime folder, a tmpfs), read by the
next start too. Only a kill -9 while the disk refuses loses batches uncounted.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("jobpulse.agent.shipping.spool")

KINDS = ("gpu_samples", "process_samples", "events")
_TAGS = {"g": "gpu_samples", "p": "process_samples", "e": "events",  # records in the batch
         "G": "dropped_gpu_samples", "P": "dropped_process_samples", "E": "dropped_events", "B": "dropped_batches"}


RESERVE, TALLY = "reserve", "lost-at-stop.json"
MAX_RESERVE = 8 * 1024 * 1024
TALLY_BYTES = 512


def _none_dropped() -> dict[str, int]:
    return {"gpu_samples": 0, "process_samples": 0, "events": 0, "batches": 0}


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

    def __init__(self, directory: Path, max_bytes: int, tally_elsewhere: Path | None = None) -> None:
        self.dir = Path(directory)
        self.elsewhere = tally_elsewhere / f"{TALLY}.{self.dir.name}" if tally_elsewhere else None
        self.tallied = True  # whether what close() counted as lost was written where the next start reads it
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
        self.lost_before = self._read_tally()
        self._reserve(min(max_bytes // 8, MAX_RESERVE))

    def _reserve(self, size: int) -> None:
        """Hold ``size`` bytes of the disk for the batches a stop must write (as much as it gives)."""
        path = self.dir / RESERVE
        try:
            if path.exists() and path.stat().st_size >= size:
                return
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("spool reserve not made: a stop while the disk refuses may have to count batches as lost",
                        error=str(exc), spool=str(self.dir))

    def _tally_slot(self) -> int | None:
        """The tally file's descriptor, made at its full size (blank) while the disk has room, so a
        count can be written in place later when it has none."""
        try:
            fd = os.open(self.dir / TALLY, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < TALLY_BYTES:
                os.posix_fallocate(fd, 0, TALLY_BYTES)
            return fd
        except OSError:
            os.close(fd)
            return None

    def _read_tally(self) -> dict[str, int]:
        """What the previous run could not keep at its stop (reported with the first batch), once: from
        the spool's tally file and from the one elsewhere."""
        total = _none_dropped()
        if self.elsewhere is not None and self.elsewhere.exists():
            try:
                for k, n in json.loads(self.elsewhere.read_text()).items():
                    if k in total:
                        total[k] += int(n)
                self.elsewhere.unlink()
            except (OSError, ValueError) as exc:
                log.error("tally of lost batches unreadable", file=str(self.elsewhere), error=str(exc))
        for k, n in self._read_tally_slot().items():
            total[k] += n
        return total

    def _read_tally_slot(self) -> dict[str, int]:
        fd = self._tally_slot()
        if fd is None:
            return _none_dropped()
        try:
            text = os.pread(fd, TALLY_BYTES, 0).decode(errors="replace").strip(" \n\x00")
            if text:
                os.pwrite(fd, b" " * TALLY_BYTES, 0)
            tally = json.loads(text) if text else {}
        except (OSError, ValueError) as exc:
            log.error("tally of lost batches unreadable", file=str(self.dir / TALLY), error=str(exc))
            tally = {}
        finally:
            os.close(fd)
        return {k: int(tally.get(k, 0)) for k in _none_dropped()}

    def _write_tally(self, lost: dict[str, int]) -> bool:
        """The count, written in place into the slot the start made (needs no free space), else into
        the folder elsewhere; False when neither took it."""
        text = json.dumps(lost).encode()
        errors = []
        fd = self._tally_slot()
        if fd is not None:
            try:
                os.pwrite(fd, text.ljust(TALLY_BYTES), 0)
                os.fsync(fd)
                return True
            except OSError as exc:
                errors.append(str(exc))
            finally:
                os.close(fd)
        if self.elsewhere is not None:
            try:
                _write(str(self.elsewhere), text)
                return True
            except OSError as exc:
                errors.append(str(exc))
        log.error("lost batches could not even be counted on disk", error="; ".join(errors) or "no tally file", **lost)
        return False

    def close(self) -> dict[str, int]:
        """At stop: write every batch only memory holds, giving up the reserve when the disk refuses
        them; count what still does not fit (the tally file) and return it."""
        lost = _none_dropped()
        with self._lock:
            self._persist()
            if not self._disk_failed:
                return lost
            (self.dir / RESERVE).unlink(missing_ok=True)
            self._persist()
            for entry in [e for e in self._index if e[2] is not None]:
                self._index.remove(entry)
                self._bytes -= entry[1]
                for k, n in Spooled(entry[0], _counts(entry[0].name)).lost().items():
                    lost[k] += n
        if any(lost.values()):
            self.tallied = self._write_tally(lost)
        return lost

    def size(self) -> int:
        return self._bytes

    def put(self, body: bytes, counts: dict[str, int]) -> dict[str, int]:
        """Store a batch; returns what had to be dropped to make room (records and batches). A disk
        that refuses the write (full, read-only) never loses the batch: it waits in memory, within
        the same bound, and is written when the disk takes it again."""
        dropped = _none_dropped()
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
