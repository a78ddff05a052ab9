"""Run the rules over all running jobs (and jobs that just ended) and keep `job_flags` current:
a hit opens a flag or refreshes it, a flag whose condition stopped holding is closed, and the
flags of an ended job close at its end time. One query over the 10 s roll-ups per cycle serves
the GPU rules; processes, topology and whole-job history are read only where a rule needs them."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import psycopg
from psycopg.types.json import Jsonb

from jobpulse.collector.rules.families import GpuStats, Hit, JobView, ProcStats, Thresholds, gpu_rules, job_rules

_JOBS = """
WITH jobs AS (
    SELECT cluster, job_id, partition, start_time FROM jobpulse.jobs
     WHERE end_time IS NULL OR rules_final_at IS NULL
)"""
# Sums over the window's buckets (a hash aggregate: no per-group ordering) ...
_STATS = _JOBS + """
SELECT r.cluster, r.job_id, min(j.partition), r.node, r.gpu_uuid, sum(r.n), min(r.first_ts), max(r.last_ts),
       min(j.start_time), max(r.last_busy_ts), sum(r.sum_sm_util) / sum(r.n), sum(r.n_gpm),
       sum(r.sum_sm_active) / nullif(sum(r.n_gpm), 0), max(r.max_tensor_active),
       max(r.max_fb_used_mib::float8 / nullif(r.fb_total_mib, 0)), max(r.max_fb_used_mib),
       sum(r.n_hw_throttle)::float8 / sum(r.n), sum(r.n_idle)::float8 / sum(r.n), sum(r.n_busy)::float8 / sum(r.n),
       sum(r.n_pcie_low)::float8 / nullif(sum(r.n_loaded), 0), min(r.pcie_link_low)
  FROM jobpulse.gpu_rollup r JOIN jobs j USING (cluster, job_id)
 WHERE r.width_s = 10 AND r.bucket > now() - %(lookback)s
 GROUP BY r.cluster, r.job_id, r.node, r.gpu_uuid
"""
# ... and the latest values from the newest bucket of each GPU (a GPU silent for two minutes has
# no "now": the idle rule does not judge it).
_LATEST = _JOBS + """
SELECT DISTINCT ON (r.cluster, r.job_id, r.node, r.gpu_uuid) r.cluster, r.job_id, r.node, r.gpu_uuid, r.gpu_index,
       r.last_act, r.last_fb_used_mib
  FROM jobpulse.gpu_rollup r JOIN jobs j USING (cluster, job_id)
 WHERE r.width_s = 10 AND r.bucket > now() - interval '2 minutes'
 ORDER BY r.cluster, r.job_id, r.node, r.gpu_uuid, r.last_ts DESC
"""
_XIDS = """
SELECT h.cluster, h.job_id, h.node, h.gpu_uuid, array_agg(h.code)
  FROM jobpulse.gpu_health_events h
 WHERE h.kind = 'xid' AND h.ts > now() - %(lookback)s AND h.job_id IS NOT NULL AND h.code IS NOT NULL
 GROUP BY 1, 2, 3, 4
"""
# The GPU processes (ranks) of every job over the last 30 s: which rank drives which GPU, and
# from which CPUs (NUMA) ...
_RANKS = """
SELECT p.cluster, p.job_id, p.node, p.pid, max(p.rank), p.gpu_uuid, max(p.command), avg(p.cpu_percent)::float8,
       array_agg(p.cpu) FILTER (WHERE p.cpu IS NOT NULL)
  FROM jobpulse.process_samples p
 WHERE p.job_id = ANY(%(jobs)s) AND p.ts > now() - interval '30 seconds' AND p.gpu_uuid IS NOT NULL
 GROUP BY p.cluster, p.job_id, p.node, p.pid, p.gpu_uuid
"""
# ... and every process of the jobs with a low GPU over the last minutes: is a CPU saturated?
_CPU = """
SELECT p.cluster, p.job_id, p.node, p.pid, max(p.rank), NULL, max(p.command), avg(p.cpu_percent)::float8, NULL
  FROM jobpulse.process_samples p
 WHERE p.job_id = ANY(%(low)s) AND p.ts > now() - %(cpu_window)s
 GROUP BY p.cluster, p.job_id, p.node, p.pid
"""
_TOPOLOGY = "SELECT cluster, node, gpu_uuid, model, links, cpu_affinity FROM jobpulse.topology_current"
# Jobs with a GPU never busy in the window: how many of its GPUs were busy since it started?
_EVER_USED = """
SELECT r.cluster, r.job_id, count(DISTINCT (r.node, r.gpu_uuid)) FILTER (WHERE r.last_busy_ts IS NOT NULL),
       max(j.gpus_total)
  FROM jobpulse.gpu_rollup r JOIN jobpulse.jobs j USING (cluster, job_id)
 WHERE r.width_s = 300 AND r.job_id = ANY(%(jobs)s) AND r.bucket >= coalesce(j.start_time, j.first_seen) - interval '5 minutes'
 GROUP BY 1, 2
