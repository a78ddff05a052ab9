"""Reads of /proc for one process: CPU time, RSS, owner, cgroup and Slurm environment; and of a
cgroup directory tree: the processes in it.

Everything here is the kernel's view of a PID; nothing a process says about itself.
"""

from __future__ import annotations

import os
import re
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
        self._mounts: list[tuple[frozenset[str] | None, str, str]] | None = None  # read once: `cgroup_dir`

    def pids(self) -> set[int]:
        return set(map(int, filter(str.isdigit, os.listdir(self.root))))

    def read(self, pid: int, name: str, limit: int | None = None) -> bytes | None:
        """The file's content (its first ``limit`` bytes, in one read, when given); None when the
        process is gone or the file unreadable."""
        return self._read_path(f"{self.root}/{pid}/{name}", limit)

    @staticmethod
    def _read_path(path: str, limit: int | None = None) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY)
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
        raw = self.read(pid, "stat", STAT_MAX)
        return parse_stat(raw) if raw else None

    def uid(self, pid: int) -> int | None:
        try:
            return os.stat(f"{self.root}/{pid}").st_uid
        except OSError:
            return None

    def cgroup(self, pid: int) -> str:
        raw = self.read(pid, "cgroup")
        return raw.decode(errors="replace") if raw else ""

    def cgroup_dir(self, controllers: str, path: str) -> str | None:
        """Where the cgroup ``path`` of a /proc/PID/cgroup line (its hierarchy's ``controllers``: empty
        for cgroup v2) is mounted on this machine, per /proc/self/mountinfo (None: not mounted here)."""
        if self._mounts is None:
            raw = self._read_path(f"{self.root}/self/mountinfo")
            self._mounts = cgroup_mounts(raw.decode(errors="replace") if raw else "")
        wanted = frozenset(filter(None, controllers.split(",")))
        for options, root, point in self._mounts:
            if (options is None) == (not wanted) and (options is None or wanted <= options):
                inside = path if root == "/" else path[len(root):] if path.startswith(root + "/") else None
                if inside is not None:
                    return point + inside
        return None

    def environ(self, pid: int, names: frozenset[str]) -> dict[str, str]:
        """The named variables of the process's initial environment (empty if unreadable)."""
        raw = self.read(pid, "environ")
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


class KeptFiles:
    """/proc/PID/NAME of the processes read every tick, each kept open and read again from offset 0
    (the kernel writes the content anew on each read): one ``pread`` per process and tick instead of
    open, read and close. A kept descriptor stays bound to its process: once that process exits
    the read fails (ESRCH), so a PID taken over by a new process is opened anew, never read as
    the old one. At most ``limit`` are kept (an eighth of the descriptor limit per file name); past
    that, files are opened per read. Used by one thread only (the sampler's)."""

    def __init__(self, proc: ProcFs, name: str, size: int, limit: int | None = None) -> None:
        self.proc = proc
        self.name = name
        self.size = size
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.limit = limit if limit is not None else 2048 if soft == resource.RLIM_INFINITY else soft // 8
        self._fds: dict[int, int] = {}

    def read(self, pid: int) -> bytes | None:
        """The file's content (its first ``size`` bytes); None when the process is gone or the file
        unreadable (another user's process to an agent that is not root)."""
        fd = self._fds.get(pid)
        if fd is not None:
            try:
                raw = os.pread(fd, self.size, 0)
                if raw:
                    return raw
            except OSError:
                pass
            self._close(pid)  # the process exited: a new one under this PID is opened below
        if len(self._fds) >= self.limit:
            return self.proc.read(pid, self.name, self.size) or None
        try:
            fd = os.open(f"{self.proc.root}/{pid}/{self.name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            raw = os.pread(fd, self.size, 0)
        except OSError:
            raw = b""
        if not raw:
            os.close(fd)
            return None
        self._fds[pid] = fd
        return raw

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


class StatFiles(KeptFiles):
    """/proc/PID/stat, kept open (`KeptFiles`), parsed."""

    def __init__(self, proc: ProcFs, limit: int | None = None) -> None:
        super().__init__(proc, "stat", STAT_MAX, limit)

    def stat(self, pid: int) -> Stat | None:
        raw = self.read(pid)
        return parse_stat(raw) if raw else None


IO_MAX = 1024  # /proc/PID/io is seven short lines


def parse_io(raw: bytes) -> tuple[int, int] | None:
    """(rchar, wchar) of a /proc/PID/io text, whose first two lines they are (proc(5)); None when
    the text is not that."""
    first, second, _ = (raw.split(b"\n", 2) + [b"", b""])[:3]
    if not (first.startswith(b"rchar: ") and second.startswith(b"wchar: ")):
        return None
    try:
        return int(first[7:]), int(second[7:])
    except ValueError:
        return None


def _unescape(field: str) -> str:
    r"""A mountinfo path: space, tab, newline and backslash written as octal escapes (``\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_mounts(mountinfo: str) -> list[tuple[frozenset[str] | None, str, str]]:
    """(controllers, root, mount point) of every cgroup mount in a /proc/PID/mountinfo text, in its
    order: controllers None for cgroup v2, else the v1 hierarchy's super options (its controllers,
    ``name=systemd``, ...); root is the hierarchy's directory the mount shows (proc(5))."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        kind = line.split(" - ", 1)[1].split()
        if not kind or kind[0] not in ("cgroup", "cgroup2"):
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4]).rstrip("/")
        options = None if kind[0] == "cgroup2" else frozenset((kind[2] if len(kind) > 2 else "").split(","))
        out.append((options, root.rstrip("/") or "/", point))
    return out


