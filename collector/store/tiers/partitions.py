"""Daily range partitions of the time-series tables: create ahead, drop past retention.

The partitioned tables are discovered from the catalog (every partitioned table in schema
``jobpulse``), so a new time-series table needs no change here. Partitions are named
``<table>_pYYYYMMDD`` and cover one UTC day. Retention drops whole partitions, by tier
(`Tiers`): raw samples move to the compact tier after the hot window (compaction empties their
partitions, which stay, empty, for late data until the compact tier's retention), the 10 s GPU
buckets stay a day longer than the hot window, the compact tier and the roll-ups have their own
retention, every other table the ``retention_days`` given. The 10 s buckets are made from yesterday
on only (`ensure`): a late batch of an older day is read from its samples and 300 s buckets.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import psycopg
from psycopg import sql

_LOCK_KEY = 0x6A6F6271  # serializes partition DDL between collectors
_SUFFIX = re.compile(r"_p(\d{8})$")


@dataclass(frozen=True)
class Tiers:
    """How long each storage tier keeps data (the defaults are `jobpulse db` options' defaults)."""

    raw_hours: float = 48  # samples older than this are compacted
    compact_days: int = 180
    rollup_days: int = 730

    @property
    def fine_days(self) -> int:
        """The 10 s GPU buckets are kept while the samples are raw, and a day more."""
        return math.ceil(self.raw_hours / 24) + 1

    def __post_init__(self) -> None:
        for name in ("raw_hours", "compact_days", "rollup_days"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.compact_days * 24 < self.raw_hours:
            raise ValueError(f"compact_days ({self.compact_days}) must cover raw_hours ({self.raw_hours})")


# partitioned table -> its tier; tables not named here keep the plain retention in days
COMPACT_TIER = ("gpu_samples", "process_samples", "gpu_samples_compact", "process_samples_compact",
                "rank_bins_compact")
ROLLUP_TIER = ("gpu_rollup", "process_rollup", "step_rollup", "node_job_rollup",
               "job_bucket_rollup", "node_rollup")
FINE_TIER = ("gpu_rollup_10s",)
# made only by compaction, for the day it writes: an empty partition still costs the pages of its
# indexes and TOAST index, which days ahead (and days never compacted) would hold for nothing
ON_DEMAND = ("gpu_samples_compact", "process_samples_compact", "rank_bins_compact")


def utc_today() -> date:
    return datetime.now(UTC).date()


def days_spanning(first: datetime, last: datetime) -> list[date]:
    """The UTC days from ``first``'s through ``last``'s (the partitions a span of time writes to)."""
    a, b = first.astimezone(UTC).date(), last.astimezone(UTC).date()
    return [a + timedelta(days=d) for d in range((b - a).days + 1)]


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
    """Days for which every time-series table that keeps every day has a partition (what ingest may
    write: the 10 s buckets of a day before yesterday are not written, `ensure`)."""
    per_table = [days for table, days in existing(conn).items() if table not in (*ON_DEMAND, *FINE_TIER)]
    return set.intersection(*per_table) if per_table else set()


def ensure(conn: psycopg.Connection, days: list[date], tables: list[str] | None = None,
           today: date | None = None) -> list[str]:
    """Create the partitions for ``days`` that do not exist yet (of ``tables``, default all but
    the compact tier's, which compaction makes on demand); returns the names created.

    By default the 10 s buckets get no partition before yesterday (``today``'s): the readers take
    the samples before the 10 s buckets' run of days that holds today
    (``jobpulse.gpu_rollup_10s_since``), so a day made for a late batch would hold rows nobody
    reads, and its retention would drop it again, maybe while a batch writes to it."""
    oldest_fine = (today or utc_today()) - timedelta(days=1)
    created = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        have = existing(conn)
        wanted = tables if tables is not None else [t for t in have if t not in ON_DEMAND]
        for table, present in have.items():
            if table not in wanted:
                continue
            made = [d for d in days if d >= oldest_fine] if table in FINE_TIER and tables is None else days
            for day in sorted(set(made) - present):
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
    return ensure(conn, [today + timedelta(days=d) for d in range(-1, days_ahead + 1)], today=today)


def horizon(retention_days: int, today: date | None = None) -> date:
    """The oldest day kept: data of earlier days is dropped (and refused on ingest)."""
    return (today or utc_today()) - timedelta(days=retention_days)


def retention_of(table: str, retention_days: int, tiers: Tiers) -> int:
    """Days a table's partitions are kept."""
    if table in COMPACT_TIER:
        return tiers.compact_days
    if table in FINE_TIER:
        return tiers.fine_days
    return tiers.rollup_days if table in ROLLUP_TIER else retention_days


def drop_expired(conn: psycopg.Connection, retention_days: int, today: date | None = None,
                 tiers: Tiers | None = None) -> list[str]:
    """Drop every partition whose whole day is older than its tier's retention horizon."""
    tiers = tiers or Tiers()
    dropped = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("SET LOCAL lock_timeout = '10s'")
        for table, days in existing(conn).items():
            oldest = horizon(retention_of(table, retention_days, tiers), today)
            for day in sorted(d for d in days if d < oldest):
                name = f"{table}_p{day:%Y%m%d}"
                conn.execute(sql.SQL("DROP TABLE IF EXISTS jobpulse.{}").format(sql.Identifier(name)))
                dropped.append(name)
    return dropped


def drop_if_empty(conn: psycopg.Connection, table: str, day: date) -> bool:
    """Drop ``table``'s partition of ``day`` if it holds no row (checked under its lock, so a row
    landing meanwhile keeps it); False when it holds rows or is busy. ``conn`` in autocommit."""
    name = sql.Identifier(f"{table}_p{day:%Y%m%d}")
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            conn.execute("SET LOCAL lock_timeout = '5s'")
            conn.execute(sql.SQL("LOCK TABLE jobpulse.{} IN ACCESS EXCLUSIVE MODE").format(name))
            if conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM jobpulse.{})").format(name)).fetchone() != (False,):
                return False
            conn.execute(sql.SQL("DROP TABLE jobpulse.{}").format(name))
            return True
    except psycopg.errors.LockNotAvailable:
        return False


def truncate_empty(conn: psycopg.Connection, table: str, before: datetime) -> list[str]:
    """Give back the space of ``table``'s partitions of whole days before ``before`` that hold no
    rows any more (compaction deleted them): TRUNCATE, not waiting for VACUUM. They stay, empty,
    so late data for those days still has a place to land until retention drops them."""
    done = []
    for day in sorted(existing(conn).get(table, ())):
        whole = f"jobpulse.{table}_p{day:%Y%m%d}"
        if datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC) > before:
            continue
        size = conn.execute("SELECT pg_relation_size(%s::regclass)", (whole,)).fetchone()
        if not size or not size[0]:
            continue
        name = sql.Identifier(f"{table}_p{day:%Y%m%d}")
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '5s'")
                conn.execute(sql.SQL("LOCK TABLE jobpulse.{} IN ACCESS EXCLUSIVE MODE").format(name))
                row = conn.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM jobpulse.{})").format(name)).fetchone()
                if row and row[0]:
                    conn.execute(sql.SQL("TRUNCATE jobpulse.{}").format(name))
                    done.append(f"{table}_p{day:%Y%m%d}")
        except psycopg.errors.LockNotAvailable:
            continue  # busy (a late batch landing): its space waits for the next run
    return done
