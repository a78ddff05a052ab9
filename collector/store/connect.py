"""Open database connections the collector's way: a malformed DSN is a clear error, and a stored
time Python cannot represent reads as NULL instead of failing every query that touches its row."""

from __future__ import annotations

from typing import Any

import psycopg
import structlog
from psycopg.adapt import AdaptersMap, Buffer
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader

log = structlog.get_logger("jobpulse.store")


class _LenientText(TimestamptzLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except psycopg.DataError as exc:
            log.warning("stored time out of range, read as NULL", value=bytes(data).decode(errors="replace"),
                        reason=str(exc))
            return None


class _LenientBinary(TimestamptzBinaryLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except psycopg.DataError as exc:
            log.warning("stored time out of range, read as NULL", reason=str(exc))
            return None


def lenient_times(adapters: AdaptersMap) -> None:
    """Read an out-of-range ``timestamptz`` (year 0, year 10000: written by hand or by an older
    version) as NULL, so one bad row cannot break listings, reports and rule cycles of other jobs."""
    adapters.register_loader("timestamptz", _LenientText)
    adapters.register_loader("timestamptz", _LenientBinary)


def check_dsn(dsn: str) -> str:
    """The DSN, or ValueError saying what is wrong with it (psycopg's parse error, without a trace)."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ValueError(f"--dsn is not a PostgreSQL connection string or URL: {str(exc).strip()}") from None
    return dsn


def connect(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """A synchronous connection (CLI, rules, maintenance) with lenient time loading."""
    conn = psycopg.connect(check_dsn(dsn), connect_timeout=kwargs.pop("connect_timeout", 10), **kwargs)
    lenient_times(conn.adapters)
    return conn
