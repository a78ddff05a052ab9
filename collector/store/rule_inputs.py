"""Store: read what the rules judge, for every running (or just ended) job, in a few queries.

One query over the 10 s roll-ups per cycle gives every GPU its window block by block; faults,
processes, and a GPU's history before the window are read only where a rule needs them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobpulse.collector.rules.evidence import idle_stretch
from jobpulse.collector.rules.model import Block, Ecc, GpuStats, JobView, ProcStats
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.schema.semantics import activity_mean_sql

# Which jobs a cycle judges: live, the running ones and those that ended since their last cycle;
# replayed at a past time (backtest), those running then.
_LIVE_JOBS = "end_time IS NULL OR rules_final_at IS NULL"
_JOBS_AT = """coalesce(start_time, first_seen) <= %(now)s AND (end_time IS NULL OR end_time >= %(now)s)
       AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s) AND (%(job)s::text IS NULL OR job_id = %(job)s)"""

SILENT = timedelta(minutes=2)
"""A GPU with no sample for this long is not reporting: its usage is not judged (its faults are)."""


_STATS = """m AS (
    SELECT r.cluster, r.job_id, r.node, r.gpu_uuid,
           date_bin(make_interval(secs => %(block)s), r.bucket, timestamptz 'epoch') AS block,
           max(r.gpu_index) AS gpu_index, sum(r.n)::int AS n, sum(r.n_idle)::int AS n_idle,
           sum(r.n_busy)::int AS n_busy, {activity} AS act,
           sum(r.sum_sm_active) / nullif(sum(r.n_gpm), 0) AS sm_active, max(r.max_tensor_active)::float8 AS tensor,
           max(r.max_fb_used_mib) AS fb, max(r.fb_total_mib) AS fb_total, min(r.first_ts) AS first_ts,
           max(r.last_ts) AS last_ts, (array_agg(r.last_fb_used_mib ORDER BY r.last_ts DESC))[1] AS last_fb,
           sum(r.n_hw_throttle) AS throttled, sum(r.n_loaded) AS loaded, sum(r.n_pcie_low) AS pcie_low,
           min(r.pcie_link_low) AS link, min(r.min_ecc_dbe_total) AS dbe_lo, max(r.max_ecc_dbe_total) AS dbe_hi,
           min(r.min_ecc_sbe_total) AS sbe_lo, max(r.max_ecc_sbe_total) AS sbe_hi,
           bool_or(r.any_remap_pending) AS pending, bool_or(r.any_remap_failure) AS failure
      FROM jobpulse.gpu_rollup r {join}
     WHERE {where}r.width_s = 10 AND r.bucket > %(now)s - %(lookback)s AND r.bucket <= %(now)s
     GROUP BY 1, 2, 3, 4, 5
)
SELECT m.cluster, m.job_id, {partition} AS partition, m.node, m.gpu_uuid, max(m.gpu_index) AS gpu_index,
       min(m.first_ts) AS first_ts, max(m.last_ts) AS last_ts, {job_start} AS job_start,
       array_agg(m.block ORDER BY m.block) AS b_start, array_agg(m.n ORDER BY m.block) AS b_n,
       array_agg(m.n_idle ORDER BY m.block) AS b_idle, array_agg(m.n_busy ORDER BY m.block) AS b_busy,
       array_agg(m.act ORDER BY m.block) AS b_act, array_agg(m.sm_active ORDER BY m.block) AS b_sm,
       array_agg(m.tensor ORDER BY m.block) AS b_tensor, array_agg(m.fb ORDER BY m.block) AS b_fb,
       max(m.fb_total) AS fb_total_mib, (array_agg(m.last_fb ORDER BY m.block DESC))[1] AS last_mem_mib,
       array_agg(coalesce(m.throttled, 0)::int ORDER BY m.block) AS b_throttled,
       sum(m.pcie_low)::float8 / nullif(sum(m.loaded), 0) AS pcie_below_max_share,
       coalesce(sum(m.loaded), 0)::int AS pcie_loaded_samples, min(m.link) AS pcie_link,
       coalesce(max(m.dbe_hi) - min(m.dbe_lo), 0)::int AS dbe_increase,
       coalesce(max(m.sbe_hi) - min(m.sbe_lo), 0)::int AS sbe_increase,
       coalesce(bool_or(m.pending), false) AS remap_pending, coalesce(bool_or(m.failure), false) AS remap_failure
  FROM m {join}
 GROUP BY m.cluster, m.job_id, m.node, m.gpu_uuid
