"""`jobpulse db upgrade`: the schema in two layers (docs/database.md).

1. Migrations (``jobpulse.schema.migrations``, append-only): tables, columns, indexes; then the
   field table's columns (`field_columns`: a new field's sample and roll-up columns, made here). Each file
   ``NNNN_name.sql`` runs once, in its own transaction, under an advisory lock so two collectors
   starting together cannot race, and is recorded in ``jobpulse.schema_migrations`` by number, name
   and checksum. A recorded migration whose shipped file has another name or other content is
   refused with a message saying which: a renamed, renumbered or edited migration is never skipped
   silently (rows recorded before checksums were kept adopt the shipped file's).
2. Functions and views (``store/migrate/sql/*.sql``, one file per object, CREATE OR REPLACE): re-applied in
   file order whenever a file's checksum differs from the one recorded in ``jobpulse.schema_objects``
   (`objects`), and all of them after any migration ran (an old migration may re-create an older
   definition). Then the functions generated from the field table are brought in line through the
   same ledger (`series.py`, or `citus.ensure_readers` on a coordinator). Running it again is a no-op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from jobpulse.collector.store.migrate import citus, field_columns
from jobpulse.collector.store.migrate import objects as ledger
from jobpulse.collector.store.read import series

_LOCK_KEY = 0x6A6F6270  # "jobp": serializes concurrent upgrades
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_OBJECT = re.compile(r"^\d{2}_([a-z0-9_]+)\.sql$")


class MigrationMismatch(ValueError):
    """The database recorded a migration the shipped files no longer hold as it was applied."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return ledger.checksum(self.sql)


@dataclass(frozen=True)
class SqlObject:
    """One function or view of the re-appliable layer."""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return ledger.checksum(self.sql)


def objects() -> list[SqlObject]:
    """The functions and views shipped with this version, in the order they are applied."""
    found = []
    for entry in sorted(resources.files("jobpulse.collector.store.migrate").joinpath("sql").iterdir(), key=lambda e: e.name):
        m = _OBJECT.match(entry.name)
        if m:
            found.append(SqlObject(m.group(1), entry.read_text(encoding="utf-8")))
    return found


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


def _check(mig: Migration, name: str, checksum: str | None) -> None:
    if name != mig.name:
        raise MigrationMismatch(
            f"migration {mig.version:04d} was applied as {name!r}, but this version ships {mig.name!r}: a migration "
            f"was renamed or renumbered; restore it, and add changes as a new migration")
    if checksum is not None and checksum != mig.checksum:
        raise MigrationMismatch(
            f"migration {mig.version:04d}_{mig.name} differs from the one applied to this database (checksum "
            f"{checksum[:12]}, shipped {mig.checksum[:12]}): migrations are append-only; restore it, and add "
            f"changes as a new migration")


def upgrade(conn: psycopg.Connection) -> list[Migration]:
    """Apply every migration not yet applied, then every changed function or view; returns the
    migrations applied now. MigrationMismatch (nothing changed) when a recorded one was altered."""
    applied = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS jobpulse")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS jobpulse.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("ALTER TABLE jobpulse.schema_migrations ADD COLUMN IF NOT EXISTS checksum text")
        conn.execute("CREATE TABLE IF NOT EXISTS jobpulse.schema_objects ("
                     " name text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        # Every shipped migration not recorded, not only those above the highest: branches that
        # each add one can land in either order, and a database upgraded in between then still
        # gets the lower-numbered one.
        done = {v: (n, c) for v, n, c in conn.execute("SELECT version, name, checksum FROM jobpulse.schema_migrations")}
        shipped = available()
        for mig in shipped:
            if mig.version in done:
                _check(mig, *done[mig.version])
        for mig in shipped:
            if mig.version in done:
                if done[mig.version][1] is None:  # recorded before checksums: adopt the shipped file's
                    conn.execute("UPDATE jobpulse.schema_migrations SET checksum = %s WHERE version = %s",
                                 (mig.checksum, mig.version))
                continue
            with conn.transaction():
                conn.execute(mig.sql.encode())
                conn.execute(
                    "INSERT INTO jobpulse.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (mig.version, mig.name, mig.checksum),
                )
            applied.append(mig)
        field_columns.ensure(conn)  # a field new to the field table: its columns, before anything reads them
        made = ledger.recorded(conn)
        for obj in objects():  # after any migration, all of them: it may have re-created an older one
            if applied or made.get(obj.name) != obj.checksum:
                conn.execute(obj.sql.encode())
                ledger.record(conn, obj.name, obj.sql)
        if citus.available(conn):
            citus.ensure_readers(conn)
        else:
            series.ensure(conn)
    return applied
