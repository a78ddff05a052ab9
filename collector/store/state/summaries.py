"""Store: job summaries (`jobpulse.job_summaries`), written once when a job's rules are final."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

PENDING = """
SELECT j.cluster, j.job_id FROM jobpulse.jobs j
 WHERE j.rules_final_at IS NOT NULL AND j.end_time IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM jobpulse.job_summaries s WHERE s.cluster = j.cluster AND s.job_id = j.job_id
                     AND s.end_time >= j.end_time)  -- a requeued job's later run ends again
 ORDER BY j.rules_final_at LIMIT %s
"""


def pending(conn: psycopg.Connection[Any], limit: int = 100) -> list[tuple[str, str]]:
    """Ended jobs whose rules are final and that have no summary yet, oldest first."""
    return [(c, j) for c, j in conn.execute(PENDING, (limit,)).fetchall()]


def write(conn: psycopg.Connection[Any], summary: dict[str, Any]) -> None:
    """Keep one job's summary: the first written for an end stays; a requeued job's later run, ending
    later, replaces it (its summary names every run)."""
    job = summary["job"]
    conn.execute(
        "INSERT INTO jobpulse.job_summaries (cluster, job_id, user_name, account, partition, job_name, state,"
        " start_time, end_time, gpus, gpu_hours, gpu_hours_used, wasted, summary, text, script_hash)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (cluster, job_id)"
        " DO UPDATE SET state = EXCLUDED.state, start_time = EXCLUDED.start_time, end_time = EXCLUDED.end_time,"
        " gpus = EXCLUDED.gpus, gpu_hours = EXCLUDED.gpu_hours, gpu_hours_used = EXCLUDED.gpu_hours_used,"
        " wasted = EXCLUDED.wasted, summary = EXCLUDED.summary, text = EXCLUDED.text"
        " WHERE jobpulse.job_summaries.end_time < EXCLUDED.end_time",
        (job["cluster"], job["job_id"], job["user"], job["account"], job["partition"], job["name"], job["state"],
         job["start"], job["end"], summary["gpu_hours"]["gpus"], summary["gpu_hours"]["held"],
         summary["gpu_hours"]["used"], Jsonb(summary["gpu_hours"]["wasted"]), Jsonb(summary), summary["text"],
         job.get("script_hash")))


def previous_run(conn: psycopg.Connection[Any], cluster: str, user: str | None, name: str | None,
                 script_hash: str | None, before: datetime | None) -> dict[str, Any] | None:
    """The summary of the last run of the same work (same user and job name on the cluster, and the
    same batch script but for its #SBATCH lines where both runs' scripts are known) that ended
    before ``before`` with advice for its next run: what this run is checked against."""
    if user is None or name is None or before is None:
        return None
    row = conn.execute("SELECT summary FROM jobpulse.job_summaries WHERE cluster = %s AND user_name = %s"
                       " AND job_name = %s AND end_time <= %s AND summary->'sbatch' <> '[]'"
                       " AND (script_hash IS NULL OR %s::text IS NULL OR script_hash = %s)"
                       " ORDER BY end_time DESC LIMIT 1", (cluster, user, name, before, script_hash, script_hash)).fetchone()
    return row[0] if row else None


def read(conn: psycopg.Connection[Any], job_id: str, cluster: str | None) -> list[dict[str, Any]]:
    """The summary of this job in each cluster that has one: (cluster, summary JSON, text)."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute("SELECT cluster, summary, text, written_at FROM jobpulse.job_summaries"
                       " WHERE job_id = %s AND (%s::text IS NULL OR cluster = %s) ORDER BY cluster",
                       (job_id, cluster, cluster)).fetchall()


GROUPS = {"user": "user_name", "account": "account", "partition": "partition"}


