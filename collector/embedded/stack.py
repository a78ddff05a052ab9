"""The central half of jobpulse on one machine, as `demo` and `watch` start it: a private
PostgreSQL with the current schema, and a collector serving on a free loopback port."""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from jobpulse.collector.embedded.postgres import EmbeddedPostgres, free_port
from jobpulse.collector.store.migrate import migrations
from jobpulse.collector.store.tiers import partitions

Spawn = Callable[[list[str], Path], "subprocess.Popen[bytes]"]


def database(folder: Path, private_socket: Path | None = None) -> EmbeddedPostgres:
    """The server in ``folder`` (created there the first time), started, its schema current;
    ``private_socket``: reachable only by its owner through a Unix socket there (no TCP port)."""
    pg = EmbeddedPostgres(folder, private_socket=private_socket)
    pg.start()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        migrations.upgrade(conn)
        partitions.ensure_ahead(conn, 2)
    return pg


def collector(spawn: Spawn, dsn: str, tokens: Path, log: Path, *extra: str, host: str | None = None) -> str:
    """`jobpulse collector serve` through ``spawn`` (the caller keeps and stops it); its URL once it
    answers. On loopback, unless ``host`` (a name other machines reach it by): then on every address."""
    port = free_port()
    spawn([sys.executable, "-m", "jobpulse.collector.cli", "collector", "serve", "--dsn", dsn, "--listen",
           f"{'0.0.0.0' if host else '127.0.0.1'}:{port}", "--token-file", str(tokens), *extra], log)
    for _ in range(300):
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz")
            return f"http://{host or '127.0.0.1'}:{port}"
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the collector did not start (see {log})")
