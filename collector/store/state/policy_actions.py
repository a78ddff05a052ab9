"""Store: what the site policy may act on (open idle or hung flags of running jobs), and its audit
(`jobpulse.policy_actions`, one row per job, policy and action)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb


def candidates(conn: psycopg.Connection[Any], rules: list[str]) -> list[dict[str, Any]]:
    """Open flags of ``rules`` on running jobs, with the job's owner, partition, account and tags,
    and whether the job has an open hardware flag (then its idleness is the node's doing)."""
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute(
        "SELECT f.id AS flag_id, f.cluster, f.job_id, f.rule_id, f.scope_key, f.started_at, f.evidence,"
        " j.user_name, j.partition, j.account, j.tags,"
        " EXISTS (SELECT 1 FROM jobpulse.job_flags h WHERE h.cluster = f.cluster AND h.job_id = f.job_id"
        "         AND h.category = 'hardware' AND h.ended_at IS NULL) AS hardware"
        " FROM jobpulse.job_flags f JOIN jobpulse.jobs j ON j.cluster = f.cluster AND j.job_id = f.job_id"
        " WHERE f.rule_id = ANY(%s) AND f.ended_at IS NULL AND j.end_time IS NULL ORDER BY f.started_at",
        (rules,)).fetchall()
    return rows


def done(conn: psycopg.Connection[Any], keys: list[tuple[str, str]],
         policy: str) -> dict[tuple[str, str], dict[str, datetime]]:
    """The actions one policy took already, and when, per (cluster, job)."""
    out: dict[tuple[str, str], dict[str, datetime]] = {}
    if keys:
        for c, j, action, at in conn.execute(
                "SELECT cluster, job_id, action, at FROM jobpulse.policy_actions"
                " WHERE (cluster, job_id) IN (SELECT * FROM unnest(%s::text[], %s::text[])) AND policy = %s",
                ([c for c, _ in keys], [j for _, j in keys], policy)).fetchall():
            out.setdefault((c, j), {})[action] = at
    return out


def record(conn: psycopg.Connection[Any], cluster: str, job_id: str, action: str, flag_id: int | None, reason: str,
           evidence: dict[str, Any], policy: str) -> None:
    conn.execute(
        "INSERT INTO jobpulse.policy_actions (cluster, job_id, policy, action, flag_id, reason, evidence)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (cluster, job_id, policy, action) DO UPDATE"
        " SET reason = EXCLUDED.reason, evidence = EXCLUDED.evidence, at = now()",
        (cluster, job_id, policy, action, flag_id, reason, Jsonb(evidence)))

