"""Real parts for the tests: a private PostgreSQL for the session, a real collector process."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from jobpulse.collector.embedded.postgres import EmbeddedPostgres, free_port, migrated
from jobpulse.collector.store.migrate import migrations
from jobpulse.collector.store.tiers import partitions

TOKEN = "test-token-0123456789"
_db_names = itertools.count()

# Tiers (`make test` runs them in this order, the first failing fast): unit (no process, no server),
# pg (a real PostgreSQL), system (real agents, collectors, HTTP), slurm, citus, packaging (wheels and
# fresh virtual environments). Slurm clusters queue for one of a few machine-wide slots (`slurm_cluster.SLOTS`), so their
# tests may wait for another worker's: they get a longer limit.
_SLURM = {"test_slurm.py", "test_slurm_mig.py", "test_slurm_policy.py", "test_slurm_accounting.py",
          "test_slurm_versions.py", "test_slurm_queue.py", "test_slurm_runs.py", "test_policy_tenancy.py"}
_PACKAGING = {"test_packaging.py"}
_SYSTEM_FIXTURES = {"collector", "shared_collector", "fake_nvml", "private_postgres"}
_SYSTEM_FILES = {"test_demo.py"}  # starts the whole system itself, as a user would


def _tier(item: pytest.Item) -> str:
    path = Path(str(item.fspath))
    fixtures = set(getattr(item, "fixturenames", ()))
    if path.name in _SLURM:
        return "slurm"
    if item.get_closest_marker("citus") or path.name == "test_citus.py":
        return "citus"
    if path.name in _PACKAGING or "wheel" in item.name:
        return "packaging"
    if path.name in _SYSTEM_FILES or fixtures & _SYSTEM_FIXTURES or "start_collector" in path.read_text():
        return "system"
    if fixtures & {"dsn", "postgres"}:
        return "pg"
    return "unit"


# `make test` hands each worker a whole file (module fixtures are set up once) in this order, the
# longest first, so that the run does not end waiting on one long file; the Slurm units (`_group`)
# go first, on as many workers as there are cluster slots at once. A file not named here
# goes after these, in collection order: name any file that takes over half a minute (a run's
# `--durations` table shows each test's time).
_LONGEST_FIRST = ("slurm", "test_citus.py", "test_trace_captures.py", "test_local_user.py", "test_recordings.py",
                  "test_packaging.py", "test_rules_live.py", "test_scenarios.py", "test_scenarios_second_half.py",
                  "test_pyramid.py", "test_watch.py", "test_mig.py", "test_events.py", "test_captures.py",
                  "test_import.py", "test_shared_gpu.py", "test_compact.py", "test_agent_edges.py", "test_notify.py",
                  "test_agent_e2e.py", "test_api_fuzz.py", "test_grafana.py", "test_hardening.py")


def _group(nodeid: str) -> str:
    """A test's work unit: its file (module fixtures are set up once), and a Slurm file's tests of
    one version apart from its other versions' (each version's cluster is the module's fixture): the
    units wait for one of `slurm_cluster.SLOTS` cluster slots, so that many run side by side."""
    name = Path(nodeid.split("::", 1)[0]).name
    version = re.search(r"\[(slurm-[0-9.]+)", nodeid) if name in _SLURM else None
    return f"{name}[{version.group(1)}]" if version else name


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with the Slurm files one work unit (xdist's own groups, a suffix it puts on
    node ids, are lost on pytest 9, which derives them itself); `--no-loadscope-reorder` keeps ours."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByFile(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = _tier(item)
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "slurm":
            item.add_marker(pytest.mark.timeout(900))
    rank = {g: i for i, g in enumerate(_LONGEST_FIRST)}
    items.sort(key=lambda item: rank["slurm"] if item.get_closest_marker("slurm") else  # stable: a file's own order stays
               rank.get(_group(item.nodeid), len(rank)))


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    # Under /tmp, not pytest's 0700 folder: as root, the server runs as an unprivileged user.
    base = Path(tempfile.mkdtemp(prefix="jobpulse-test-pg-"))
    pg = EmbeddedPostgres(base / "data", settings={"fsync": "off"})
    pg.start()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE DATABASE jobpulse_template")
    with psycopg.connect(dsn_for(pg, "jobpulse_template"), autocommit=True) as conn:
        migrations.upgrade(conn)
        partitions.ensure_ahead(conn, 3)
    yield pg
    pg.stop()
    shutil.rmtree(base, ignore_errors=True)


def dsn_for(pg: EmbeddedPostgres, database: str) -> str:
    return f"postgresql://{pg.user}@127.0.0.1:{pg.port}/{database}"


@pytest.fixture
def dsn(postgres: EmbeddedPostgres) -> str:
    """A fresh, migrated database for one test (cloned from a migrated template)."""
    name = f"t{os.getpid()}_{next(_db_names)}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE jobpulse_template')
    return dsn_for(postgres, name)


@dataclass
class RunningCollector:
    url: str
    token: str
    proc: subprocess.Popen[bytes]
    log: Path

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout)

    def rule_cycles(self) -> int:
        """Rule cycles this collector has finished (its /metrics' cycle-time histogram count)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        found = re.search(r"^jobpulse_collector_rule_cycle_seconds_count (\S+)$", text, re.M)
        return int(float(found.group(1))) if found else 0

    def wait_for_rule_cycles(self, n: int, timeout: float = 60) -> None:
        """Until ``n`` more rule cycles have finished: a check that nothing happens twice holds only
        once further cycles ran, however slow the machine."""
        target = self.rule_cycles() + n
        deadline = time.monotonic() + timeout
        while self.rule_cycles() < target:
            assert time.monotonic() < deadline, f"fewer than {n} rule cycles in {timeout} s"
            time.sleep(0.2)


def start_collector(dsn: str, workdir: Path, *extra: str, port: int | None = None) -> RunningCollector:
    """Run `jobpulse collector serve` as its own process and wait until it answers."""
    tokens = workdir / "tokens"
    tokens.write_text(f"# agents\nother-token\n{TOKEN}\n")
    port = port or free_port()
    log = workdir / f"collector-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobpulse.collector.cli", "collector", "serve", "--dsn", dsn,
         "--listen", f"127.0.0.1:{port}", "--token-file", str(tokens), *extra],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"collector exited: {log.read_text()}")
        try:
            httpx.get(f"{url}/openapi.json", timeout=1)
            return RunningCollector(url, TOKEN, proc, log)
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"collector did not start: {log.read_text()}")


