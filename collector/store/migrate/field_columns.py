"""The field table's columns in every table that keeps fields, made by `jobpulse db upgrade` from
`schema/fields.py`: a sample table has a column per field, a roll-up table one per roll-up aggregate
the field declares (`Field.rollup`), and `gpu_rollup_10s` has `gpu_rollup`'s (one reader returns
either's rows). Adding a field is one row in the field table; the migrations hold the columns of the
fields that came before this was generated, and nothing here ever drops or changes a column."""

from __future__ import annotations

from typing import Any

import psycopg

from jobpulse.collector.store.tiers.rollup import FINE_TABLE
from jobpulse.schema.fields import FABRIC_FIELDS, GPU_FIELDS, PROCESS_FIELDS, Aggregate, Field

_ROLLUP_TYPE: dict[Aggregate, str] = {"sum": "double precision", "count": "integer NOT NULL DEFAULT 0",
                                      "true": "integer NOT NULL DEFAULT 0"}
"""A roll-up column's type by its aggregate (a mean's sum, a count); the others keep the field's type."""

TABLES: tuple[tuple[str, tuple[Field, ...], bool], ...] = (
    ("gpu_samples", GPU_FIELDS, False), ("process_samples", PROCESS_FIELDS, False),
    ("gpu_rollup", GPU_FIELDS, True), (FINE_TABLE, GPU_FIELDS, True), ("process_rollup", PROCESS_FIELDS, True),
    ("fabric_samples", FABRIC_FIELDS, False))
"""(table, its fields, whether it keeps their roll-up aggregates rather than the values)."""


def declared(table: tuple[Field, ...], rollup: bool) -> dict[str, str]:
    """Column -> SQL type, as the field table declares them for a sample or a roll-up table."""
    if not rollup:
        return {f.name: f.sql for f in table}
    return {column: _ROLLUP_TYPE.get(agg, f.sql) for f in table for column, agg in f.rollup.items()}


def missing(conn: psycopg.Connection[Any]) -> list[str]:
    """The statements that add the declared columns a table lacks."""
    out = []
    for table, table_fields, rollup in TABLES:
        have = {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns"
                                           " WHERE table_schema = 'jobpulse' AND table_name = %s", (table,))}
        adds = [f"ADD COLUMN {column} {sql}" for column, sql in declared(table_fields, rollup).items()
                if column not in have]
        if adds:
            out.append(f"ALTER TABLE jobpulse.{table} {', '.join(adds)}")
    return out


def ensure(conn: psycopg.Connection[Any]) -> bool:
    """Add what `missing` finds; True if anything was added."""
    statements = missing(conn)
    for statement in statements:
        conn.execute(statement.encode())
    return bool(statements)