"""


def _stats(join: str, where: str, partition: str, job_start: str) -> str:
    """Each GPU's window block by block (the evidence of every mean), with its totals: ``join`` and
    ``where`` pick the GPUs (of the jobs judged, or those no job holds)."""
    return _STATS.format(activity=activity_mean_sql("r."), join=join, where=where, partition=partition,
                         job_start=job_start)


def _queries(jobs_where: str) -> dict[str, str]:
    """The statements of one cycle at the clock ``%(now)s``: nothing after it is read."""
    jobs = f"""
WITH jobs AS (
    SELECT cluster, job_id, partition, start_time, first_seen FROM jobpulse.jobs WHERE {jobs_where}
)"""
    return {
        "stats": jobs + ",\n" + _stats("JOIN jobs j USING (cluster, job_id)", "", "min(j.partition)",
                                        "min(j.start_time)"),
        # XIDs and lost GPUs since each job started: a fault stays the job's cause until it ends.
        "faults": jobs + """
SELECT h.cluster, h.job_id, h.node, h.gpu_uuid, h.kind, h.code, min(h.ts)
  FROM jobpulse.gpu_health_events h JOIN jobs j USING (cluster, job_id)
 WHERE h.kind IN ('xid', 'gpu_lost') AND h.gpu_uuid IS NOT NULL AND h.ts <= %(now)s
   AND h.ts >= coalesce(j.start_time, j.first_seen) - interval '1 minute'
 GROUP BY 1, 2, 3, 4, 5, 6
""",
        # The GPU processes (ranks) of every job over the last 30 s: which rank drives which GPU,
        # and from which CPUs (NUMA) ...
        "ranks": """
SELECT p.cluster, p.job_id, p.node, p.pid, max(p.rank), p.gpu_uuid, max(p.command),
       array_agg(p.cpu) FILTER (WHERE p.cpu IS NOT NULL)
  FROM jobpulse.process_samples p
 WHERE p.job_id = ANY(%(jobs)s) AND p.ts > %(now)s - interval '30 seconds' AND p.ts <= %(now)s
   AND p.gpu_uuid IS NOT NULL
 GROUP BY p.cluster, p.job_id, p.node, p.pid, p.gpu_uuid
""",
        # ... and, for jobs with an underused GPU, every process minute by minute (is its rank's
        # data pipeline saturated?).
        "cpu": """
SELECT p.cluster, p.job_id, p.node, p.pid, p.rank, p.gpu_uuid, p.command, p.bucket,
       p.sum_cpu_percent / nullif(p.n_cpu, 0), 100.0 * p.n_runnable / nullif(p.n, 0)
  FROM jobpulse.process_rollup p
 WHERE p.width_s = 60 AND p.job_id = ANY(%(underused)s) AND p.bucket > %(now)s - %(lookback)s
   AND p.bucket <= %(now)s
""",
        "topology": "SELECT cluster, node, gpu_uuid, model, links, cpu_affinity FROM jobpulse.topology_current",
        # GPUs idle all window: were they ever busy since the job started, and since when idle?
        "history": """
SELECT x.c, x.j, x.n, x.g,
       (SELECT coalesce(sum(r.n_busy), 0) >= 3 FROM jobpulse.gpu_rollup r
         WHERE r.width_s = 300 AND r.cluster = x.c AND r.job_id = x.j AND r.node = x.n AND r.gpu_uuid = x.g
           AND r.bucket <= %(now)s),
       (SELECT max(r.bucket) + interval '300 seconds' FROM jobpulse.gpu_rollup r
         WHERE r.width_s = 300 AND r.cluster = x.c AND r.job_id = x.j AND r.node = x.n AND r.gpu_uuid = x.g
           AND r.bucket < x.before AND r.n_idle < %(idle_share)s * r.n)
  FROM unnest(%(c)s::text[], %(j)s::text[], %(n)s::text[], %(g)s::text[], %(before)s::timestamptz[])
       AS x(c, j, n, g, before)
""",
    }


_LIVE = _queries(_LIVE_JOBS)
_REPLAY = _queries(_JOBS_AT)
_NODES = {
    # GPUs no job holds (their samples carry no job), for the hardware rules only ...
    "stats": "WITH " + _stats("", "r.job_id = '' AND ", "NULL::text", "NULL::timestamptz"),
    # ... and their XIDs and losses within the look-back.
    "faults": """