def stop_world(ranks: Iterable[subprocess.Popen[bytes]], agent: Any, collector: RunningCollector | None) -> None:
    """A test's ranks killed, its agent and collector stopped (a test's `finally`)."""
    for rank in ranks:
        rank.kill()
    agent.stop()
    stop_collector(collector)


def stop_collector(c: RunningCollector | None) -> None:
    """SIGTERM and wait (kill after 15 s); None (a test that had not started it yet) is nothing to stop."""
    if c is None:
        return
    c.proc.send_signal(signal.SIGTERM)
    try:
        c.proc.wait(15)
    except subprocess.TimeoutExpired:
        c.proc.kill()
        c.proc.wait()


@contextlib.contextmanager
def serving(dsn: str, tmp_path: Path, *args: str) -> Iterator[RunningCollector]:
    """A collector for the length of a test; its log must hold no traceback."""
    c = start_collector(dsn, tmp_path, *args)
    try:
        yield c
    finally:
        stop_collector(c)
    assert "Traceback" not in c.log.read_text(), c.log.read_text()


@pytest.fixture
def collector(dsn: str, tmp_path: Path) -> Iterator[RunningCollector]:
    with serving(dsn, tmp_path, "--max-body-mb", "2") as c:
        yield c


@pytest.fixture
def quiet_collector(dsn: str, tmp_path: Path) -> Iterator[RunningCollector]:
    """The collector with its rules asleep: the test runs the cycles (a cycle of the collector's own,
    every 30 s, would open flags and ask their captures halfway through a slow seed)."""
    with serving(dsn, tmp_path, "--max-body-mb", "2", "--rules-interval", "86400") as c:
        yield c


@dataclass
class Shared:
    collector: RunningCollector
    dsn: str


@pytest.fixture(scope="module")
def shared_collector(postgres: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """One collector and database for a module's many cases that each send one request (refusals,
    fuzzing): a collector start per case was most of their time. A case that must see nothing stored
    sees the module's requests so far, and nothing must have been stored by them either."""
    name = f"m{os.getpid()}_{next(_db_names)}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE jobpulse_template')
    dsn = dsn_for(postgres, name)
    with serving(dsn, tmp_path_factory.mktemp("shared-collector"), "--max-body-mb", "2") as c:
        yield Shared(c, dsn)


@pytest.fixture
def private_postgres() -> Iterator[EmbeddedPostgres]:
    """A migrated PostgreSQL of the test's own, for tests that stop and restart the server."""
    with migrated("jobpulse-private-pg-", {"fsync": "off"}, days_ahead=2) as pg:
        yield pg


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libnvidia-ml.so.1, compiled once per test session."""
    from .agents import build_fake_nvml

    return build_fake_nvml(tmp_path_factory.mktemp("fake_nvml"))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs: full after a few batches. Mounting needs root (CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; CI runs this as root")
    where = tmp_path / "tiny"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)
