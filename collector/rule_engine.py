"""Run the rules over all running jobs (and jobs that just ended) and keep `job_flags` current:
a hit opens a flag or refreshes it, a flag whose condition stopped holding is closed, and the
flags of an ended job close at its end time. One statistics query per cycle serves all rules."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

from .rules import HW_SLOWDOWN_BITS, GpuStats, Hit, Thresholds, gpu_rules, job_rules

_STATS = """
WITH jobs AS (
    SELECT cluster, job_id, partition, start_time FROM jobpulse.jobs
     WHERE end_time IS NULL OR rules_final_at IS NULL
), s AS (
    SELECT g.*, coalesce(g.gpm_sm_active, g.sm_util) AS act, j.partition, j.start_time
      FROM jobpulse.gpu_samples g JOIN jobs j USING (cluster, job_id)
     WHERE g.ts > now() - %(lookback)s
)
SELECT s.cluster, s.job_id, min(s.partition), s.node, s.gpu_uuid, min(s.gpu_index), count(*),
       min(s.ts), max(s.ts), min(s.start_time),
       (array_agg(s.act ORDER BY s.ts DESC))[1],
       max(s.ts) FILTER (WHERE s.act > %(idle)s),
       avg(s.sm_util), count(s.gpm_sm_active), avg(s.gpm_sm_active), max(s.gpm_tensor_active),
       max(s.fb_used_mib::float8 / nullif(s.fb_total_mib, 0)), max(s.fb_used_mib),
       (array_agg(s.fb_used_mib ORDER BY s.ts DESC))[1],
       avg(CASE WHEN s.clock_event_reasons & %(hw)s <> 0 THEN 1.0 ELSE 0.0 END),
       avg(CASE WHEN s.pcie_gen < s.pcie_gen_max OR s.pcie_width < s.pcie_width_max THEN 1.0 ELSE 0.0 END)
           FILTER (WHERE s.sm_util >= 50 AND s.pcie_gen_max IS NOT NULL),
       min(s.pcie_gen::text || 'x' || s.pcie_width::text || '/' || s.pcie_gen_max::text || 'x'
           || s.pcie_width_max::text) FILTER (WHERE s.pcie_gen < s.pcie_gen_max OR s.pcie_width < s.pcie_width_max)
  FROM s GROUP BY s.cluster, s.job_id, s.node, s.gpu_uuid
"""
_XIDS = """
SELECT h.cluster, h.job_id, h.node, h.gpu_uuid, array_agg(h.code)
  FROM jobpulse.gpu_health_events h
 WHERE h.kind = 'xid' AND h.ts > now() - %(lookback)s AND h.job_id IS NOT NULL AND h.code IS NOT NULL
 GROUP BY 1, 2, 3, 4
"""
_MODELS = "SELECT DISTINCT ON (cluster, node, gpu_uuid) cluster, node, gpu_uuid, model FROM jobpulse.topology_current"
_UPSERT = """
INSERT INTO jobpulse.job_flags AS f (cluster, job_id, rule_id, severity, category, scope, scope_key, started_at,
                                     last_seen, evidence, advice)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, now(), %s, %s)
ON CONFLICT (cluster, job_id, rule_id, scope, scope_key) WHERE ended_at IS NULL
DO UPDATE SET last_seen = now(), severity = EXCLUDED.severity, evidence = EXCLUDED.evidence, advice = EXCLUDED.advice
RETURNING id
"""


@dataclass(frozen=True)
class CycleResult:
    jobs: int
    gpus: int
    hits: int
    opened_or_kept: int
    closed: int
    seconds: float


def gather(conn: psycopg.Connection, thresholds: Thresholds) -> dict[tuple[str, str], list[GpuStats]]:
    lookback = thresholds.lookback
    params = {"lookback": lookback, "idle": thresholds.defaults["idle_percent"],
              "hw": HW_SLOWDOWN_BITS}
    xids: dict[tuple[str, str, str, str], list[int]] = {
        (c, j, n, g): list(codes) for c, j, n, g, codes in conn.execute(_XIDS, params).fetchall()}
    models = {(c, n, g): m for c, n, g, m in conn.execute(_MODELS).fetchall()}
    jobs: dict[tuple[str, str], list[GpuStats]] = defaultdict(list)
    for row in conn.execute(_STATS, params).fetchall():
        (cluster, job, partition, node, uuid, index, n, first, last, start, last_util, last_busy, util_mean,
         gpm_n, sm_active, tensor_max, peak_share, peak_mib, last_mib, throttle, pcie_low, pcie_link) = row
        jobs[(cluster, job)].append(GpuStats(
            cluster, job, partition, node, uuid, index, models.get((cluster, node, uuid)), n, first, last, start,
            None if last_util is None else float(last_util), last_busy,
            None if util_mean is None else float(util_mean), gpm_n,
            None if sm_active is None else float(sm_active), None if tensor_max is None else float(tensor_max),
            peak_share, peak_mib, last_mib, float(throttle or 0), xids.get((cluster, job, node, uuid), []),
            None if pcie_low is None else float(pcie_low), pcie_link))
    return jobs


def evaluate(conn: psycopg.Connection, thresholds: Thresholds) -> CycleResult:
    """One cycle over every running (or just ended) job; commits the flags."""
    started = time.perf_counter()
    cycle_start = conn.execute("SELECT now()").fetchone()[0]
    conn.commit()
    jobs = gather(conn, thresholds)
    hits: dict[tuple[str, str], list[Hit]] = {}
    for key, gpus in jobs.items():
        found = [h for g in gpus for h in gpu_rules(g, thresholds.for_gpu(g.partition, g.model))]
        hits[key] = found + job_rules(gpus, thresholds)
    kept: list[int] = []
    with conn.transaction():
        with conn.cursor() as cur:
            for (cluster, job), found in hits.items():
                for h in found:
                    cur.execute(_UPSERT, (cluster, job, h.rule_id, h.severity, h.category, h.scope, h.scope_key,
                                          h.started_at, Jsonb(h.evidence), h.advice))
                    kept.append(cur.fetchone()[0])
            # Running jobs: a flag not hit this cycle stopped holding. Ended jobs had their last
            # evaluation now: every open flag closes at the job's end.
            closed = cur.execute(
                "UPDATE jobpulse.job_flags f SET ended_at = CASE WHEN j.end_time IS NULL THEN now()"
                " ELSE greatest(j.end_time, f.started_at) END"
                " FROM jobpulse.jobs j WHERE f.ended_at IS NULL AND j.cluster = f.cluster AND j.job_id = f.job_id"
                " AND ((j.end_time IS NOT NULL AND j.rules_final_at IS NULL) OR ((f.cluster, f.job_id) IN"
                "      (SELECT x.c, x.j FROM unnest(%s::text[], %s::text[]) AS x(c, j)) AND NOT f.id = ANY(%s)))",
                ([c for c, _ in hits], [j for _, j in hits], kept)).rowcount
            cur.execute("UPDATE jobpulse.jobs SET rules_final_at = now()"
                        " WHERE end_time IS NOT NULL AND rules_final_at IS NULL AND end_time <= %s", (cycle_start,))
    return CycleResult(len(jobs), sum(len(g) for g in jobs.values()), sum(len(h) for h in hits.values()),
                       len(kept), closed, time.perf_counter() - started)
