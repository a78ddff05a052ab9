"""Store: read what the rules judge, for every running (or just ended) job, in a few queries.

One query over the 10 s roll-ups per cycle serves the GPU rules; processes, topology and whole-job
history are read only where a rule needs them.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobpulse.collector.rules.model import GpuStats, JobView, ProcStats
from jobpulse.collector.rules.thresholds import Thresholds

# Which jobs a cycle judges: live, the running ones and those that ended since their last cycle;
# replayed at a past time (backtest), those running then.
_LIVE_JOBS = "end_time IS NULL OR rules_final_at IS NULL"
_JOBS_AT = """coalesce(start_time, first_seen) <= %(now)s AND (end_time IS NULL OR end_time >= %(now)s)
       AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s) AND (%(job)s::text IS NULL OR job_id = %(job)s)"""


def _queries(jobs_where: str) -> dict[str, str]:
    """The statements of one cycle at the clock ``%(now)s``: nothing after it is read."""
    jobs = f"""
WITH jobs AS (
    SELECT cluster, job_id, partition, start_time FROM jobpulse.jobs WHERE {jobs_where}
)"""
    return {
        # Sums over the window's buckets (a hash aggregate: no per-group ordering) ...
        "stats": jobs + """
SELECT r.cluster, r.job_id, min(j.partition) AS partition, r.node, r.gpu_uuid, sum(r.n)::int AS samples,
       min(r.first_ts) AS first_ts, max(r.last_ts) AS last_ts, min(j.start_time) AS job_start,
       max(r.last_busy_ts) AS last_busy, sum(r.sum_sm_util) / sum(r.n) AS util_mean,
       sum(r.n_gpm)::int AS gpm_samples, sum(r.sum_sm_active) / nullif(sum(r.n_gpm), 0) AS sm_active_mean,
       max(r.max_tensor_active)::float8 AS tensor_max,
       max(r.max_fb_used_mib::float8 / nullif(r.fb_total_mib, 0)) AS peak_mem_share,
       max(r.max_fb_used_mib) AS peak_mem_mib,
       coalesce(sum(r.n_hw_throttle)::float8 / sum(r.n), 0) AS hw_throttle_share,
       sum(r.n_idle)::float8 / sum(r.n) AS idle_share, sum(r.n_busy)::float8 / sum(r.n) AS busy_share,
       sum(r.n_pcie_low)::float8 / nullif(sum(r.n_loaded), 0) AS pcie_below_max_share,
       min(r.pcie_link_low) AS pcie_link
  FROM jobpulse.gpu_rollup r JOIN jobs j USING (cluster, job_id)
 WHERE r.width_s = 10 AND r.bucket > %(now)s - %(lookback)s AND r.bucket <= %(now)s
 GROUP BY r.cluster, r.job_id, r.node, r.gpu_uuid
""",
        # ... and the latest values from the newest bucket of each GPU (a GPU silent for two minutes
        # has no "now": the idle rule does not judge it).
        "latest": jobs + """
SELECT DISTINCT ON (r.cluster, r.job_id, r.node, r.gpu_uuid) r.cluster, r.job_id, r.node, r.gpu_uuid, r.gpu_index,
       r.last_act::float8, r.last_fb_used_mib
  FROM jobpulse.gpu_rollup r JOIN jobs j USING (cluster, job_id)
 WHERE r.width_s = 10 AND r.bucket > %(now)s - interval '2 minutes' AND r.bucket <= %(now)s
 ORDER BY r.cluster, r.job_id, r.node, r.gpu_uuid, r.last_ts DESC
""",
        "xids": """
SELECT h.cluster, h.job_id, h.node, h.gpu_uuid, array_agg(h.code)
  FROM jobpulse.gpu_health_events h
 WHERE h.kind = 'xid' AND h.ts > %(now)s - %(lookback)s AND h.ts <= %(now)s AND h.job_id IS NOT NULL
   AND h.code IS NOT NULL
 GROUP BY 1, 2, 3, 4
""",
        # The GPU processes (ranks) of every job over the last 30 s: which rank drives which GPU,
        # and from which CPUs (NUMA) ...
        "ranks": """
SELECT p.cluster, p.job_id, p.node, p.pid, max(p.rank), p.gpu_uuid, max(p.command), avg(p.cpu_percent)::float8,
       array_agg(p.cpu) FILTER (WHERE p.cpu IS NOT NULL)
  FROM jobpulse.process_samples p
 WHERE p.job_id = ANY(%(jobs)s) AND p.ts > %(now)s - interval '30 seconds' AND p.ts <= %(now)s
   AND p.gpu_uuid IS NOT NULL
 GROUP BY p.cluster, p.job_id, p.node, p.pid, p.gpu_uuid
""",
        # ... and every process of the jobs with a low GPU over the last minutes: is a CPU saturated?
        "cpu": """
