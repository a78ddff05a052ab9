"""Store: what the rules read, as typed rows: for every running (or just ended) job, in a few
statements, the 10 s roll-ups block by block, faults, ranks, per-minute CPU, topology, each idle
GPU's history and a hung job's evidence. Each read is a function returning rows of a type defined
beside it, named as its query names its columns; the rules (`collector/rules/inputs.py`) hold no SQL
and never unpack a row by position."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg.rows import RowMaker

from jobpulse.collector.store.read import fabric_reads
from jobpulse.collector.store.tiers import rollup
from jobpulse.schema.semantics import activity_mean_sql

# Which jobs a cycle judges: live, the running ones and those that ended since their last cycle;
# replayed at a past time (backtest), those running then.
# (Both arms match a partial index: jobpulse.jobs keeps every job that ever ran.)
LIVE_JOBS = "end_time IS NULL OR (end_time IS NOT NULL AND rules_final_at IS NULL)"
JOBS_AT = """coalesce(start_time, first_seen) <= %(now)s AND (end_time IS NULL OR end_time >= %(now)s)
       AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s) AND (%(job)s::text IS NULL OR job_id = %(job)s)"""


_BLOCKS = """
SELECT r.cluster, r.job_id, r.node, r.gpu_uuid,
       date_bin(make_interval(secs => %(block)s), r.bucket, timestamptz 'epoch') AS block,
       sum(r.n)::int AS n, sum(r.n_idle)::int AS n_idle, sum(r.n_busy)::int AS n_busy, {activity} AS act,
       sum(r.sum_sm_active) / nullif(sum(r.n_gpm), 0) AS sm_active, max(r.max_tensor_active)::float8 AS tensor,
       max(r.max_fb_used_mib) AS fb, sum(r.n_hw_throttle) AS throttled, sum(r.sum_power_w) / nullif(sum(r.n), 0) AS power,
       (sum(r.sum_sm_util) / nullif(sum(r.n), 0))::float8 AS duty,
       CASE WHEN count(r.sum_pcie_rx_kbs) + count(r.sum_pcie_tx_kbs) + count(r.sum_nvlink_rx_kbs)
                 + count(r.sum_nvlink_tx_kbs) > 0
            THEN ((coalesce(sum(r.sum_pcie_rx_kbs), 0) + coalesce(sum(r.sum_pcie_tx_kbs), 0)
                  + coalesce(sum(r.sum_nvlink_rx_kbs), 0) + coalesce(sum(r.sum_nvlink_tx_kbs), 0))
                 / nullif(sum(r.n), 0))::float8 END AS traffic,
       max(r.power_limit_w) AS power_limit,
       max(r.gpu_index) AS gpu_index,
       max(r.fb_total_mib) AS fb_total, min(r.first_ts) AS first_ts, max(r.last_ts) AS last_ts,
       (array_agg(r.last_fb_used_mib ORDER BY r.last_ts DESC))[1] AS last_fb, sum(r.n_loaded) AS loaded,
       sum(r.n_pcie_low) AS pcie_low, min(r.pcie_link_low) AS link,
       min(r.min_ecc_dbe_total) AS dbe_lo, max(r.max_ecc_dbe_total) AS dbe_hi, min(r.min_ecc_sbe_total) AS sbe_lo,
       max(r.max_ecc_sbe_total) AS sbe_hi, bool_or(r.any_remap_pending) AS pending,
       bool_or(r.any_remap_failure) AS failure
  FROM unnest(%(c)s::text[], %(j)s::text[], %(since)s::timestamptz[]) AS x(c, j, since)
  JOIN {source} ON r.cluster = x.c AND r.job_id = x.j
 WHERE r.bucket >= x.since AND r.bucket >= %(from)s AND r.bucket <= %(now)s
 GROUP BY 1, 2, 3, 4, 5
