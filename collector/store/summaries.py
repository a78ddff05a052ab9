"""Store: job summaries (`jobpulse.job_summaries`), written once when a job's rules are final."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

PENDING = """
SELECT j.cluster, j.job_id FROM jobpulse.jobs j
 WHERE j.rules_final_at IS NOT NULL AND j.end_time IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM jobpulse.job_summaries s WHERE s.cluster = j.cluster AND s.job_id = j.job_id)
 ORDER BY j.rules_final_at LIMIT %s
"""


def pending(conn: psycopg.Connection[Any], limit: int = 100) -> list[tuple[str, str]]:
    """Ended jobs whose rules are final and that have no summary yet, oldest first."""
    return [(c, j) for c, j in conn.execute(PENDING, (limit,)).fetchall()]


def write(conn: psycopg.Connection[Any], summary: dict[str, Any]) -> None:
    """Keep one job's summary (the first written stays: a job ends once)."""
    job = summary["job"]
    conn.execute(
        "INSERT INTO jobpulse.job_summaries (cluster, job_id, user_name, account, partition, job_name, state,"
        " start_time, end_time, gpus, gpu_hours, gpu_hours_used, wasted, summary, text)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (job["cluster"], job["job_id"], job["user"], job["account"], job["partition"], job["name"], job["state"],
         job["start"], job["end"], summary["gpu_hours"]["gpus"], summary["gpu_hours"]["held"],
         summary["gpu_hours"]["used"], Jsonb(summary["gpu_hours"]["wasted"]), Jsonb(summary), summary["text"]))


def read(conn: psycopg.Connection[Any], job_id: str, cluster: str | None) -> list[dict[str, Any]]:
    """The summary of this job in each cluster that has one: (cluster, summary JSON, text)."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute("SELECT cluster, summary, text, written_at FROM jobpulse.job_summaries"
                       " WHERE job_id = %s AND (%s::text IS NULL OR cluster = %s) ORDER BY cluster",
                       (job_id, cluster, cluster)).fetchall()
