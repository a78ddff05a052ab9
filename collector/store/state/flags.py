"""Store: keep `job_flags` in step with a cycle's hits. A hit opens a flag or refreshes it, a flag
whose condition stopped holding is closed, and the flags of an ended job close at its end time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb


@dataclass(frozen=True)
class Hit:
    """A rule's finding as it is stored in job_flags."""

    rule_id: str
    severity: str  # info, warning, critical
    category: str  # code, hardware
    scope: str  # job, node, gpu, rank
    scope_key: str
    started_at: datetime
    evidence: dict[str, Any]
    advice: str


# A place has one flag per cause: a hit of any of the cause's kinds (``%(kinds)s``) takes the job's
# newest flag of that cause on that place -- open (refreshed; its kind follows the hit) or closed
# (reopened) -- and only where there is none opens one. Its start is the cause's first onset.
_UPSERT = """
WITH prior AS (SELECT id FROM jobpulse.job_flags WHERE cluster = %(cluster)s AND job_id = %(job)s
               AND rule_id = ANY(%(kinds)s) AND scope = %(scope)s AND scope_key = %(key)s ORDER BY id DESC LIMIT 1),
kept AS (UPDATE jobpulse.job_flags f SET rule_id = %(rule)s, severity = %(severity)s, category = %(category)s,
                last_seen = now(), ended_at = NULL, evidence = %(evidence)s, advice = %(advice)s
         FROM prior WHERE f.id = prior.id RETURNING f.id),
opened AS (INSERT INTO jobpulse.job_flags (cluster, job_id, rule_id, severity, category, scope, scope_key, started_at,
                                           last_seen, evidence, advice)
           SELECT %(cluster)s, %(job)s, %(rule)s, %(severity)s, %(category)s, %(scope)s, %(key)s, %(started)s, now(),
                  %(evidence)s, %(advice)s WHERE NOT EXISTS (SELECT 1 FROM prior) RETURNING id)
SELECT id FROM kept UNION ALL SELECT id FROM opened
"""


# A job-wide hit (one that names its GPUs, ``%(gpus)s``) takes over the open per-GPU flags of its
# cause on those GPUs: where the job has no flag of that cause yet, the oldest becomes it (its id,
# opening and notices kept), and the others go (the same cause, told by the job-wide flag, whose
# evidence names their GPUs): one or the other, never both.
_ABSORB = """
WITH gpu AS (SELECT id FROM jobpulse.job_flags WHERE cluster = %(cluster)s AND job_id = %(job)s
             AND rule_id = ANY(%(kinds)s) AND scope = 'gpu' AND scope_key = ANY(%(gpus)s) AND ended_at IS NULL),
heir AS (SELECT min(id) AS id FROM gpu WHERE NOT EXISTS (
             SELECT 1 FROM jobpulse.job_flags WHERE cluster = %(cluster)s AND job_id = %(job)s
             AND rule_id = ANY(%(kinds)s) AND scope = %(scope)s AND scope_key = %(key)s)),
moved AS (UPDATE jobpulse.job_flags f SET scope = %(scope)s, scope_key = %(key)s FROM heir
          WHERE f.job_id = %(job)s AND f.id = heir.id RETURNING f.id)
DELETE FROM jobpulse.job_flags f USING gpu WHERE f.job_id = %(job)s AND f.id = gpu.id
       AND f.id NOT IN (SELECT id FROM heir WHERE id IS NOT NULL)
"""


# A cycle's flags do not wait for their WAL to reach the disk (up to a fifth of a cycle at 8,000
# GPUs): a crash can lose only the last cycle's refresh, which the next cycle writes again.
_NO_WAIT = "SET LOCAL synchronous_commit = off"


def _upsert(cur: psycopg.Cursor[Any], sql: str, rows: list[Any]) -> list[int]:
    """Every hit in one pipelined round trip (a cycle over thousands of GPUs holds hundreds: one
    round trip each was most of its database time); returns the flags' ids."""
    if not rows:
        return []
    cur.executemany(sql, rows, returning=True)
    ids = []
    while True:
        ids.append(cur.fetchone()[0])  # type: ignore[index]
        if not cur.nextset():
            return ids


Kinds = Callable[[str], tuple[str, ...]]
"""A rule's cause: the rules that share one flag on a place with it (`rules.registry.cause_of`)."""


