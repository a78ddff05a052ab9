"""Store: the reads behind `jobpulse report` (text, JSON, HTML), `jobpulse validate report` and
the demo's summary; the report modules only format what these return."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobpulse.collector.store.read.mig_shares import slice_shares_sql
from jobpulse.collector.store.state import captures


class JobNotFound(LookupError):
    """No such job, or the id names jobs of several clusters (the message says which)."""


def job(conn: psycopg.Connection[Any], job_id: str, cluster: str | None) -> dict[str, Any]:
    """One job's record, GPUs (from the 300 s roll-ups), ranks, phases and flags."""
    cur = conn.cursor(row_factory=dict_row)
    jobs = cur.execute("SELECT * FROM jobpulse.jobs WHERE job_id = %s AND (%s::text IS NULL OR cluster = %s)",
                       (job_id, cluster, cluster)).fetchall()
    if not jobs:
        raise JobNotFound(f"no job {job_id!r}" + (f" in cluster {cluster!r}" if cluster else ""))
    if len(jobs) > 1:
        raise JobNotFound(f"job {job_id!r} exists in clusters {', '.join(j['cluster'] for j in jobs)}: "
                          "pass --cluster")
    record = jobs[0]
    key = (record["cluster"], job_id)
    # From the 300 s roll-ups: every sample is in them, and a 3-day job reads a few thousand rows.
    gpus = cur.execute(
        "SELECT r.*, jobpulse.gpu_name(%s, r.node, r.gpu_uuid, r.gpu_index) AS \"where\","
        " coalesce(g.share, s.share, 1) AS share, coalesce(s.share, 1) AS scale FROM ("
        "SELECT node, gpu_uuid, max(gpu_index) AS gpu_index, sum(n)::bigint AS samples, min(first_ts) AS first_ts,"
        " max(last_ts) AS last_ts, sum(sum_sm_util) / sum(n) AS util,"
        " sum(sum_sm_active) / nullif(sum(n_gpm), 0) AS sm_active, max(max_fb_used_mib) AS peak_mem_mib,"
        " max(fb_total_mib) AS mem_total_mib, sum(sum_power_w) / sum(n) AS power_w,"
        " max(power_limit_w)::float8 AS power_limit_w"
        " FROM jobpulse.gpu_rollup WHERE width_s = 300 AND cluster = %s AND job_id = %s GROUP BY node, gpu_uuid) r"
        f" LEFT JOIN ({slice_shares_sql('%s')}) s USING (node, gpu_uuid)"
        " LEFT JOIN jobpulse.job_gpus g ON g.cluster = %s AND g.job_id = %s AND g.node = r.node"
        " AND g.gpu_uuid = r.gpu_uuid ORDER BY r.node, r.gpu_index, \"where\"", (key[0], *key, key[0], *key)).fetchall()
    # A rank is its main process (the one on a GPU) and its other processes on the node (data-loader
    # workers: same job, node and rank, no GPU). Its CPU is their sum at each sample time, averaged
    # over time, so workers that come and go (a pool per epoch) count while they live. A process on
    # several GPUs has one row per GPU and time: one CPU figure.
    ranks = cur.execute(_RANKS, key).fetchall()
    resources = cur.execute(_RESOURCES, key).fetchall()
    phases = cur.execute(
        "SELECT phase, count(*) AS times, count(DISTINCT rank) AS ranks,"
        " avg(extract(epoch from ended_at - started_at))::float8 AS mean_s,"
        " max(extract(epoch from ended_at - started_at))::float8 AS max_s, count(*) FILTER (WHERE ended_at IS NULL)"
        " AS running FROM jobpulse.job_phases WHERE cluster = %s AND job_id = %s GROUP BY phase ORDER BY min(started_at)",
        key).fetchall()
    flags = cur.execute(
        "SELECT id, rule_id, severity, category, scope, scope_key, started_at, ended_at, evidence, advice"
        " FROM jobpulse.job_flags WHERE cluster = %s AND job_id = %s ORDER BY ended_at IS NOT NULL,"
        " CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, started_at", key).fetchall()
    found = captures.of_job(conn, *key)
    for f in flags:  # the stacks sampled and the trace taken for the flag, where they were asked for
        kinds = found.get(f.pop("id"), {})
        f["capture"], f["trace"] = kinds.get("stacks"), kinds.get("trace")
    policy = cur.execute("SELECT policy, action, reason, at FROM jobpulse.policy_actions"
                         " WHERE cluster = %s AND job_id = %s ORDER BY at", key).fetchall()
    return {"job": record, "gpus": gpus, "ranks": ranks, "resources": resources, "phases": phases, "flags": flags,
            "policy": policy}