def digest(conn: psycopg.Connection[Any], by: str, start: datetime, end: datetime,
           cluster: str | None) -> list[dict[str, Any]]:
    """Per group (user, account or partition), the jobs that ended in [start, end): how many, GPU-hours
    held, used and wasted by cause, goodput (productive GPU-hours and badput by cause, of the jobs whose
    summary has it), and the jobs that wasted most (their cluster, id, name, waste)."""
    column = GROUPS[by]  # a fixed name: never the caller's text
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
WITH s AS (SELECT coalesce({column}, '?') AS grp, cluster, job_id, job_name, gpu_hours, gpu_hours_used, wasted,
                  (SELECT coalesce(sum(value::float8), 0) FROM jsonb_each_text(wasted)) AS wasted_total,
                  summary->'advice_check' AS checked, summary->'goodput' AS goodput
             FROM jobpulse.job_summaries
            WHERE end_time >= %(start)s AND end_time < %(end)s AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s)),
causes AS (SELECT grp, jsonb_object_agg(cause, hours) AS wasted
             FROM (SELECT grp, w.key AS cause, round(sum(w.value::float8)::numeric, 2) AS hours
                     FROM s, jsonb_each_text(s.wasted) w GROUP BY 1, 2) c GROUP BY grp),
badput AS (SELECT grp, jsonb_object_agg(cause, hours) AS badput
             FROM (SELECT grp, b.key AS cause, round(sum(b.value::float8)::numeric, 2) AS hours
                     FROM s, jsonb_each_text(s.goodput->'badput_gpu_hours') b GROUP BY 1, 2) c GROUP BY grp),
worst AS (SELECT grp, jsonb_agg(jsonb_build_object('cluster', cluster, 'job_id', job_id, 'name', job_name,
                                                   'wasted', round(wasted_total::numeric, 2))
                                ORDER BY wasted_total DESC) FILTER (WHERE rank <= 3) AS worst
            FROM (SELECT *, row_number() OVER (PARTITION BY grp ORDER BY wasted_total DESC) AS rank FROM s
                   WHERE wasted_total > 0) r GROUP BY grp)
SELECT s.grp, count(*) AS jobs, round(sum(gpu_hours)::numeric, 2)::float8 AS held,
       round(sum(gpu_hours_used)::numeric, 2)::float8 AS used, round(sum(wasted_total)::numeric, 2)::float8 AS wasted_total,
       coalesce(c.wasted, '{{}}') AS wasted, coalesce(w.worst, '[]') AS worst,
       count(checked) AS advised_runs, count(checked) FILTER (WHERE (checked->>'followed')::int > 0) AS followed_runs,
       round(coalesce(sum((checked->>'gpu_hours_saved')::float8), 0)::numeric, 2)::float8 AS gpu_hours_saved,
       round(sum((goodput->>'allocated_gpu_hours')::float8)::numeric, 2)::float8 AS goodput_held,
       round(sum((goodput->>'productive_gpu_hours')::float8)::numeric, 2)::float8 AS productive,
       coalesce(b.badput, '{{}}') AS badput
  FROM s LEFT JOIN causes c USING (grp) LEFT JOIN worst w USING (grp) LEFT JOIN badput b USING (grp)
 GROUP BY s.grp, c.wasted, w.worst, b.badput ORDER BY wasted_total DESC, s.grp""",
                       {"start": start, "end": end, "cluster": cluster}).fetchall()


def hardware(conn: psycopg.Connection[Any], start: datetime, end: datetime,
             cluster: str | None) -> list[dict[str, Any]]:
    """Hardware flags per node in [start, end), of jobs and of GPUs no job held: for the admins."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute("""
SELECT cluster, node, rule_id, severity, count(*) AS flags, count(DISTINCT job) AS jobs, max(started_at) AS last
  FROM (SELECT cluster, split_part(scope_key, '/', 1) AS node, rule_id, severity, job_id AS job, started_at
          FROM jobpulse.job_flags WHERE category = 'hardware'
        UNION ALL
        SELECT cluster, node, rule_id, severity, NULL, started_at FROM jobpulse.node_flags WHERE category = 'hardware') f
 WHERE started_at >= %(start)s AND started_at < %(end)s AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s)
 GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3""", {"start": start, "end": end, "cluster": cluster}).fetchall()
