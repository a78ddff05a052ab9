"""A private Citus cluster on this machine: a coordinator and workers, each an `EmbeddedPostgres` with
a port and data folder of its own, for the test suite and the benchmarks that compare one server with
a cluster. Each server is stopped by its postmaster's PID (read from its ``postmaster.pid``), so a
stop never depends on anything but the process this object started.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from jobpulse.collector.embedded.postgres import EmbeddedPostgres, find_bindir

_SETTINGS = {
    "shared_preload_libraries": "citus",
    "max_connections": "200",
    # one machine: the coordinator opens few connections per worker, so three servers share two cores
    "citus.max_adaptive_executor_pool_size": "4",
}


class CitusNotInstalled(RuntimeError):
    """The PostgreSQL server binaries found have no citus.so."""


def citus_library() -> Path:
    """Where citus.so must be for the PostgreSQL binaries `EmbeddedPostgres` runs."""
    bindir = find_bindir()
    return bindir.parent / "lib" / "citus.so"


def citus_installed() -> bool:
    return citus_library().exists()


def stop_by_pid(pg: EmbeddedPostgres, timeout: float = 30) -> None:
    """Fast shutdown of the server whose PID its ``postmaster.pid`` names (SIGINT), waiting until it
    is gone; SIGKILL past ``timeout``."""
    pidfile = pg.datadir / "postmaster.pid"
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text().split("\n", 1)[0])
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


@dataclass
class EmbeddedCitus:
    """A coordinator and ``workers`` workers under ``base``; ``start()`` initializes them if empty and
    registers the workers with the coordinator."""

    base: Path
    workers: int = 2
    database: str = "jobpulse"
    settings: dict[str, str] = field(default_factory=dict)  # on every server, over the Citus ones
    servers: list[EmbeddedPostgres] = field(init=False)

    def __post_init__(self) -> None:
        if not citus_installed():
            raise CitusNotInstalled(f"Citus is not installed: {citus_library()} is missing")
        self.base = Path(self.base)
        self.servers = [EmbeddedPostgres(self.base / name, database=self.database,
                                         settings={**_SETTINGS, **self.settings})
                        for name in ["coordinator", *(f"worker{i + 1}" for i in range(self.workers))]]

    @property
    def coordinator(self) -> EmbeddedPostgres:
        return self.servers[0]

    @property
    def dsn(self) -> str:
        return self.coordinator.dsn

    def start(self) -> None:
        try:
            for pg in self.servers:
                pg.start()
            self.create_database(self.database, exists=True)
        except BaseException:
            self.stop()
            raise

    def create_database(self, name: str, exists: bool = False) -> str:
        """A database ``name`` on every server with the extension, its workers registered; its DSN
        on the coordinator. (Citus 12.1 does not propagate CREATE DATABASE.)"""
        for pg in self.servers:
            if not exists:
                with psycopg.connect(pg.dsn, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
            with psycopg.connect(self.dsn_of(pg, name), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
        with psycopg.connect(self.dsn_of(self.coordinator, name), autocommit=True) as conn:
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", (self.coordinator.port,))
            for pg in self.servers[1:]:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", (pg.port,))
        return self.dsn_of(self.coordinator, name)

    @staticmethod
    def dsn_of(pg: EmbeddedPostgres, database: str) -> str:
        return f"postgresql://{pg.user}@127.0.0.1:{pg.port}/{database}"

    def stop(self) -> None:
        for pg in reversed(self.servers):
            stop_by_pid(pg)

    @contextmanager
    def running(self) -> Iterator[EmbeddedCitus]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