_RANKS = """
WITH p AS (  -- one row per process and sample time
    SELECT node, rank, pid, ts, max(cpu_percent)::float8 AS cpu, bool_or(gpu_uuid IS NOT NULL) AS on_gpu,
           sum(gpu_mem_mib) AS gpu_mem, max(rss_mib) AS rss, 1 + max(coalesce(held, 0)) AS w
      FROM jobpulse.process_samples_all WHERE cluster = %s AND job_id = %s AND rank IS NOT NULL
     GROUP BY node, rank, pid, ts),
procs AS (  -- a main process is one seen on a GPU at any time of the job
    SELECT node, rank, pid, bool_or(on_gpu) AS main FROM p GROUP BY node, rank, pid),
ticks AS (
    SELECT p.node, p.rank, p.ts, sum(p.cpu) AS cpu, sum(p.cpu) FILTER (WHERE q.main) AS main_cpu,
           count(*) FILTER (WHERE NOT q.main) AS workers, sum(p.gpu_mem) AS gpu_mem,
           max(p.rss) FILTER (WHERE q.main) AS main_rss, max(p.w) AS w
      FROM p JOIN procs q USING (node, rank, pid) GROUP BY p.node, p.rank, p.ts)
SELECT t.rank, t.node,
       (SELECT array_agg(pid ORDER BY pid) FROM procs q WHERE q.node = t.node AND q.rank = t.rank AND q.main)
           AS main_pids,
       (SELECT array_agg(pid ORDER BY pid) FROM procs q WHERE q.node = t.node AND q.rank = t.rank) AS pids,
       avg(t.cpu) AS cpu_percent, avg(t.main_cpu) AS main_cpu_percent,
       percentile_disc(0.5) WITHIN GROUP (ORDER BY t.workers) AS workers, max(t.workers) AS max_workers,
       max(t.gpu_mem) AS gpu_mem_mib, max(t.main_rss) AS rss_mib
  FROM ticks t CROSS JOIN LATERAL generate_series(1, t.w) -- a row stands for 1 + held ticks (ChangeOnly)
 GROUP BY t.rank, t.node ORDER BY t.rank, t.node
"""


_RESOURCES = """
WITH p AS (  -- one row per process and sample time (a process on several GPUs has a row per GPU)
    SELECT node, pid, ts, max(cpu_percent)::float8 AS cpu, max(rss_mib) AS rss, 1 + max(coalesce(held, 0)) AS w
      FROM jobpulse.process_samples_all WHERE cluster = %s AND job_id = %s GROUP BY node, pid, ts),
t AS (SELECT node, ts, sum(cpu) / 100 AS cores, sum(rss) AS rss, max(w) AS w FROM p GROUP BY node, ts)
SELECT node, count(*) AS samples, percentile_cont(0.95) WITHIN GROUP (ORDER BY cores) AS cores_p95,
       max(cores) AS cores_max, max(rss)::bigint AS rss_peak_mib
  FROM t CROSS JOIN LATERAL generate_series(1, t.w)  -- a row stands for 1 + held ticks (ChangeOnly)
 GROUP BY node ORDER BY node
"""
"""Per node, what the job's processes took at once: CPU cores (the 95th percentile over sample times:
a moment's burst is not what the job needs) and memory (RSS, the peak: a job that runs out is killed)."""


def series(conn: psycopg.Connection[Any], cluster: str, job_id: str, start: datetime, end: datetime,
           step_s: int) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]], str | None]:
    """Per-GPU rows of `gpu_series` over [start, end] (GPU key -> rows in time order), the phases,
    and which source answered."""
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute("SELECT * FROM jobpulse.gpu_series(%s, %s, %s, %s, %s) ORDER BY time, node, gpu_index",
                       (cluster, job_id, start, end, step_s)).fetchall()
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(f"{row['node']}/{row['gpu_uuid']}", []).append(row)
    phases = cur.execute(
        "SELECT phase, rank, started_at, coalesce(ended_at, %s) AS ended_at, status FROM jobpulse.job_phases"
        " WHERE cluster = %s AND job_id = %s AND started_at IS NOT NULL ORDER BY started_at",
        (end, cluster, job_id)).fetchall()
    return out, phases, rows[0]["source"] if rows else None


def latest_validations(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Each node's latest result of each check (per GPU where a check is per GPU)."""
    return conn.execute(
        'SELECT cluster, node, "check", status, observed, expected, message, gpu_uuid'
        " FROM jobpulse.node_validations_latest ORDER BY cluster, node, \"check\", gpu_uuid").fetchall()


def progress(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(GPU samples rolled up, open flags): the demo's progress line."""
    row = conn.execute("SELECT (SELECT coalesce(sum(n), 0) FROM jobpulse.gpu_rollup WHERE width_s = 300),"
                       " (SELECT count(*) FROM jobpulse.job_flags WHERE ended_at IS NULL)").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def flags_by_job(conn: psycopg.Connection[Any]) -> list[tuple[str, str | None, str | None, str | None]]:
    """Every job with the flags raised while it ran (rule (category), ...), by job id."""
    return conn.execute(
        "SELECT j.job_id, j.job_name, j.user_name, string_agg(DISTINCT f.rule_id || ' (' || f.category || ')',"
        " ', ' ORDER BY f.rule_id || ' (' || f.category || ')') FROM jobpulse.jobs j"
        " LEFT JOIN jobpulse.job_flags f USING (cluster, job_id) GROUP BY 1, 2, 3 ORDER BY 1").fetchall()
