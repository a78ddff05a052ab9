"""`jobpulse db upgrade`: apply the SQL migrations shipped in ``jobpulse.schema.migrations``.

Each file ``NNNN_name.sql`` runs once, in its own transaction, under an advisory lock so two
collectors starting together cannot race; applied versions are recorded in
``jobpulse.schema_migrations``. Then `gpu_series` is brought in line with the field table (see
`series.py`). Running it again is a no-op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from jobpulse.collector.store import citus, series

_LOCK_KEY = 0x6A6F6270  # "jobp": serializes concurrent upgrades
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    """The migrations shipped with this version of jobpulse, in order."""
    found = []
    for entry in resources.files("jobpulse.schema").joinpath("migrations").iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda mig: mig.version)


def current_version(conn: psycopg.Connection) -> int:
    """The highest applied migration, 0 for an empty database."""
    row = conn.execute("SELECT to_regclass('jobpulse.schema_migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM jobpulse.schema_migrations").fetchone()
    return int(row[0]) if row else 0


def upgrade(conn: psycopg.Connection) -> list[Migration]:
    """Apply every migration not yet applied; returns those applied now."""
    applied = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS jobpulse")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS jobpulse.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        # Every shipped migration not recorded, not only those above the highest: branches that
        # each add one can land in either order, and a database upgraded in between then still
        # gets the lower-numbered one.
        done = {v for (v,) in conn.execute("SELECT version FROM jobpulse.schema_migrations")}
        for mig in available():
            if mig.version in done:
                continue
            with conn.transaction():
                conn.execute(mig.sql.encode())
                conn.execute(
                    "INSERT INTO jobpulse.schema_migrations (version, name) VALUES (%s, %s)",
                    (mig.version, mig.name),
                )
            applied.append(mig)
        if citus.available(conn):
            citus.ensure_readers(conn)
        else:
            series.ensure(conn)
    return applied