SELECT p.cluster, p.job_id, p.node, p.pid, max(p.rank), NULL, max(p.command), avg(p.cpu_percent)::float8, NULL
  FROM jobpulse.process_samples p
 WHERE p.job_id = ANY(%(low)s) AND p.ts > %(now)s - %(cpu_window)s AND p.ts <= %(now)s
 GROUP BY p.cluster, p.job_id, p.node, p.pid
""",
        "topology": "SELECT cluster, node, gpu_uuid, model, links, cpu_affinity FROM jobpulse.topology_current",
        # Jobs with a GPU never busy in the window: how many of its GPUs were busy since it started?
        "ever_used": """
SELECT r.cluster, r.job_id, count(DISTINCT (r.node, r.gpu_uuid)) FILTER (WHERE r.last_busy_ts IS NOT NULL),
       max(j.gpus_total)
  FROM jobpulse.gpu_rollup r JOIN jobpulse.jobs j USING (cluster, job_id)
 WHERE r.width_s = 300 AND r.job_id = ANY(%(jobs)s) AND r.bucket <= %(now)s
   AND r.bucket >= coalesce(j.start_time, j.first_seen) - interval '5 minutes'
 GROUP BY 1, 2
""",
    }


_LIVE = _queries(_LIVE_JOBS)
_REPLAY = _queries(_JOBS_AT)


def start_cycle(conn: psycopg.Connection[Any]) -> datetime:
    """Set the session up for a cycle and return the database's time at its start."""
    # Compiling these short aggregates costs more than running them; 2,000 GPUs' window of roll-ups
    # hashes in memory instead of sorting on disk (measured: bench/rules.py).
    conn.execute("SET jit = off")
    conn.execute("SET work_mem = '64MB'")
    row = conn.execute("SELECT now()").fetchone()
    conn.commit()
    assert row is not None
    return row[0]


def gather(conn: psycopg.Connection[Any], thresholds: Thresholds, now: datetime, *, replay: bool = False,
           cluster: str | None = None, job: str | None = None) -> dict[tuple[str, str], JobView]:
    """One pass over the roll-ups for every job the rules judge at ``now``, plus the little else
    they need. ``replay``: judge the jobs that were running at ``now`` (a past time), as a live cycle
    then would have, optionally only one cluster's or one job's."""
    q = _REPLAY if replay else _LIVE
    params: dict[str, object] = {"lookback": thresholds.lookback, "now": now, "cluster": cluster, "job": job}
    xids: dict[tuple[str, str, str, str], list[int]] = {
        (c, j, n, g): list(codes) for c, j, n, g, codes in conn.execute(q["xids"], params).fetchall()}
    topo = {(c, n, g): (m, links, cpus) for c, n, g, m, links, cpus in conn.execute(q["topology"]).fetchall()}
    latest = {(c, j, n, g): (i, act, mib) for c, j, n, g, i, act, mib in conn.execute(q["latest"], params).fetchall()}
    jobs: dict[tuple[str, str], JobView] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        for row in cur.execute(q["stats"], params).fetchall():
            key = (row["cluster"], row["job_id"], row["node"], row["gpu_uuid"])
            model, _, cpus = topo.get(key[:1] + key[2:], (None, None, None))
            index, last_util, last_mib = latest.get(key, (-1, None, None))
            gpu = GpuStats(**row, gpu_index=index, model=model, last_util=last_util, last_mem_mib=last_mib,
                           xids=xids.get(key, []))
            view = jobs.setdefault(key[:2], JobView([]))
            view.gpus.append(gpu)
            if cpus:
                view.local_cpus[gpu.key] = cpus
            node = row["node"]
            if node not in view.links:
                view.links[node] = {u: links for (c, n, u), (_, links, _) in topo.items()
                                    if c == row["cluster"] and n == node}
    low = [j for (_, j), v in jobs.items()
           if any((g.activity[0] or 0) < thresholds.for_gpu(g.partition, g.model)["low_percent"] for g in v.gpus)]
    params |= {"jobs": [j for _, j in jobs], "low": low,
               "cpu_window": timedelta(minutes=min(2.0, thresholds.defaults["window_minutes"]))}
    for query in (q["ranks"], q["cpu"]):
        for c, j, node, pid, rank, uuid, command, cpu_mean, cpus in conn.execute(query, params).fetchall():
            if (c, j) in jobs:
                jobs[(c, j)].procs.append(ProcStats(node, pid, rank, uuid, command, cpu_mean,
                                                            dict(Counter(cpus or []))))
    params["jobs"] = [j for (_, j), v in jobs.items() if any(g.last_busy is None for g in v.gpus)]
    for c, j, used, requested in conn.execute(q["ever_used"], params).fetchall():
        if (c, j) in jobs:
            jobs[(c, j)].gpus_ever_used, jobs[(c, j)].gpus_requested = used, requested
    return jobs
