"""A private PostgreSQL server in a folder of its own: for the test suite, benchmarks and the demo.

It uses the system's PostgreSQL binaries (``initdb``/``pg_ctl`` on PATH or under
``/usr/lib/postgresql/*/bin``) and falls back to the ``pgserver`` wheel's bundled binaries.
PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user (or
``nobody``) and the data folder is handed to that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bindir() -> Path:
    """Folder holding initdb, pg_ctl and postgres: $JOBPULSE_PG_BINDIR, PATH, the newest
    /usr/lib/postgresql version, else the pgserver wheel."""
    if os.environ.get("JOBPULSE_PG_BINDIR"):
        return Path(os.environ["JOBPULSE_PG_BINDIR"])
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                      key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if versions:
        return Path(versions[-1]).parent
    try:
        import pgserver
    except ImportError:
        raise PostgresNotFound(
            "no PostgreSQL server found: install Debian's 'postgresql' package or 'pip install pgserver'"
        ) from None
    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    """The unprivileged user to run the server as when we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and neither 'postgres' nor 'nobody' exists")


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server owned by this process. ``start()`` initializes the folder if empty."""

    datadir: Path
    port: int = field(default_factory=free_port)
    user: str = "jobpulse"
    database: str = "jobpulse"
    settings: dict[str, str] = field(default_factory=dict)
    private_socket: Path | None = None  # serve only on a Unix socket here, for its owner alone (no TCP)

    def __post_init__(self) -> None:
        self.datadir = Path(self.datadir)
        self.bindir = find_bindir()
        self.os_user = _run_as()
        self.sockdir = self.private_socket or self.datadir.parent / f"{self.datadir.name}.sock"
        self.logfile = self.datadir.parent / f"{self.datadir.name}.log"
        self.pid: int | None = None

    @property
    def dsn(self) -> str:
        if self.private_socket:
            return f"postgresql://{self.user}@/{self.database}?host={self.sockdir}&port={self.port}"
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def _host(self) -> str:
        return str(self.sockdir) if self.private_socket else "127.0.0.1"

    def _cmd(self, *args: str) -> list[str]:
        argv = [str(self.bindir / args[0]), *args[1:]]
        runuser = shutil.which("runuser") or "/usr/sbin/runuser"  # /usr/sbin may be off PATH
        return [runuser, "-u", self.os_user, "--", *argv] if self.os_user else argv

    def _run(self, *args: str) -> None:
        done = subprocess.run(self._cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            hint = ""
            if self.os_user:
                hint = f" (the server runs as {self.os_user!r}: every folder above {self.datadir} must be searchable by it)"
            log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
            raise RuntimeError(f"{args[0]} failed{hint}: {done.stdout.decode(errors='replace').strip()} {log}".strip())

    def _chown(self, *paths: Path) -> None:
        """Handed to the server's user, never through a link (a folder or file a link stands in for
        is refused, not changed)."""
        if self.os_user:
            pw = pwd.getpwnam(self.os_user)
            for p in paths:
                if os.path.islink(p):
                    raise RuntimeError(f"{p} is a link: refused")
                os.chown(p, pw.pw_uid, pw.pw_gid, follow_symlinks=False)

    def _make_log(self) -> None:
        """The server's log file, opened without following a link."""
        try:
            os.close(os.open(self.logfile, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600))
        except OSError as exc:
            raise RuntimeError(f"cannot make the server's log {self.logfile}: {exc.strerror}") from None

    def initdb(self) -> None:
        self.datadir.mkdir(parents=True, exist_ok=True)
        self.sockdir.mkdir(parents=True, exist_ok=True)
        self._make_log()
        self._chown(self.datadir, self.sockdir, self.logfile)
        # The parent must be traversable by the server's user.
        os.chmod(self.datadir.parent, os.stat(self.datadir.parent).st_mode | 0o711)
        # A server run without fsync (tests, throw-away clusters) need not wait for its files to reach the disk.
        nosync = ["--no-sync"] if self.settings.get("fsync") == "off" else []
        self._run("initdb", "-D", str(self.datadir), "-U", self.user, "-A", "trust", "-E", "UTF8", "--no-locale", *nosync)

    def start(self, timeout: float = 60) -> None:
        if not (self.datadir / "PG_VERSION").exists():
            self.initdb()
            created = True
        else:
            created = False
        if self.private_socket:  # trust auth is safe only where nobody else can connect
            self.sockdir.mkdir(parents=True, exist_ok=True)
            self._chown(self.sockdir)
        opts = {"listen_addresses": "''" if self.private_socket else "127.0.0.1", "port": str(self.port),
                "unix_socket_directories": str(self.sockdir),
                **({"unix_socket_permissions": "0700"} if self.private_socket else {}), **self.settings}
        optstr = " ".join(f"-c {k}={v}" for k, v in opts.items())
        self._make_log()
        self._chown(self.logfile)
        self._run("pg_ctl", "-D", str(self.datadir), "-l", str(self.logfile), "-w", "-t", str(int(timeout)),
                  "-o", optstr, "start")
        with contextlib.suppress(OSError, ValueError, IndexError):  # stop() can reach it without its folder
            self.pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        if created:
            self._run("createdb", "-h", self._host, "-p", str(self.port), "-U", self.user, self.database)

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl's stop; and when that cannot reach the server (its folder moved or removed), the
        postmaster this object started is stopped by its PID (SIGINT: a fast shutdown)."""
        if (self.datadir / "postmaster.pid").exists():
            subprocess.run(self._cmd("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "stop"),
                           check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.pid is None or not self._is_ours(self.pid):
            return
        for sig, wait_s in ((signal.SIGINT, 30.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and self._is_ours(self.pid):
                time.sleep(0.1)
            if not self._is_ours(self.pid):
                return

    def _is_ours(self, pid: int) -> bool:
        """``pid`` is still a running postgres server started on this data folder's path."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return bool(argv) and Path(argv[0].decode(errors="replace")).name == "postgres" and \
            str(self.datadir).encode() in argv

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def migrated(prefix: str, settings: dict[str, str] | None = None, days_ahead: int = 1) -> Iterator[EmbeddedPostgres]:
    """A started server in a fresh temporary folder with the current schema and ``days_ahead`` days
    of partitions; stopped and deleted afterwards (tests that restart the server, benchmarks)."""
    from jobpulse.collector.store.migrate import migrations  # the server alone needs no schema
    from jobpulse.collector.store.tiers import partitions

    base = Path(tempfile.mkdtemp(prefix=prefix))
    pg = EmbeddedPostgres(base / "data", settings=settings or {})
    pg.start()
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            migrations.upgrade(conn)
            partitions.ensure_ahead(conn, days_ahead)
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)