def write(conn: psycopg.Connection[Any], hits: dict[tuple[str, str], list[Hit]], cycle_start: datetime,
          hold: timedelta, kinds: Kinds) -> tuple[int, int]:
    """Upsert every hit and close what no longer holds, in one transaction; (kept, closed). A flag
    of a running job closes once it has not been hit for ``hold`` (at its last hit): a condition
    that flickers across cycles stays one flag, and one that returns reopens it."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(_NO_WAIT)
        absorbing = [{"cluster": cluster, "job": job, "kinds": list(kinds(h.rule_id)), "scope": h.scope,
                      "key": h.scope_key, "gpus": [str(k) for k in h.evidence["gpus"]]}
                     for (cluster, job), found in hits.items() for h in found
                     if h.scope == "job" and isinstance(h.evidence.get("gpus"), list)]
        if absorbing:
            cur.executemany(_ABSORB, absorbing)
        kept = _upsert(cur, _UPSERT, [
            {"cluster": cluster, "job": job, "kinds": list(kinds(h.rule_id)), "rule": h.rule_id,
             "severity": h.severity, "category": h.category, "scope": h.scope, "key": h.scope_key,
             "started": h.started_at, "evidence": Jsonb(h.evidence), "advice": h.advice}
            for (cluster, job), found in hits.items() for h in found])
        # An ended job's last cycle is one that started after its end: it is marked final first, and
        # the close below reads the marks (the other way round, an end stored between the two
        # statements was marked final with its flags left open, never to be judged again).
        final = cur.execute("UPDATE jobpulse.jobs SET rules_final_at = now() WHERE end_time IS NOT NULL"
                            " AND rules_final_at IS NULL AND end_time <= %s RETURNING cluster, job_id",
                            (cycle_start,)).fetchall()
        # Running jobs: a flag not hit for `hold` stopped holding at its last hit. Ended jobs had
        # their last evaluation now: every open flag closes at the job's end (and again after a
        # later evaluation reopened it).
        closed = cur.execute(
            "UPDATE jobpulse.job_flags f SET ended_at = CASE WHEN j.end_time IS NULL THEN f.last_seen"
            " ELSE greatest(j.end_time, f.started_at) END"
            " FROM jobpulse.jobs j WHERE f.ended_at IS NULL AND j.cluster = f.cluster AND j.job_id = f.job_id"
            " AND ((j.end_time IS NOT NULL AND (j.rules_final_at IS NULL OR (j.cluster, j.job_id) IN"
            "      (SELECT x.c, x.j FROM unnest(%s::text[], %s::text[]) AS x(c, j))))"
            "  OR ((f.cluster, f.job_id) IN (SELECT x.c, x.j FROM unnest(%s::text[], %s::text[]) AS x(c, j))"
            "      AND NOT f.id = ANY(%s) AND f.last_seen < now() - %s))",
            ([c for c, _ in final], [j for _, j in final], [c for c, _ in hits], [j for _, j in hits], kept,
             hold)).rowcount
    return len(kept), closed


def open_job_wide(conn: psycopg.Connection[Any], rules: list[str],
                  jobs: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """The open job-scoped flags of ``rules`` on these jobs: (cluster, job) -> rule -> its evidence
    (what a job-wide flag carried on from the last cycle names)."""
    if not jobs or not rules:
        return {}
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for cluster, job, rule, evidence in conn.execute(
            "SELECT cluster, job_id, rule_id, evidence FROM jobpulse.job_flags WHERE ended_at IS NULL"
            " AND scope = 'job' AND rule_id = ANY(%s)"
            " AND (cluster, job_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
            (rules, [c for c, _ in jobs], [j for _, j in jobs])).fetchall():
        out.setdefault((cluster, job), {})[rule] = evidence or {}
    return out


_UPSERT_NODE = """
INSERT INTO jobpulse.node_flags AS f (cluster, node, rule_id, severity, category, scope_key, started_at, last_seen,
                                      evidence, advice)
VALUES (%s, %s, %s, %s, %s, %s, %s, now(), %s, %s)
ON CONFLICT (cluster, node, rule_id, scope_key) WHERE ended_at IS NULL
DO UPDATE SET last_seen = EXCLUDED.last_seen, severity = EXCLUDED.severity, evidence = EXCLUDED.evidence, advice = EXCLUDED.advice
RETURNING id
"""


def write_nodes(conn: psycopg.Connection[Any], hits: dict[tuple[str, str], list[Hit]], hold: timedelta) -> int:
    """The hardware flags of GPUs no job holds, with the same lifecycle as a running job's; returns
    how many are open or refreshed."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(_NO_WAIT)
        kept = _upsert(cur, _UPSERT_NODE, [(cluster, node, h.rule_id, h.severity, h.category, h.scope_key,
                                            h.started_at, Jsonb(h.evidence), h.advice)
                                           for (cluster, node), found in hits.items() for h in found])
        cur.execute("UPDATE jobpulse.node_flags SET ended_at = last_seen"
                    " WHERE ended_at IS NULL AND NOT id = ANY(%s) AND last_seen < now() - %s", (kept, hold))
    return len(kept)


def stored(conn: psycopg.Connection[Any], start: datetime, end: datetime, cluster: str | None,
           job: str | None) -> list[tuple[Any, ...]]:
    """Flags the live rules stored that were open at some time in [start, end]:
    (cluster, job, rule, scope, scope_key, started_at, opened_at, ended_at)."""
    return conn.execute(
        "SELECT cluster, job_id, rule_id, scope, scope_key, started_at, opened_at, ended_at FROM jobpulse.job_flags"
        " WHERE opened_at <= %(end)s AND coalesce(ended_at, %(end)s) >= %(start)s"
        " AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s) AND (%(job)s::text IS NULL OR job_id = %(job)s)"
        " ORDER BY cluster, job_id, opened_at", {"start": start, "end": end, "cluster": cluster, "job": job}).fetchall()


def write_history(conn: psycopg.Connection[Any], cluster: str, job: str, found: list[tuple[Any, ...]]) -> None:
    """Replace an ended job's flags with the ones a replay raised (an imported recording), and mark
    its rules final so the live cycles leave it be. Rows: (rule, severity, category, scope, scope_key,
    started_at, opened_at, last_seen, ended_at, evidence, advice)."""
    with conn.transaction():
        conn.execute("DELETE FROM jobpulse.job_flags WHERE cluster = %s AND job_id = %s", (cluster, job))
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO jobpulse.job_flags (cluster, job_id, rule_id, severity, category, scope, scope_key,"
                " started_at, opened_at, last_seen, ended_at, evidence, advice)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(cluster, job, *row[:9], Jsonb(row[9]), row[10]) for row in found])
        conn.execute("UPDATE jobpulse.jobs SET rules_final_at = now() WHERE cluster = %s AND job_id = %s",
                     (cluster, job))