"""
BLOCKS = _BLOCKS.format(source=f"jobpulse.{rollup.FINE_TABLE} r", activity=activity_mean_sql("r."))
"""Block by block (the evidence of every mean), the 10 s roll-ups of the GPUs of jobs (cluster, job)
from each job's ``since`` (a block boundary), as `BlockRow`s. ``from``, the earliest ``since``,
repeats that bound as one value the planner can see: with only the array's, it expected most of the
day's rows and sorted them all instead of reading each job's last minutes by its index (most of a
cycle at 8,000 GPUs, `bench/rules.py`)."""
BLOCKS_FROM_SAMPLES = _BLOCKS.format(source=f"""({rollup.gpu_buckets(
    "jobpulse.gpu_samples_between(%(from)s, %(now)s)", rollup.FINE_WIDTH_S)}) r""", activity=activity_mean_sql("r."))
"""`BLOCKS` for a window that starts before the 10 s buckets do (`FINE_SINCE`: a backtest of days
whose buckets retention dropped): the same blocks, from the samples binned as ingest bins them."""
FINE_SINCE = "SELECT extract(epoch FROM jobpulse.gpu_rollup_10s_since())::float8"  # infinity: none


JOBS = ("SELECT cluster, job_id, partition, start_time, coalesce(start_time, first_seen),"
        " CASE WHEN end_time <= %(now)s THEN end_time END FROM jobpulse.jobs WHERE ")  # an end a replay may know
_GPU_PIDS = """gpu_pids AS (  -- the processes seen on each job's GPUs lately: the ranks
    SELECT DISTINCT p.cluster, p.job_id, p.node, p.pid
      FROM unnest(%(c)s::text[], %(j)s::text[]) AS x(c, j)
      JOIN jobpulse.process_rollup p ON p.width_s = 60 AND p.cluster = x.c AND p.job_id = x.j
     WHERE p.bucket > %(now)s - %(lookback)s - interval '1 hour' AND p.bucket <= %(now)s AND p.gpu_uuid IS NOT NULL)"""
_FROM_RANKS = """({a}.cluster, {a}.job_id, {a}.node, {a}.pid) IN (SELECT * FROM gpu_pids)
       OR NOT EXISTS (SELECT 1 FROM gpu_pids g WHERE g.cluster = {a}.cluster AND g.job_id = {a}.job_id)"""
"""Steps and phases that speak for a job's ranks (`last_step`, `phases`: what keeps a stall from being
called a hang) are those sent by a process seen on one of the job's GPUs: a process of the job's
user outside its ranks (a loop on the node naming the job) cannot shield a hung job from the hang
policy. Where no process of the job is seen on a GPU (NVML shows no processes, as in some
containers), the ranks' events count as before."""
JOB_ARRAYS = "unnest(%(c)s::text[], %(j)s::text[], %(js)s::timestamptz[]) AS j(cluster, job_id, start)"
Q = {
    # XIDs and lost GPUs since each job started: a fault stays the job's cause until it ends.
    "faults": f"""
SELECT h.cluster, h.job_id, h.node, h.gpu_uuid, h.kind, h.code, min(h.ts)
  FROM jobpulse.gpu_health_events h JOIN {JOB_ARRAYS} USING (cluster, job_id)
 WHERE h.kind IN ('xid', 'gpu_lost') AND h.gpu_uuid IS NOT NULL AND h.ts <= %(now)s
   AND h.ts >= j.start - interval '1 minute'
 GROUP BY 1, 2, 3, 4, 5, 6
""",
    # The GPU processes (ranks) of every job over the last 30 s: which rank drives which GPU,
    # and from which CPUs (NUMA) ... (through both tiers: a backtest replays compacted days)
    "ranks": """
SELECT p.cluster, p.job_id, p.node, p.pid, max(p.rank), p.gpu_uuid, max(p.command),
       array_agg(p.cpu) FILTER (WHERE p.cpu IS NOT NULL)  -- once a tick: a row stands for 1 + held
  FROM jobpulse.process_samples_between(%(now)s - interval '30 seconds', %(now)s) p
 CROSS JOIN LATERAL generate_series(0, coalesce(p.held, 0))
 WHERE p.job_id = ANY(%(j)s) AND p.ts > %(now)s - interval '30 seconds' AND p.ts <= %(now)s
   AND p.gpu_uuid IS NOT NULL
 GROUP BY p.cluster, p.job_id, p.node, p.pid, p.gpu_uuid
""",
    # ... and, for jobs with a GPU input_bound judges, every process minute by minute (is its
    # rank's data pipeline saturated?) from each job's ``since``: the minutes a `MinuteCache` does
    # not hold (``ufrom`` repeats their earliest, as ``from`` does in BLOCKS).
    "cpu": """
SELECT p.cluster, p.job_id, p.node, p.pid, p.rank, p.gpu_uuid, p.command, p.bucket,
       p.sum_cpu_percent / nullif(p.n_cpu, 0), 100.0 * p.n_runnable / nullif(p.n, 0), p.max_cpus_allowed
  FROM unnest(%(uc)s::text[], %(uj)s::text[], %(us)s::timestamptz[]) AS x(c, j, since)
  JOIN jobpulse.process_rollup p ON p.width_s = 60 AND p.cluster = x.c AND p.job_id = x.j
 WHERE p.bucket >= x.since AND p.bucket >= %(ufrom)s AND p.bucket > %(now)s - %(lookback)s AND p.bucket <= %(now)s
""",
    "topology": "SELECT cluster, node, gpu_uuid, model, links, cpu_affinity, parent_uuid, mig_profile,"
                " CASE WHEN parent_uuid IS NOT NULL THEN jobpulse.gpu_name(cluster, node, gpu_uuid, gpu_index) END"
                " FROM jobpulse.topology_current",
    # GPUs idle all window: were they ever busy since the job started, and since when idle?
    "history": """
SELECT r.cluster, r.job_id, r.node, r.gpu_uuid, coalesce(sum(r.n_busy) FILTER (WHERE r.bucket <= %(now)s), 0) >= 3,
       max(r.bucket) FILTER (WHERE r.bucket < x.before AND r.n_idle < x.idle_share * r.n) + interval '300 seconds'
  FROM unnest(%(c)s::text[], %(j)s::text[], %(n)s::text[], %(g)s::text[], %(before)s::timestamptz[],
              %(idle_share)s::float8[]) AS x(c, j, n, g, before, idle_share)
  JOIN jobpulse.gpu_rollup r
    ON r.width_s = 300 AND r.cluster = x.c AND r.job_id = x.j AND r.node = x.n AND r.gpu_uuid = x.g
 GROUP BY r.cluster, r.job_id, r.node, r.gpu_uuid, x.before
""",  # a join grouped by the GPU, not a subquery per GPU: Citus runs it on the shards
    # The working level of jobs that may hang: the highest 5-min mean power of a mostly busy GPU
    # since each started (a hang longer than the look-back leaves none of its working minutes there).
    "worked_power": """
SELECT r.cluster, r.job_id, max(r.sum_power_w / nullif(r.n, 0)) FILTER (WHERE r.n_busy * 2 >= r.n)
  FROM unnest(%(c)s::text[], %(j)s::text[], %(js)s::timestamptz[]) AS x(c, j, start)
  JOIN jobpulse.gpu_rollup r ON r.width_s = 300 AND r.cluster = x.c AND r.job_id = x.j
 WHERE r.bucket >= x.start - interval '300 seconds' AND r.bucket <= %(now)s
 GROUP BY 1, 2
""",
    # The ranks that drove each GPU of hung jobs within the look-back (a rank that exited has no process now).
    "gpu_ranks": """
SELECT p.cluster, p.job_id, p.node, p.gpu_uuid, array_agg(DISTINCT p.rank ORDER BY p.rank)
  FROM unnest(%(c)s::text[], %(j)s::text[]) AS x(c, j)
  JOIN jobpulse.process_rollup p ON p.width_s = 60 AND p.cluster = x.c AND p.job_id = x.j
 WHERE p.bucket > %(now)s - %(lookback)s AND p.bucket <= %(now)s AND p.gpu_uuid IS NOT NULL AND p.rank IS NOT NULL
 GROUP BY 1, 2, 3, 4
""",
    # The newest minute with a step event of hung jobs within the look-back (steps that go on: not hung).
    "last_step": f"""
WITH {_GPU_PIDS}
SELECT e.cluster, e.job_id, date_trunc('minute', max(e.ts))
  FROM unnest(%(c)s::text[], %(j)s::text[]) AS x(c, j)
  JOIN jobpulse.events e ON e.kind = 'step' AND e.cluster = x.c AND e.job_id = x.j
 WHERE e.ts > %(now)s - %(lookback)s AND e.ts <= %(now)s AND ({_FROM_RANKS.format(a="e")})
 GROUP BY 1, 2
""",
    # The phases of hung jobs within the look-back, the end only if it had come by ``now`` (a replay
    # knows ends that had not happened then): a checkpoint or an evaluation the others wait for.
    "phases": f"""
WITH {_GPU_PIDS}
SELECT p.cluster, p.job_id, p.phase, p.started_at, CASE WHEN p.ended_at <= %(now)s THEN p.ended_at END
  FROM jobpulse.job_phases p JOIN unnest(%(c)s::text[], %(j)s::text[]) AS x(c, j) ON p.cluster = x.c AND p.job_id = x.j
 WHERE p.started_at <= %(now)s AND p.started_at > %(now)s - interval '1 day'
   AND (p.ended_at IS NULL OR p.ended_at > %(now)s - %(lookback)s) AND ({_FROM_RANKS.format(a="p")})
""",
    # What each process of jobs that may hang did over the last minute, from the samples (both tiers):
    # its newest state letter, the share of its samples running or in I/O wait (R, D), its mean CPU and
    # its peak read and write rates (a rank outside the barrier writing a checkpoint is working; a
    # zombie has exited). Each row weighs the ticks it stands for (1 + held).
    "rank_activity": """
SELECT p.cluster, p.job_id, p.node, p.pid, max(p.rank), max(p.gpu_uuid), max(p.command), max(p.ts),
       (array_agg(p.state ORDER BY p.ts DESC) FILTER (WHERE p.state IS NOT NULL))[1],
       sum(1 + coalesce(p.held, 0)) FILTER (WHERE p.state IN ('R', 'D'))::float8
           / nullif(sum(1 + coalesce(p.held, 0)) FILTER (WHERE p.state IS NOT NULL), 0),
       (sum(p.cpu_percent * (1 + coalesce(p.held, 0))) / nullif(sum(1 + coalesce(p.held, 0))
           FILTER (WHERE p.cpu_percent IS NOT NULL), 0))::float8,
       max(p.io_read_bps), max(p.io_write_bps)
  FROM jobpulse.process_samples_between(%(now)s - interval '60 seconds', %(now)s) p
  JOIN unnest(%(c)s::text[], %(j)s::text[]) AS x(c, j) ON p.cluster = x.c AND p.job_id = x.j
 WHERE p.job_id = ANY(%(j)s) AND p.ts > %(now)s - interval '60 seconds' AND p.ts <= %(now)s
 GROUP BY p.cluster, p.job_id, p.node, p.pid
""",
    # The collective timeout a job declared (its tag collective_timeout, in minutes or with a unit).
    "declared_timeout": """
SELECT j.cluster, j.job_id, j.tags->>'collective_timeout'
  FROM jobpulse.jobs j JOIN unnest(%(c)s::text[], %(j)s::text[]) AS x(c, j) ON j.cluster = x.c AND j.job_id = x.j
 WHERE j.tags ? 'collective_timeout'
""",
    "fabric": fabric_reads.QUERY,  # the job's RDMA ports minute by minute (`fabric_reads`)
    # The stretches the scheduler held the jobs suspended within the look-back: neither waste nor work.
    "suspended": """
SELECT s.cluster, s.job_id, s.since, coalesce(s.until, %(now)s)
  FROM jobpulse.job_states s JOIN unnest(%(c)s::text[], %(j)s::text[]) AS x(c, j) ON s.cluster = x.c AND s.job_id = x.j
 WHERE s.state = 'SUSPENDED' AND s.since <= %(now)s AND coalesce(s.until, 'infinity') > %(now)s - %(lookback)s
""",
    # XIDs and losses of GPUs no job holds, within the look-back.
    "unheld_faults": """
SELECT h.cluster, '', h.node, h.gpu_uuid, h.kind, h.code, min(h.ts)
  FROM jobpulse.gpu_health_events h
 WHERE h.kind IN ('xid', 'gpu_lost') AND h.gpu_uuid IS NOT NULL AND h.job_id IS NULL
   AND h.ts > %(now)s - %(lookback)s AND h.ts <= %(now)s
 GROUP BY 1, 2, 3, 4, 5, 6
""",
}
SHARE = " AND (hashtext(cluster || '/' || job_id)::bigint %% %(parts)s + %(parts)s) %% %(parts)s = %(part)s"


