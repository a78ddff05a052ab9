"""Open database connections the collector's way: a malformed DSN is a clear error, and a stored
time Python cannot represent reads as NULL instead of failing every query that touches its row."""

from __future__ import annotations

from typing import Any

import psycopg
import structlog
from psycopg.abc import AdaptContext
from psycopg.abc import Loader as AnyLoader
from psycopg.adapt import AdaptersMap, Buffer, Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import Format

log = structlog.get_logger("jobpulse.store")


def _lenient(fmt: Format) -> type[Loader]:
    """A ``timestamptz`` loader that wraps psycopg's default one (its C implementation where
    psycopg-binary is installed: a subclass of the pure-Python loader spent most of a rule replay's
    client time parsing times) and reads what Python cannot represent as NULL."""
    found = psycopg.adapters.get_loader(psycopg.postgres.types["timestamptz"].oid, fmt)
    if found is None:  # psycopg registers both formats; this would be a broken install
        raise RuntimeError(f"psycopg has no timestamptz loader for {fmt.name}")
    default: type[AnyLoader] = found

    class Lenient(Loader):
        format = fmt

        def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
            super().__init__(oid, context)
            self._load = default(oid, context).load

        def load(self, data: Buffer) -> Any:
            try:
                return self._load(data)
            except psycopg.DataError as exc:
                log.warning("stored time out of range, read as NULL", reason=str(exc),
                            **({"value": bytes(data).decode(errors="replace")} if fmt == Format.TEXT else {}))
                return None

    return Lenient


_LENIENT = (_lenient(Format.TEXT), _lenient(Format.BINARY))


def lenient_times(adapters: AdaptersMap) -> None:
    """Read an out-of-range ``timestamptz`` (year 0, year 10000: written by hand or by an older
    version) as NULL, so one bad row cannot break listings, reports and rule cycles of other jobs."""
    for loader in _LENIENT:
        adapters.register_loader("timestamptz", loader)


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
