"""A recording's bytes, bounded: read as UTF-8 text lines (gunzipped where it is gzip, re-encoded
where it is UTF-16, as PowerShell's `>` writes), never more than a stated size, in a stated time.

A regular file is read up to the size it had when the import began (a log still being written is
read as it was), so every pass sees the same bytes. Anything else (a FIFO, a pipe, `/dev/zero`,
stdin as `-`) cannot be read twice: it is copied into a temporary file first, up to the same size
and within a time limit, so an endless input stops with a message instead of hanging.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import os
import pwd
import select
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from jobpulse.collector.recordings.faults import Refused

MAX_LINE = 64 * 1024
"""No recording has a line this long: a longer one is not a recording (and is never read whole)."""
MAX_BYTES = 4 * 2**30
"""The most an import reads of one recording (after gunzip): a 2 GB log fits; an endless input stops."""
MAX_WAIT_S = 600.0
"""How long an import waits for a pipe or FIFO to end."""


@dataclass(frozen=True)
class Limits:
    """How much an import reads (bytes, after gunzip) and how long it waits for a pipe to end."""

    max_bytes: int = MAX_BYTES
    wait_s: float = MAX_WAIT_S


@dataclass(frozen=True)
class Source:
    """A recording as a regular file read up to ``size`` bytes; ``name`` is what the user gave."""

    path: Path
    size: int
    name: str
    limits: Limits = Limits()
    quotable: bool = True
    """Whether messages may quote its bytes: not where the one who asked could not read the file."""


def _invoker_reads(st: os.stat_result) -> bool:
    """Whether the user who asked could read a file of this owner and mode: anyone who is not root
    opened it themselves; root via sudo asks for SUDO_UID; root itself only for what others may read."""
    if os.geteuid() != 0:
        return True
    sudo = os.environ.get("SUDO_UID", "")
    if not sudo.isdigit():
        return bool(st.st_mode & stat.S_IROTH)
    uid = int(sudo)
    if uid == st.st_uid:
        return bool(st.st_mode & stat.S_IRUSR)
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, pwd.getpwuid(uid).pw_gid)
    except (KeyError, OSError):
        groups = []
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def _planted(path: Path, opened: os.stat_result) -> bool:
    """As root, a link whose owner is neither root nor the owner of the file it led to (``opened``,
    the file as opened, so a link swapped after a check cannot pass): a user could have planted it to
    have root read a file that user cannot (only the last component is a link jobpulse checks)."""
    if os.geteuid() != 0 or not path.is_symlink():
        return False
    return os.lstat(path).st_uid not in (0, opened.st_uid)


@contextlib.contextmanager
def source(path: Path, limits: Limits = Limits()) -> Iterator[Source]:
    """The recording as a `Source`: a regular file as it is now, anything else copied (bounded). The
    file is opened once and only that open file is read (through /proc/self/fd), whatever its path
    names later."""
    stdin = str(path) == "-"
    name = "stdin" if stdin else path.name
    try:  # O_NONBLOCK: opening a FIFO does not wait for a writer
        fd = sys.stdin.fileno() if stdin else os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise Refused(f"cannot read it: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stdin and _planted(path, st):
            raise Refused("a link owned by another user than its target's owner: as root, jobpulse import "
                          "follows no link a user could have planted; give the file itself")
        mode, quotable = st.st_mode, _invoker_reads(st)
        if stat.S_ISDIR(mode):
            raise Refused("a folder, not a recording")
        if stat.S_ISREG(mode) and not stdin:
            if st.st_size > limits.max_bytes:
                raise Refused(f"{st.st_size / 2**30:.1f} GiB is over the {_size(limits.max_bytes)} an import reads "
                              "(--max-mib): split it, or raise the limit")
            yield Source(Path(f"/proc/self/fd/{fd}"), st.st_size, name, limits, quotable)
            return
        with tempfile.TemporaryDirectory(prefix="jobpulse-import-") as folder:
            copy = Path(folder) / "recording"
            size = _spool(fd, copy, limits)
            yield Source(copy, size, name, limits, quotable)
    finally:
        if not stdin:
            os.close(fd)


def _spool(fd: int, copy: Path, limits: Limits) -> int:
    """Copy a pipe, FIFO or device into ``copy``: at most ``max_bytes``, within ``wait_s``."""
    deadline = time.monotonic() + limits.wait_s
    size = 0
    with copy.open("wb") as out:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:
                raise Refused(f"the input did not end within {limits.wait_s:g} s (--wait): a pipe or FIFO "
                              "must end (a finished log, not one still being written)")
            try:
                chunk = os.read(fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                return size
            if size == 0:
                _first_chunk(chunk)
            size += len(chunk)
            if size > limits.max_bytes:
                raise Refused(f"the input did not end within {_size(limits.max_bytes)} (--max-mib): "
                              "an endless input is not a recording")
            out.write(chunk)


def _first_chunk(chunk: bytes) -> None:
    """Refuse binary data at once (a device such as /dev/zero would otherwise fill the copy)."""
    if b"\x00" in chunk[:MAX_LINE] and not chunk.startswith((b"\x1f\x8b", codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise Refused("binary data (a NUL byte) in its first bytes: not a text recording")


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


class _Bounded(io.RawIOBase):
    """The first ``size`` bytes of a file (what it held when the import began)."""

    def __init__(self, raw: IO[bytes], size: int) -> None:
        self.raw, self.left = raw, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.left)
        data = self.raw.read(n) if n else b""
        buffer[:len(data)] = data
        self.left -= len(data)
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()


def open_text(src: Source) -> IO[bytes]:
    """The recording's bytes as UTF-8: gunzipped where it is gzip, re-encoded where it is UTF-16."""
    with src.path.open("rb") as probe:
        head = probe.read(2)
    raw: IO[bytes] = io.BufferedReader(_Bounded(src.path.open("rb"), src.size), 1 << 16)
    if head == b"\x1f\x8b":
        raw = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
        head = raw.peek(2)[:2]  # type: ignore[attr-defined]
    if head in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return _Utf8(io.TextIOWrapper(raw, encoding="utf-16"))  # type: ignore[return-value]
    return raw