PROCS_READ = 65536


class CgroupTree:
    """The PIDs in a cgroup directory and every one below it (a cgroup's ``cgroup.procs`` lists only
    its own members): a job's processes without listing /proc. Each directory's ``cgroup.procs`` is
    kept open and read again from offset 0; the directories are listed again when cgroup v2's
    ``cgroup.stat`` counts other descendants or a read fails (a directory removed), and on every
    call where there is no ``cgroup.stat`` (cgroup v1). Used by one thread only (the sampler's)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fds: dict[str, int] = {}  # directory -> its cgroup.procs, open
        self._stat: int | None = None  # cgroup.stat of the top directory, open (v2); -1: it has none (v1)
        self._descendants: bytes | None = None  # its nr_descendants line when the directories were listed

    def pids(self) -> set[int] | None:
        """The PIDs in the tree now; None once its top directory is gone (the job's cgroup removed)."""
        count = self._count()
        if count is None or count != self._descendants or not self._fds:
            if not self._list():
                return None
            self._descendants = count
        found = self._read_all()
        if found is None:  # a directory went away under us: list again, once
            if not self._list():
                return None
            found = self._read_all()
        return found

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._stat is not None and self._stat >= 0:
            os.close(self._stat)
        self._stat = None

    def _count(self) -> bytes | None:
        """cgroup v2's ``nr_descendants`` line of the top directory (None: no such file, v1)."""
        if self._stat is None:
            try:
                self._stat = os.open(f"{self.path}/cgroup.stat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self._stat = -1
        if self._stat < 0:
            return None
        try:
            raw = os.pread(self._stat, 4096, 0)
        except OSError:
            return None
        return next((line for line in raw.splitlines() if line.startswith(b"nr_descendants ")), None)

    def _list(self) -> bool:
        """Open the cgroup.procs of every directory now in the tree (those kept stay open); False
        when the top directory is gone."""
        found: list[str] = []
        stack = [self.path]
        while stack:
            d = stack.pop()
            try:
                with os.scandir(d) as entries:
                    stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))
            except OSError:
                if d == self.path:
                    self.close()
                    return False
                continue
            found.append(d)
        for d in [d for d in self._fds if d not in found]:
            os.close(self._fds.pop(d))
        for d in found:
            if d not in self._fds:
                try:
                    self._fds[d] = os.open(f"{d}/cgroup.procs", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    continue
        return True

    def _read_all(self) -> set[int] | None:
        out: set[int] = set()
        for fd in self._fds.values():
            chunks, at = [], 0
            try:
                while chunk := os.pread(fd, PROCS_READ, at):
                    chunks.append(chunk)
                    at += len(chunk)
            except OSError:
                return None
            out.update(map(int, b"".join(chunks).split()))
        return out
