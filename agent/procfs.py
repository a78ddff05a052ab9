"""Reads of /proc for one process: CPU time, RSS, owner, cgroup and Slurm environment.

Everything here is the kernel's view of a PID; nothing a process says about itself.
"""

from __future__ import annotations

import os
import resource
from typing import NamedTuple

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class Stat(NamedTuple):
    """A tuple, not a frozen dataclass: one is built per job process and tick."""

    comm: str
    cpu_ticks: int  # utime + stime
    rss_bytes: int
    processor: int  # the CPU it last ran on
    start_ticks: int  # when the process started, in clock ticks after boot: (pid, start) names one process
    state: str  # R running or runnable, S sleeping, D waiting for I/O, ... (proc(5))


STAT_MAX = 4096  # a stat line is well under 1 KiB (52 numbers and a 16-byte comm)


def parse_stat(raw: bytes) -> Stat:
    """A /proc/PID/stat line; comm may contain spaces and parentheses: split at the last ')'."""
    close = raw.rfind(b")")
    comm = raw[raw.find(b"(") + 1:close].decode(errors="replace")
    fields = raw[close + 2:].split()
    # fields[0] is state (field 3); utime=14, stime=15, starttime=22, rss=24, processor=39 (1-based in proc(5)).
    return Stat(comm, int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE_SIZE, int(fields[36]),
                int(fields[19]), fields[0].decode())


class ProcFs:
    """Paths are plain strings and files raw descriptors (``os.open``/``os.read``): this runs for
    every job process every second, and pathlib's parsing or a file object costs more than the
    kernel's read itself."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root

    def pids(self) -> set[int]:
        return set(map(int, filter(str.isdigit, os.listdir(self.root))))

    def _read(self, pid: int, name: str, limit: int | None = None) -> bytes | None:
        """The file's content (its first ``limit`` bytes, in one read, when given); None when the
        process is gone or the file unreadable."""
        try:
            fd = os.open(f"{self.root}/{pid}/{name}", os.O_RDONLY)
        except OSError:
            return None
        try:
            if limit is not None:
                return os.read(fd, limit)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def stat(self, pid: int) -> Stat | None:
        raw = self._read(pid, "stat", STAT_MAX)
        return parse_stat(raw) if raw else None

    def uid(self, pid: int) -> int | None:
        try:
            return os.stat(f"{self.root}/{pid}").st_uid
        except OSError:
            return None

    def cgroup(self, pid: int) -> str:
        raw = self._read(pid, "cgroup")
        return raw.decode(errors="replace") if raw else ""

    def environ(self, pid: int, names: frozenset[str]) -> dict[str, str]:
        """The named variables of the process's initial environment (empty if unreadable)."""
        raw = self._read(pid, "environ")
        if raw is None:
            return {}
        raw = b"\0" + raw  # each variable starts after a NUL: look for the few asked for, not split them all
        out = {}
        for name in names:
            key = b"\0" + name.encode() + b"="
            at = raw.rfind(key)  # a name set twice: the later one, as splitting them all in order gave
            if at >= 0:
                start = at + len(key)
                end = raw.find(b"\0", start)
                out[name] = raw[start:end if end >= 0 else len(raw)].decode(errors="replace")
        return out


class StatFiles:
    """/proc/PID/stat of the processes read every tick, each kept open and read again from offset 0
    (the kernel writes the line anew on each read): one ``pread`` per process and tick instead of
    open, read and close. A kept descriptor stays bound to its process: once that process exits
    the read fails (ESRCH), so a PID taken over by a new process is opened anew, never read as
    the old one. At most ``limit`` are kept (a quarter of the descriptor limit); past that, files
    are opened per read. Used by one thread only (the sampler's)."""

    def __init__(self, proc: ProcFs, limit: int | None = None) -> None:
        self.proc = proc
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.limit = limit if limit is not None else 4096 if soft == resource.RLIM_INFINITY else soft // 4
        self._fds: dict[int, int] = {}

    def read(self, pid: int) -> Stat | None:
        fd = self._fds.get(pid)
        if fd is not None:
            try:
                raw = os.pread(fd, STAT_MAX, 0)
                if raw:
                    return parse_stat(raw)
            except OSError:
                pass
            self._close(pid)  # the process exited: a new one under this PID is opened below
        if len(self._fds) >= self.limit:
            return self.proc.stat(pid)
        try:
            fd = os.open(f"{self.proc.root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            raw = os.pread(fd, STAT_MAX, 0)
        except OSError:
            raw = b""
        if not raw:
            os.close(fd)
            return None
        self._fds[pid] = fd
        return parse_stat(raw)

    def keep_only(self, pids: set[int]) -> None:
        """Close the files of processes not in ``pids`` (gone, or no longer read)."""
        for pid in [p for p in self._fds if p not in pids]:
            self._close(pid)

    def drop(self, pid: int) -> None:
        """Close ``pid``'s file (a process no longer read every tick)."""
        if pid in self._fds:
            self._close(pid)

    def _close(self, pid: int) -> None:
        os.close(self._fds.pop(pid))