def set_up(conn: psycopg.Connection[Any]) -> None:
    """Session settings for the rules' reads."""
    # Compiling these short aggregates costs more than running them.
    conn.execute("SET jit = off")
    conn.execute("SET work_mem = '64MB'")


@contextlib.contextmanager
def planned_once(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """The session's statements planned once, generically, while inside (psycopg prepares a statement
    run five times): for reads that are small and repeated, such as one job's replay."""
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        yield
    finally:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:  # else the error says more
            conn.execute("RESET plan_cache_mode")


def start_cycle(conn: psycopg.Connection[Any]) -> datetime:
    """Set the session up for a cycle and return the database's time at its start."""
    set_up(conn)
    row = conn.execute("SELECT now()").fetchone()
    conn.commit()
    assert row is not None
    return row[0]


Job = tuple[str, str]  # (cluster, job id)
R = TypeVar("R", bound=tuple[Any, ...])


def _read(conn: psycopg.Connection[Any], cls: type[R], query: str, params: dict[str, Any]) -> list[R]:
    """The rows of ``query`` as ``cls`` (a NamedTuple whose fields are the query's columns, in order)."""
    make: RowMaker[R] = cls._make  # type: ignore[attr-defined]
    return conn.cursor(row_factory=lambda _cursor: make).execute(query, params).fetchall()


def _arrays(jobs: Sequence[Job]) -> dict[str, list[str]]:
    return {"c": [c for c, _ in jobs], "j": [j for _, j in jobs]}


class JudgedJob(NamedTuple):
    cluster: str
    job_id: str
    partition: str | None
    start_time: datetime | None
    started: datetime  # the start, or when the job was first seen
    ended: datetime | None  # its end, where it had come by the cycle's time (a replay may know later ends)


def judged_jobs(conn: psycopg.Connection[Any], now: datetime, *, replay: bool = False, cluster: str | None = None,
                job: str | None = None, share: tuple[int, int] | None = None) -> list[JudgedJob]:
    """The jobs a cycle judges at ``now``: live, the running ones and those that ended since their last
    cycle; replayed, those running then (of one cluster or job, if given); of ``share`` = (part, parts)
    only, by a hash of cluster and job, if given."""
    part, parts = share or (0, 1)
    query = f"{JOBS}({JOBS_AT if replay else LIVE_JOBS}){SHARE if share else ''}"
    return _read(conn, JudgedJob, query, {"now": now, "cluster": cluster, "job": job, "part": part, "parts": parts})


class TopologyRow(NamedTuple):
    cluster: str
    node: str
    gpu_uuid: str
    model: str | None
    links: dict[str, str] | None
    cpus: str | None  # the cpulist near the GPU
    parent_uuid: str | None  # a MIG instance's GPU
    mig_profile: str | None
    mig_name: str | None  # a MIG instance's name for people (node/GPU index and the slice)


def topology(conn: psycopg.Connection[Any]) -> list[TopologyRow]:
    """The newest topology snapshot of every GPU."""
    return _read(conn, TopologyRow, Q["topology"], {})


class BlockRow(NamedTuple):
    """One block of one GPU: its evidence and what the GPU's window totals are made of."""

    cluster: str
    job_id: str
    node: str
    gpu_uuid: str
    block: datetime
    n: int
    n_idle: int
    n_busy: int
    act: float | None
    sm_active: float | None
    tensor: float | None
    fb: int | None
    throttled: int | None
    power: float | None
    duty: float | None
    traffic: float | None
    power_limit: float | None
    gpu_index: int
    fb_total: int | None
    first_ts: datetime
    last_ts: datetime
    last_fb: int | None
    loaded: int
    pcie_low: int
    link: str | None
    dbe_lo: int | None
    dbe_hi: int | None
    sbe_lo: int | None
    sbe_hi: int | None
    pending: bool | None
    failure: bool | None


def blocks(conn: psycopg.Connection[Any], width_s: int, now: datetime, jobs: Sequence[Job],
           since: Sequence[datetime]) -> list[BlockRow]:
    """Every ``width_s`` block of the GPUs of ``jobs`` from each job's ``since`` to ``now``: from the 10 s
    buckets, or, for a window that starts before them (a backtest of days retention took them
    from), from the samples binned as ingest bins them."""
    first = min(since, default=now)
    row = conn.execute(FINE_SINCE).fetchone()
    query = BLOCKS if row and first.timestamp() >= row[0] else BLOCKS_FROM_SAMPLES
    return _read(conn, BlockRow, query, {"block": width_s, "now": now, **_arrays(jobs), "since": list(since),
                                         "from": first})


class Suspension(NamedTuple):
    cluster: str
    job_id: str
    since: datetime
    until: datetime  # the cycle's time while it lasts


def suspended(conn: psycopg.Connection[Any], now: datetime, lookback: timedelta,
              jobs: Sequence[Job]) -> list[Suspension]:
    """The stretches the scheduler held ``jobs`` suspended (`job_states`) within the look-back."""
    return _read(conn, Suspension, Q["suspended"], {"now": now, "lookback": lookback, **_arrays(jobs)})


class Fault(NamedTuple):
    cluster: str
    job_id: str  # '' for a GPU no job holds
    node: str
    gpu_uuid: str
    kind: str  # 'xid' or 'gpu_lost'
    code: int | None
    first: datetime


def faults(conn: psycopg.Connection[Any], now: datetime, jobs: Sequence[Job], starts: Sequence[datetime]) -> list[Fault]:
    """XIDs and lost GPUs of ``jobs`` since each started (a fault stays the job's cause until it ends)."""
    return _read(conn, Fault, Q["faults"], {"now": now, **_arrays(jobs), "js": list(starts)})


def unheld_faults(conn: psycopg.Connection[Any], now: datetime, lookback: timedelta) -> list[Fault]:
    """XIDs and losses of GPUs no job holds, within the look-back."""
    return _read(conn, Fault, Q["unheld_faults"], {"now": now, "lookback": lookback})


class RankRow(NamedTuple):
    cluster: str
    job_id: str
    node: str
    pid: int
    rank: int | None
    gpu_uuid: str
    command: str | None
    cpus: list[int] | None  # the CPUs it ran on, one entry a sample


def ranks(conn: psycopg.Connection[Any], now: datetime, job_ids: Sequence[str]) -> list[RankRow]:
    """The GPU processes of the jobs over the last 30 s, through both tiers (a backtest replays
    compacted days)."""
    return _read(conn, RankRow, Q["ranks"], {"now": now, "j": list(job_ids)})


class CpuMinute(NamedTuple):
    cluster: str
    job_id: str
    node: str
    pid: int
    rank: int | None
    gpu_uuid: str | None
    command: str | None
    bucket: datetime
    cpu: float | None  # mean CPU percent of one core
    runnable: float | None  # percent of samples running or waiting for a CPU
    allowed: int | None  # the CPUs it may run on


def cpu_minutes(conn: psycopg.Connection[Any], now: datetime, lookback: timedelta, jobs: Sequence[Job],
                since: Sequence[datetime]) -> list[CpuMinute]:
    """Every process minute of ``jobs`` from each job's ``since`` within the look-back."""
    return _read(conn, CpuMinute, Q["cpu"], {"now": now, "lookback": lookback, "uc": [c for c, _ in jobs],
                                             "uj": [j for _, j in jobs], "us": list(since),
                                             "ufrom": min(since, default=now)})


class IdleGpu(NamedTuple):
    """A GPU whose window is idle: its history is asked before ``before`` (the window's start), by its
    own ``idle_share`` (a partition's or model's threshold, not only the default)."""

    cluster: str
    job_id: str
    node: str
    gpu_uuid: str
    before: datetime
    idle_share: float


class History(NamedTuple):
    cluster: str
    job_id: str
    node: str
    gpu_uuid: str
    ever_busy: bool  # busy in at least three samples since the job started
    idle_before: datetime | None  # the start of an idle stretch that reaches past the window


def history(conn: psycopg.Connection[Any], now: datetime, gpus: Sequence[IdleGpu]) -> list[History]:
    """For idle GPUs: was each ever busy, and since when has it been idle (300 s buckets)?"""
    columns = ("c", "j", "n", "g", "before", "idle_share")
    return _read(conn, History, Q["history"], {"now": now, **dict(zip(columns, map(list, zip(*gpus, strict=True)),
                                                                      strict=True))} if gpus else {})


class WorkedPower(NamedTuple):
    cluster: str
    job_id: str
    level: float | None  # the highest 5-min mean power of a mostly busy GPU since the job started, W


class LastStep(NamedTuple):
    cluster: str
    job_id: str
    minute: datetime  # the newest minute with a step event


class Phase(NamedTuple):
    cluster: str
    job_id: str
    phase: str
    began: datetime
    ended: datetime | None  # only if it had ended by the cycle's time


class GpuRanks(NamedTuple):
    cluster: str
    job_id: str
    node: str
    gpu_uuid: str
    ranks: list[int]


class RankActivity(NamedTuple):
    """One process of a job over the last minute (`Q["rank_activity"]`)."""

    cluster: str
    job_id: str
    node: str
    pid: int
    rank: int | None
    gpu_uuid: str | None
    command: str | None
    last_ts: datetime
    state: str | None  # the newest state letter (R, S, D, T, Z, ...)
    running: float | None  # share of its samples running or in I/O wait (R, D)
    cpu: float | None  # mean CPU, percent of one core
    read_bps: int | None  # peak read rate through system calls, B/s
    write_bps: int | None  # peak write rate, B/s


class DeclaredTimeout(NamedTuple):
    cluster: str
    job_id: str
    value: str | None  # the job's tag collective_timeout, as written


JOB_READS: dict[str, type[tuple[Any, ...]]] = {
    "worked_power": WorkedPower, "last_step": LastStep, "phases": Phase, "gpu_ranks": GpuRanks,
    "rank_activity": RankActivity, "declared_timeout": DeclaredTimeout, "fabric": fabric_reads.PortMinute}
"""The per-job reads a rule family may ask for (`rules.model.Read`): the name of its query in `Q`
-> the type of its rows (named as the query names its columns; the first two are cluster and job).
A new per-job statistic is its query, its row type and the rule that reads it."""


def of_jobs(conn: psycopg.Connection[Any], query: str, now: datetime, lookback: timedelta, jobs: Sequence[Job],
            starts: Sequence[datetime]) -> list[Any]:
    """A per-job read (`JOB_READS`) of ``jobs`` at ``now``: within the look-back, or since each job's
    start in ``starts``, as its query says."""
    return _read(conn, JOB_READS[query], Q[query], {"now": now, "lookback": lookback, **_arrays(jobs),
                                                     "js": list(starts)})
