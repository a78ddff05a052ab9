"""Daily range partitions of the time-series tables: create ahead, drop past retention.

The partitioned tables are discovered from the catalog (every partitioned table in schema
``jobpulse``), so a new time-series table needs no change here. Partitions are named
``<table>_pYYYYMMDD`` and cover one UTC day. Retention drops whole partitions.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

import psycopg
from psycopg import sql

_LOCK_KEY = 0x6A6F6271  # serializes partition DDL between collectors
_SUFFIX = re.compile(r"_p(\d{8})$")


def utc_today() -> date:
    return datetime.now(UTC).date()


def parent_tables(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_partitioned_table p"
        " JOIN pg_class c ON c.oid = p.partrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'jobpulse' ORDER BY 1"
    ).fetchall()
    return [r[0] for r in rows]


def existing(conn: psycopg.Connection) -> dict[str, set[date]]:
    """Days that have a partition, per parent table."""
    rows = conn.execute(
        "SELECT parent.relname, child.relname FROM pg_inherits i"
        " JOIN pg_class parent ON parent.oid = i.inhparent"
        " JOIN pg_class child ON child.oid = i.inhrelid"
        " JOIN pg_namespace n ON n.oid = parent.relnamespace"
        " WHERE n.nspname = 'jobpulse'"
    ).fetchall()
    days: dict[str, set[date]] = {t: set() for t in parent_tables(conn)}
    for parent, child in rows:
        m = _SUFFIX.search(child)
        if m:
            days.setdefault(parent, set()).add(datetime.strptime(m.group(1), "%Y%m%d").date())
    return days


def common_days(conn: psycopg.Connection) -> set[date]:
    """Days for which every time-series table has a partition (what ingest may write)."""
    per_table = existing(conn).values()
    return set.intersection(*per_table) if per_table else set()


def ensure(conn: psycopg.Connection, days: list[date]) -> list[str]:
    """Create the partitions for ``days`` that do not exist yet; returns the names created."""
    created = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        have = existing(conn)
        for table, present in have.items():
            for day in sorted(set(days) - present):
                name = f"{table}_p{day:%Y%m%d}"
                conn.execute(
                    sql.SQL("CREATE TABLE IF NOT EXISTS jobpulse.{} PARTITION OF jobpulse.{}"
                            " FOR VALUES FROM ({}) TO ({})").format(
                        sql.Identifier(name), sql.Identifier(table),
                        sql.Literal(f"{day.isoformat()} 00:00:00+00"),
                        sql.Literal(f"{(day + timedelta(days=1)).isoformat()} 00:00:00+00"),
                    )
                )
                created.append(name)
    return created


def ensure_ahead(conn: psycopg.Connection, days_ahead: int, today: date | None = None) -> list[str]:
    """Partitions from yesterday (late data) through ``days_ahead`` days after today."""
    today = today or utc_today()
    return ensure(conn, [today + timedelta(days=d) for d in range(-1, days_ahead + 1)])


def horizon(retention_days: int, today: date | None = None) -> date:
    """The oldest day kept: data of earlier days is dropped (and refused on ingest)."""
    return (today or utc_today()) - timedelta(days=retention_days)


def drop_expired(conn: psycopg.Connection, retention_days: int, today: date | None = None) -> list[str]:
    """Drop every partition whose whole day is older than the retention horizon."""
    oldest = horizon(retention_days, today)
    dropped = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("SET LOCAL lock_timeout = '10s'")
        for table, days in existing(conn).items():
            for day in sorted(d for d in days if d < oldest):
                name = f"{table}_p{day:%Y%m%d}"
                conn.execute(sql.SQL("DROP TABLE IF EXISTS jobpulse.{}").format(sql.Identifier(name)))
                dropped.append(name)
    return dropped