"""
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


def gather(conn: psycopg.Connection, thresholds: Thresholds) -> dict[tuple[str, str], JobView]:
    """One pass over the roll-ups for every job the rules judge, plus the little else they need."""
    params: dict[str, object] = {"lookback": thresholds.lookback}
    xids: dict[tuple[str, str, str, str], list[int]] = {
        (c, j, n, g): list(codes) for c, j, n, g, codes in conn.execute(_XIDS, params).fetchall()}
    topo = {(c, n, g): (m, links, cpus) for c, n, g, m, links, cpus in conn.execute(_TOPOLOGY).fetchall()}
    latest = {(c, j, n, g): (i, act, mib) for c, j, n, g, i, act, mib in conn.execute(_LATEST).fetchall()}
    jobs: dict[tuple[str, str], JobView] = {}
    for row in conn.execute(_STATS, params).fetchall():
        (cluster, job, partition, node, uuid, n, first, last, start, last_busy, util_mean, gpm_n, sm_active,
         tensor_max, peak_share, peak_mib, throttle, idle, busy, pcie_low, pcie_link) = row
        model = topo.get((cluster, node, uuid), (None, None, None))[0]
        index, last_util, last_mib = latest.get((cluster, job, node, uuid), (-1, None, None))
        gpu = GpuStats(cluster, job, partition, node, uuid, index, model, int(n), first, last, start,
                       _f(last_util), last_busy, _f(util_mean), int(gpm_n), _f(sm_active), _f(tensor_max),
                       _f(peak_share), peak_mib, last_mib, float(throttle or 0), float(idle), float(busy),
                       xids.get((cluster, job, node, uuid), []), _f(pcie_low), pcie_link)
        view = jobs.setdefault((cluster, job), JobView([]))
        view.gpus.append(gpu)
        cpus = topo.get((cluster, node, uuid), (None, None, None))[2]
        if cpus:
            view.local_cpus[gpu.key] = cpus
        if node not in view.links:
            view.links[node] = {u: links for (c, n, u), (_, links, _) in topo.items() if c == cluster and n == node}
    low = [job for (_, job), v in jobs.items()
           if any((g.activity[0] or 0) < thresholds.for_gpu(g.partition, g.model)["low_percent"] for g in v.gpus)]
    params |= {"jobs": [job for _, job in jobs], "low": low,
               "cpu_window": timedelta(minutes=min(2.0, thresholds.defaults["window_minutes"]))}
    for query in (_RANKS, _CPU):
        for cluster, job, node, pid, rank, uuid, command, cpu_mean, cpus in conn.execute(query, params).fetchall():
            if (cluster, job) in jobs:
                jobs[(cluster, job)].procs.append(ProcStats(node, pid, rank, uuid, command, cpu_mean,
                                                            dict(Counter(cpus or []))))
    params["jobs"] = [job for (_, job), v in jobs.items() if any(g.last_busy is None for g in v.gpus)]
    for cluster, job, used, requested in conn.execute(_EVER_USED, params).fetchall():
        if (cluster, job) in jobs:
            jobs[(cluster, job)].gpus_ever_used, jobs[(cluster, job)].gpus_requested = used, requested
    return jobs


def _f(x: object) -> float | None:
    return None if x is None else float(x)  # type: ignore[arg-type]


def evaluate(conn: psycopg.Connection, thresholds: Thresholds) -> CycleResult:
    """One cycle over every running (or just ended) job; commits the flags."""
    started = time.perf_counter()
    # Compiling these short aggregates costs more than running them; 2,000 GPUs' window of roll-ups
    # hashes in memory instead of sorting on disk (measured: bench/rules.py).
    conn.execute("SET jit = off")
    conn.execute("SET work_mem = '64MB'")
    cycle_start = conn.execute("SELECT now()").fetchone()[0]
    conn.commit()
    jobs = gather(conn, thresholds)
    hits: dict[tuple[str, str], list[Hit]] = {}
    for key, view in jobs.items():
        found = [h for g in view.gpus for h in gpu_rules(g, thresholds.for_gpu(g.partition, g.model), view)]
        hits[key] = found + job_rules(view, thresholds)
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
    return CycleResult(len(jobs), sum(len(v.gpus) for v in jobs.values()), sum(len(h) for h in hits.values()),
                       len(kept), closed, time.perf_counter() - started)