SELECT h.cluster, '', h.node, h.gpu_uuid, h.kind, h.code, min(h.ts)
  FROM jobpulse.gpu_health_events h
 WHERE h.kind IN ('xid', 'gpu_lost') AND h.gpu_uuid IS NOT NULL AND h.job_id IS NULL
   AND h.ts > %(now)s - %(lookback)s AND h.ts <= %(now)s
 GROUP BY 1, 2, 3, 4, 5, 6
""",
}


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


def _blocks(row: dict[str, Any]) -> tuple[Block, ...]:
    return tuple(Block(*b) for b in zip(*(row.pop(f"b_{c}") for c in ("start", "n", "idle", "busy", "act", "sm",
                                                                       "tensor", "fb", "throttled")), strict=True))


def _gpu(row: dict[str, Any], model: str | None, now: datetime) -> GpuStats:
    blocks = _blocks(row)
    ecc = Ecc(row.pop("dbe_increase"), row.pop("sbe_increase"), row.pop("remap_pending"), row.pop("remap_failure"))
    return GpuStats(**row, model=model, blocks=blocks, ecc=ecc, reporting=row["last_ts"] >= now - SILENT)


def _params(thresholds: Thresholds, now: datetime, **more: object) -> dict[str, object]:
    return {"lookback": thresholds.lookback, "now": now, "block": thresholds.defaults["evidence_block_seconds"],
            **more}


def gather(conn: psycopg.Connection[Any], thresholds: Thresholds, now: datetime, *, replay: bool = False,
           cluster: str | None = None, job: str | None = None) -> dict[tuple[str, str], JobView]:
    """One pass over the roll-ups for every job the rules judge at ``now``, plus the little else
    they need. ``replay``: judge the jobs that were running at ``now`` (a past time), as a live cycle
    then would have, optionally only one cluster's or one job's."""
    q = _REPLAY if replay else _LIVE
    params = _params(thresholds, now, cluster=cluster, job=job)
    topo = {(c, n, g): (m, links, cpus) for c, n, g, m, links, cpus in conn.execute(q["topology"]).fetchall()}
    jobs: dict[tuple[str, str], JobView] = {}
    for gpu in _gpus(conn, q["stats"], params, topo, now):
        view = jobs.setdefault((gpu.cluster, gpu.job_id), JobView([]))
        view.gpus.append(gpu)
        _, _, cpus = topo.get((gpu.cluster, gpu.node, gpu.gpu_uuid), (None, None, None))
        if cpus:
            view.local_cpus[gpu.key] = cpus
        if gpu.node not in view.links:
            view.links[gpu.node] = {u: links for (c, n, u), (_, links, _) in topo.items()
                                    if c == gpu.cluster and n == gpu.node}
    _add_faults(conn, q["faults"], params, jobs, lambda c, j, node: (c, j))
    _add_history(conn, q, params, jobs, thresholds)
    _add_processes(conn, q, params, jobs, thresholds)
    return jobs


def gather_unheld(conn: psycopg.Connection[Any], thresholds: Thresholds, now: datetime) -> dict[tuple[str, str],
                                                                                                  JobView]:
    """GPUs no job holds, by (cluster, node): their hardware is judged too (node flags), so admins
    hear of a sick GPU before a job lands on it."""
    params = _params(thresholds, now)
    topo = {(c, n, g): (m, links, cpus) for c, n, g, m, links, cpus in conn.execute(_LIVE["topology"]).fetchall()}
    nodes: dict[tuple[str, str], JobView] = {}
    for gpu in _gpus(conn, _NODES["stats"], params, topo, now):
        nodes.setdefault((gpu.cluster, gpu.node), JobView([])).gpus.append(gpu)
    _add_faults(conn, _NODES["faults"], params, nodes, lambda c, j, node: (c, node))
    return nodes


def _gpus(conn: psycopg.Connection[Any], stats: str, params: dict[str, object],
          topo: dict[tuple[str, str, str], tuple[Any, Any, Any]], now: datetime) -> list[GpuStats]:
    with conn.cursor(row_factory=dict_row) as cur:
        return [_gpu(row, topo.get((row["cluster"], row["node"], row["gpu_uuid"]), (None,))[0], now)
                for row in cur.execute(stats, params).fetchall()]


def _replace(view: JobView | None, node: str, uuid: str, **changes: Any) -> None:
    if view is not None:
        view.gpus = [dataclasses.replace(g, **changes) if (g.node, g.gpu_uuid) == (node, uuid) else g
                     for g in view.gpus]


def _add_faults(conn: psycopg.Connection[Any], query: str, params: dict[str, object],
                views: dict[tuple[str, str], JobView], view_of: Callable[[str, str, str], tuple[str, str]]) -> None:
    """XIDs and lost GPUs onto the GPUs they concern; a GPU silent for the whole look-back (lost)
    still carries its fault."""
    faults: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for c, j, node, uuid, kind, code, first in conn.execute(query, params).fetchall():
        found = faults.setdefault((c, j, node, uuid), {"xids": {}})
        if kind == "gpu_lost":
            found["lost_at"] = first
        elif code is not None:
            found["xids"][int(code)] = first
    for (c, j, node, uuid), changes in faults.items():
        key = view_of(c, j, node)
        view = views.setdefault(key, JobView([])) if not j else views.get(key)
        if view is not None and not any((g.node, g.gpu_uuid) == (node, uuid) for g in view.gpus):
            first = min([*changes["xids"].values(), changes.get("lost_at") or params["now"]])
            view.gpus.append(GpuStats(c, j, None, node, uuid, -1, None, first, first, None, reporting=False))
        _replace(view, node, uuid, **changes)


def _add_history(conn: psycopg.Connection[Any], q: dict[str, str], params: dict[str, object],
                 jobs: dict[tuple[str, str], JobView], thresholds: Thresholds) -> None:
    """For GPUs idle for idle_minutes or more: was the GPU ever busy since the job started (never:
    over-allocation), and when did an idle stretch that reaches past the look-back begin?"""
    idle = []
    for (c, j), view in jobs.items():
        for g in view.gpus:
            t = thresholds.for_gpu(g.partition, g.model)
            found = idle_stretch(g, t)
            if found and g.last_ts - found[0] >= timedelta(minutes=t["idle_minutes"]):
                idle.append((c, j, g.node, g.gpu_uuid, g.blocks[0].start))
    if not idle:
        return
    columns = dict(zip(("c", "j", "n", "g", "before"), map(list, zip(*idle, strict=True)), strict=True))
    rows = conn.execute(q["history"], {**params, **columns, "idle_share": thresholds.defaults["idle_share"]})
    for c, j, node, uuid, ever_busy, idle_before in rows.fetchall():
        _replace(jobs.get((c, j)), node, uuid, ever_busy=ever_busy, idle_before=idle_before)


def _underused(g: GpuStats, t: dict[str, Any]) -> bool:
    """A block of the window low or stalling: the rules may ask about its rank's pipeline."""
    return any((m.act is not None and m.act < t["low_percent"])
               or (m.n and min(m.idle, m.busy) >= t["stall_share"] * m.n) for m in g.blocks)