class _Utf8:
    """A UTF-16 text file read as UTF-8 bytes, line by line (bounded) or in chunks."""

    def __init__(self, text: io.TextIOWrapper) -> None:
        self.text = text

    def readline(self, size: int = -1) -> bytes:
        try:
            return self.text.readline(size).encode()
        except UnicodeDecodeError:
            return b"\xff"  # not UTF-16 after all: `lines` names the line

    def read(self, size: int = -1) -> bytes:
        return self.text.read(size).encode(errors="replace")

    def __enter__(self) -> _Utf8:
        return self

    def __exit__(self, *exc: object) -> None:
        self.text.close()


class Lines:
    """Numbered text lines of a recording, each bounded in length, all bounded in bytes; binary data
    refuses the file. ``count`` is the number read so far (after the end: the last line's number).
    With ``hold_cut``, a last line without its newline (a row cut where the logger was killed) is
    held back as ``cut`` instead of parsed: its last value may be cut mid-number."""

    def __init__(self, stream: IO[bytes], max_bytes: int = MAX_BYTES, hold_cut: bool = False) -> None:
        self.stream, self.max_bytes, self.hold_cut = stream, max_bytes, hold_cut
        self.count = self.read = 0
        self.ended_with_newline = True
        self.cut: tuple[int, str] | None = None  # a last line without its newline, held back (``hold_cut``)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        while True:
            try:
                raw = self.stream.readline(MAX_LINE + 1)
            except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
                raise Refused(f"cannot read the file: {exc}", self.count + 1) from None
            if not raw:
                return
            self.count += 1
            self.read += len(raw)
            if self.read > self.max_bytes:
                raise Refused(f"stopped after {_size(self.max_bytes)} (--max-mib): larger than an import reads "
                              "(a gzip that unpacks without end?)", self.count)
            if len(raw) > MAX_LINE:
                raise Refused(f"longer than {MAX_LINE // 1024} KiB: not a recording", self.count)
            if b"\x00" in raw:
                raise Refused("binary data (a NUL byte): not a text recording", self.count)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise Refused("not UTF-8 text: not a recording", self.count) from None
            self.ended_with_newline = text.endswith("\n")
            text = text.rstrip("\r\n")
            if self.hold_cut and not self.ended_with_newline:  # readline's last line: the writer was stopped
                self.cut = (self.count, text)
                return
            yield self.count, text.lstrip("\ufeff") if self.count == 1 else text


def first_lines(src: Source, n: int = 40) -> list[str]:
    """The first ``n`` lines (what `detect` reads)."""
    out: list[str] = []
    with open_text(src) as stream:
        for _, text in Lines(stream, src.limits.max_bytes):
            out.append(text)
            if len(out) >= n:
                break
    return out

