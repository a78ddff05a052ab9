"""The ledger of database objects (`jobpulse.schema_objects`): every function and view jobpulse
defines, hand-written (`sql/*.sql`, one object a file) or generated from the field table (`series`,
`compact`, `coarse`), is recorded by name with its definition's checksum and made again only when
that changes. One mechanism for both, so "where is this function defined, and is it current?" has
one answer: its ledger row names the file or the generator."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg


def checksum(definition: str) -> str:
    return hashlib.sha256(definition.encode()).hexdigest()


def recorded(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Name -> checksum of every object the ledger holds."""
    return dict(conn.execute("SELECT name, checksum FROM jobpulse.schema_objects").fetchall())


def current(conn: psycopg.Connection[Any], name: str, definition: str) -> bool:
    """Whether ``name`` was last made from this very definition."""
    row = conn.execute("SELECT checksum FROM jobpulse.schema_objects WHERE name = %s", (name,)).fetchone()
    return bool(row and row[0] == checksum(definition))


def record(conn: psycopg.Connection[Any], name: str, definition: str) -> None:
    conn.execute("INSERT INTO jobpulse.schema_objects (name, checksum) VALUES (%s, %s) ON CONFLICT (name)"
                 " DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()", (name, checksum(definition)))


def forget(conn: psycopg.Connection[Any], name: str) -> None:
    """``name``'s objects were dropped: the next `db upgrade` (or its generator) makes them again."""
    conn.execute("DELETE FROM jobpulse.schema_objects WHERE name = %s", (name,))