def _add_processes(conn: psycopg.Connection[Any], q: dict[str, str], params: dict[str, object],
                   jobs: dict[tuple[str, str], JobView], thresholds: Thresholds) -> None:
    underused = [j for (_, j), v in jobs.items()
                 if any(_underused(g, thresholds.for_gpu(g.partition, g.model)) for g in v.gpus)]
    params = {**params, "jobs": [j for _, j in jobs], "underused": underused}
    procs: dict[tuple[str, str, str, int], ProcStats] = {}
    for c, j, node, pid, rank, uuid, command, cpus in conn.execute(q["ranks"], params).fetchall():
        procs[(c, j, node, pid)] = ProcStats(node, pid, rank, uuid, command, cpus=dict(Counter(cpus or [])))
    for c, j, node, pid, rank, uuid, command, minute, cpu, runnable in conn.execute(q["cpu"], params).fetchall():
        p = procs.get((c, j, node, pid))
        if p is None:
            p = procs[(c, j, node, pid)] = ProcStats(node, pid, rank, uuid, command)
        if cpu is not None:
            p.cpu_by_minute[minute] = cpu
        if runnable:
            p.runnable_by_minute[minute] = runnable
    for (c, j, *_), p in procs.items():
        if (c, j) in jobs:
            jobs[(c, j)].procs.append(p)
