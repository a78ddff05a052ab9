"""Store: the notifications outbox (`jobpulse.notifications`): which flags are to be told to which
channel, and how their delivery went. Reads of flags and jobs (distributed on Citus) and of the
outbox (a coordinator table) are separate statements, never one join."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

Pending = tuple[int, str, str, str, str | None, str]  # flag id, channel, url, format, user, severity


def recent_flags(conn: psycopg.Connection[Any], hours: float = 1.0) -> list[dict[str, Any]]:
    """Flags opened within the last ``hours`` with what channels filter on: a rule cycle tells the
    new ones, and one that crashed before telling is caught up by the next."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(
        "SELECT f.id, f.cluster, f.job_id, f.rule_id, f.severity, f.category, j.user_name, j.tags->>'notify' AS notify"
        " FROM jobpulse.job_flags f JOIN jobpulse.jobs j ON j.cluster = f.cluster AND j.job_id = f.job_id"
        " WHERE f.opened_at > now() - make_interval(secs => %s) ORDER BY f.id", (hours * 3600,)).fetchall()


_RANK = "CASE {0}.severity WHEN 'critical' THEN 2 WHEN 'warning' THEN 1 ELSE 0 END"


def enqueue(conn: psycopg.Connection[Any], pending: list[Pending]) -> int:
    """Outbox rows for these (flag, channel) pairs at the flag's severity now: one told before at this
    severity or a higher one stays as it is, one that rose (a stall become a hang) is told again.
    Returns how many are new."""
    if not pending:
        return 0
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO jobpulse.notifications (flag_id, channel, url, format, user_name, severity)"
            " SELECT p.* FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[])"
            "   AS p(flag_id, channel, url, format, user_name, severity)"
            " WHERE NOT EXISTS (SELECT 1 FROM jobpulse.notifications n WHERE n.flag_id = p.flag_id"
            f"                   AND n.channel = p.channel AND {_RANK.format('n')} >= {_RANK.format('p')})"
            " ON CONFLICT (flag_id, channel, severity) DO NOTHING",
            tuple(list(col) for col in zip(*pending, strict=True)))
        return cur.rowcount


def due(conn: psycopg.Connection[Any], limit: int) -> list[dict[str, Any]]:
    """Notifications whose (next) attempt is due, oldest first."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(
        "SELECT id, flag_id, channel, url, format, user_name, attempts, created_at FROM jobpulse.notifications"
        " WHERE delivered_at IS NULL AND given_up_at IS NULL AND next_at <= now() ORDER BY id LIMIT %s",
        (limit,)).fetchall()


def flags(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, dict[str, Any]]:
    """The flags (with their job's name and owner) to tell, by id: as they are now."""
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute(
        "SELECT f.id, f.cluster, f.job_id, f.rule_id, f.severity, f.category, f.scope, f.scope_key, f.started_at,"
        " f.ended_at, f.evidence, f.advice, j.user_name, j.job_name, j.partition"
        " FROM jobpulse.job_flags f JOIN jobpulse.jobs j ON j.cluster = f.cluster AND j.job_id = f.job_id"
        " WHERE f.id = ANY(%s)", (ids,)).fetchall()
    return {r["id"]: r for r in rows}


def delivered_to_user(conn: psycopg.Connection[Any], user: str | None, since: datetime) -> int:
    row = conn.execute("SELECT count(*) FROM jobpulse.notifications WHERE channel = 'user'"
                       " AND user_name IS NOT DISTINCT FROM %s"
                       " AND delivered_at >= %s", (user, since)).fetchone()
    return int(row[0]) if row else 0


def mark(conn: psycopg.Connection[Any], note_id: int, *, delivered: bool = False, retry_in_s: float | None = None,
         error: str | None = None, attempted: bool = True) -> None:
    """Record an attempt: delivered, or to retry in ``retry_in_s`` (None: given up), with its error."""
    conn.execute(
        "UPDATE jobpulse.notifications SET attempts = attempts + %s, last_error = %s,"
        " delivered_at = CASE WHEN %s THEN now() END,"
        " next_at = CASE WHEN %s::float8 IS NULL THEN next_at ELSE now() + make_interval(secs => %s) END,"
        " given_up_at = CASE WHEN NOT %s AND %s::float8 IS NULL THEN now() END WHERE id = %s",
        (int(attempted), error, delivered, retry_in_s, retry_in_s, delivered, retry_in_s, note_id))
