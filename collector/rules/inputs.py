"""Rule inputs: read what the rules judge, for every running (or just ended) job, in a few queries.

One query over the 10 s roll-ups of the jobs judged (and nothing else: an index leads with the job)
gives every GPU its window block by block; a `BlockCache` kept between live cycles holds the blocks
that can no longer change, so a cycle reads only each job's last minutes. Faults, processes, and a
GPU's history before the window are read only where a rule needs them.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import psycopg
import structlog

from jobpulse.collector.rules import hang
from jobpulse.collector.rules.evidence import idle_stretch
from jobpulse.collector.rules.model import Block, Ecc, GpuStats, JobView, MigSlice, ProcStats
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.rules.utilization import underused
from jobpulse.collector.store import rule_reads

log = structlog.get_logger("jobpulse.rules")
T = TypeVar("T")

SILENT = timedelta(minutes=2)
"""A GPU with no sample for this long is not reporting: its usage is not judged (its faults are)."""


@dataclass(frozen=True)
class Topology:
    """The newest topology snapshot of every GPU, read once per cycle."""

    models: dict[tuple[str, str, str], str | None]  # (cluster, node, uuid) -> model
    cpus: dict[tuple[str, str, str], str | None]  # -> cpulist near the GPU
    links: dict[tuple[str, str], dict[str, dict[str, str]]]  # (cluster, node) -> uuid -> peer -> link
    slices: dict[tuple[str, str, str], MigSlice] = dataclasses.field(default_factory=dict)  # MIG instances


def read_topology(conn: psycopg.Connection[Any]) -> Topology:
    topo = Topology({}, {}, {})
    for c, n, g, model, links, cpus, parent, profile, name in conn.execute(rule_reads.Q["topology"]).fetchall():
        topo.models[(c, n, g)] = model
        topo.cpus[(c, n, g)] = cpus
        if parent is None:
            topo.links.setdefault((c, n), {})[g] = links
        else:
            topo.slices[(c, n, g)] = MigSlice(parent, profile, name)
    return topo


class Side:
    """The second session a process's rule cycles read on, opened once and kept between cycles (a new
    backend per cycle cost its start-up and the planning of every read again, cold); opened again
    when it broke. `close` it when the process stops running rules."""

    def __init__(self) -> None:
        self.conn: psycopg.Connection[Any] | None = None

    def open(self, like: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        if self.conn is not None and (self.conn.closed or self.conn.broken):
            self.close()
        if self.conn is None:
            self.conn = psycopg.connect(like.info.dsn, password=like.info.password, context=like,
                                        autocommit=True, connect_timeout=10, keepalives_idle=60)
            rule_reads.set_up(self.conn)
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


class Reads:
    """A cycle's reads, on a second session to ``conn``'s database while it is open (``with``): a
    read started with `soon` runs there while this process reads and digests others on ``conn``
    (psycopg waits without the GIL; the database works on the other core). Without a second session
    (none opened, or none could be), a read runs on ``conn`` when its result is first wanted. Every
    read is bounded by the cycle's time as ``conn``'s are; the flags are written on ``conn`` alone.
    ``side``: the session kept between cycles (`Blocks.side`); without it one is opened for the cycle."""

    def __init__(self, conn: psycopg.Connection[Any], side: Side | None = None) -> None:
        self._conn = conn
        self._kept = side
        self._owned = Side() if side is None else None
        self._side: psycopg.Connection[Any] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> Reads:
        try:
            self._side = (self._kept or self._owned or Side()).open(self._conn)
        except psycopg.Error as exc:
            log.warning("no second connection for the rules; reading on one", error=str(exc)[:300])
            self._close()
            return self
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rules-read")
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()  # after the read under way, if any
        if self._owned is not None:
            self._owned.close()
        self._pool = self._side = None

    def soon(self, read: Callable[[psycopg.Connection[Any]], T]) -> Callable[[], T]:
        """Start ``read``; the returned call waits for its result (and raises what it raised)."""
        if self._pool is None:
            return functools.cache(lambda: read(self._conn))
        future = self._pool.submit(read, self._side)  # type: ignore[arg-type]

        def result() -> T:
            try:
                return future.result()
            except psycopg.OperationalError as exc:  # the kept session died while idle (a restart, a timeout)
                log.warning("the rules' second connection failed; reading on one", error=str(exc)[:300])
                (self._kept or self._owned or Side()).close()  # the next cycle opens a new one
                return read(self._conn)
        return functools.cache(result)


def _ready(value: T) -> Callable[[], T]:
    return lambda: value


def _params(thresholds: Thresholds, now: datetime, **more: object) -> dict[str, object]:
    return {"lookback": thresholds.lookback, "now": now, **more}


Share = tuple[int, int]
"""(part, parts): the jobs one of ``parts`` rule processes judges, by a hash of cluster and job, so
that each process keeps the caches of the same jobs cycle after cycle."""


JobRow = tuple[str | None, datetime | None, datetime, datetime | None]


def _judged_jobs(conn: psycopg.Connection[Any], replay: bool, now: datetime, cluster: str | None,
                 job: str | None, share: Share | None) -> dict[tuple[str, str], JobRow]:
    """(cluster, job) -> (partition, start time, start or first seen, end if by ``now``) of the jobs
    judged at ``now`` (of ``share`` only, if given)."""
    q = f"{rule_reads.JOBS}({rule_reads.JOBS_AT if replay else rule_reads.LIVE_JOBS}){rule_reads.SHARE if share else ''}"
    part, parts = share or (0, 1)
    return {(c, j): rest for c, j, *rest in conn.execute(q, {"now": now, "cluster": cluster, "job": job,
                                                             "part": part, "parts": parts}).fetchall()}


def gather(conn: psycopg.Connection[Any], thresholds: Thresholds, now: datetime, *, replay: bool = False,
           cluster: str | None = None, job: str | None = None,
           topology: Topology | Callable[[], Topology] | None = None, blocks: BlockCache | None = None,
           minutes: MinuteCache | None = None, reads: Reads | None = None,
           share: Share | None = None) -> dict[tuple[str, str], JobView]:
    """The window of every job the rules judge at ``now`` (those of ``share``, if given), plus the
    little else they need.
    ``replay``: judge the jobs that were running at ``now`` (a past time), as a live cycle then would
    have, optionally only one cluster's or one job's. ``blocks``, ``minutes``: what earlier cycles
    read (live ones, or those of the same replay: its times only move forward, over stored data).
    ``topology``: read already, or being read (`Reads.soon`). ``reads``: the topology and the ranks
    are read beside the blocks (the ranks' query is a cycle's largest at 8,000 GPUs)."""
    reads = reads or Reads(conn)
    topo = reads.soon(read_topology) if topology is None else topology if callable(topology) else _ready(topology)
    judged = _judged_jobs(conn, replay, now, cluster, job, share)
    params = _params(thresholds, now, c=[c for c, _ in judged], j=[j for _, j in judged],
                     js=[row[2] for row in judged.values()])
    ranks = reads.soon(functools.partial(_read_ranks, params=params))
    jobs = _views(conn, thresholds, now, topo, judged, blocks)
    _add_faults(conn, rule_reads.Q["faults"], params, jobs, lambda c, j, node: (c, j))
    _add_history(conn, params, jobs, thresholds)
    _add_processes(conn, params, jobs, thresholds, minutes if minutes is not None else MinuteCache(), ranks())
    _add_hang_evidence(conn, params, jobs, thresholds)
    return jobs


def _views(conn: psycopg.Connection[Any], thresholds: Thresholds, now: datetime,
           topology: Callable[[], Topology],
           judged: dict[tuple[str, str], JobRow],
           blocks: BlockCache | None) -> dict[tuple[str, str], JobView]:
    """A view of every judged job with its GPUs' statistics over the window."""
    cache = blocks if blocks is not None else BlockCache()
    jobs: dict[tuple[str, str], JobView] = {}
    read = cache.read(conn, thresholds, now, list(judged))
    topo = topology()
    for (c, j, node, uuid), rows in read.items():
        partition, start, _, ended = judged[(c, j)]
        gpu = _gpu(c, j, node, uuid, partition, start, rows, topo.models.get((c, node, uuid)), now,
                   topo.slices.get((c, node, uuid)))
        view = jobs.setdefault((c, j), JobView([], ended_at=ended))
        view.gpus.append(gpu)
        if cpus := topo.cpus.get((c, node, uuid)):
            view.local_cpus[gpu.key] = cpus
        view.links.setdefault(node, topo.links.get((c, node), {}))
    return jobs


def gather_unheld(conn: psycopg.Connection[Any], thresholds: Thresholds, now: datetime, *,
                  topology: Topology | None = None, blocks: BlockCache | None = None) -> dict[tuple[str, str],
                                                                                                JobView]:
    """GPUs no job holds, by (cluster, node): their hardware is judged too (node flags), so admins
    hear of a sick GPU before a job lands on it. Their samples carry no job (job '')."""
    topo = topology or read_topology(conn)
    cache = blocks if blocks is not None else BlockCache()
    clusters = sorted({c for c, _ in topo.links})
    nodes: dict[tuple[str, str], JobView] = {}
    for (c, j, node, uuid), rows in cache.read(conn, thresholds, now, [(c, "") for c in clusters]).items():
        gpu = _gpu(c, j, node, uuid, None, None, rows, topo.models.get((c, node, uuid)), now,
                   topo.slices.get((c, node, uuid)))
        nodes.setdefault((c, node), JobView([])).gpus.append(gpu)
    _add_faults(conn, rule_reads.Q["unheld_faults"], _params(thresholds, now), nodes, lambda c, j, node: (c, node))
    return nodes


class _BlockRow(NamedTuple):
    """One block of one GPU as read: its evidence and what the GPU's totals are made of. A tuple, so
    that `_gpu` takes the columns of a GPU's blocks apart in one call."""

    block: Block
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


def _gpu(c: str, j: str, node: str, uuid: str, partition: str | None, start: datetime | None,
         rows: list[_BlockRow], model: str | None, now: datetime, mig: MigSlice | None = None) -> GpuStats:
    """One GPU's statistics over the window from its blocks (oldest first), as SQL aggregates
    would total them (NULLs ignored): a column at a time through the builtins, since a cycle builds
    thousands (a loop over rows with a call per value and column cost 0.6 s at 8,000 GPUs)."""
    (blocks, index, fb_total, _, _, _, loaded, pcie_low, link, dbe_lo, dbe_hi, sbe_lo, sbe_hi, pending,
     failure) = zip(*rows, strict=True)
    loaded, pcie_low = sum(loaded), sum(pcie_low)
    last_ts = rows[-1].last_ts  # blocks are disjoint and in order
    dbe_lo, dbe_hi, sbe_lo, sbe_hi = _least(dbe_lo), _most(dbe_hi), _least(sbe_lo), _most(sbe_hi)
    return GpuStats(
        c, j, partition, node, uuid, max(0, max(index)), model, rows[0].first_ts, last_ts, start, blocks,
        fb_total_mib=_most(fb_total), last_mem_mib=rows[-1].last_fb,
        pcie_below_max_share=pcie_low / loaded if loaded else None, pcie_loaded_samples=loaded,
        pcie_link=_least(link),
        ecc=Ecc(int(dbe_hi - dbe_lo) if dbe_lo is not None and dbe_hi is not None else 0,
                int(sbe_hi - sbe_lo) if sbe_lo is not None and sbe_hi is not None else 0,
                any(pending), any(failure)),
        reporting=last_ts >= now - SILENT, mig=mig)


_known = functools.partial(operator.is_not, None)


def _least(values: Iterable[Any]) -> Any:
    """min ignoring NULLs, as SQL's aggregate does (None if all are NULL)."""
    return min(filter(_known, values), default=None)


def _most(values: Iterable[Any]) -> Any:
    """max ignoring NULLs, as SQL's aggregate does (None if all are NULL)."""
    return max(filter(_known, values), default=None)


SETTLE = timedelta(seconds=10)
"""A block that ends this long before its GPU's newest sample no longer changes: an agent delivers
its node's batches through its spool one at a time, oldest first, so nothing older can still
arrive (the margin is one 10 s roll-up bucket). Every cycle re-reads only the block still filling."""

GpuKey = tuple[str, str, str, str]  # cluster, job ('' = none), node, uuid


class BlockCache:
    """The blocks earlier live cycles read that can no longer change, per GPU, so that a cycle reads
    only the block still filling of each GPU. Empty, it reads the whole window. Kept by the one
    process that runs the rules."""

    def __init__(self) -> None:
        self._shape: tuple[int, timedelta] | None = None
        self._now: datetime | None = None
        # (cluster, job) -> (node, uuid) -> (blocks before this are settled, those blocks)
        self._jobs: dict[tuple[str, str], dict[tuple[str, str], tuple[datetime, list[_BlockRow]]]] = {}

    def read(self, conn: psycopg.Connection[Any], thresholds: Thresholds, now: datetime,
             jobs: list[tuple[str, str]]) -> dict[GpuKey, list[_BlockRow]]:
        """Every block in the window of every GPU of ``jobs``, oldest first: settled ones from the
        cache, the rest read. Keeps what settled; forgets jobs not asked for."""
        width = thresholds.defaults["evidence_block_seconds"]
        # The window starts on a block boundary: its oldest block is whole, and cached like the rest.
        start = _floor(now - thresholds.lookback, width)
        if self._shape != (width, thresholds.lookback) or (self._now is not None and now < self._now):
            self._jobs = {}
        self._shape, self._now = (width, thresholds.lookback), now
        kept = {key: self._jobs[key] for key in jobs if key in self._jobs}
        since = {key: max(min(until for until, _ in gpus.values()), start) for key, gpus in kept.items() if gpus}
        fresh = _read_blocks(conn, width, now, jobs, [since.get(key, start) for key in jobs])
        # A GPU first seen in a job read only from `since` may have older blocks: read that job whole.
        grown = [key for key, gpus in fresh.items() if key in since and not gpus.keys() <= kept[key].keys()]
        if grown:
            fresh.update(_read_blocks(conn, width, now, grown, [start] * len(grown)))
            for key in grown:
                del since[key]
        gpus: dict[GpuKey, list[_BlockRow]] = {}
        self._jobs = {}
        for c, j in jobs:
            cut = since.get((c, j), start)
            cached = kept.get((c, j), {}) if (c, j) in since else {}
            read = fresh.get((c, j), {})
            for node, uuid in sorted(cached.keys() | read.keys()):
                held = cached.get((node, uuid), (cut, []))[1]  # oldest first, as read
                rows = [*_between(held, start, cut), *read.get((node, uuid), [])]
                if not rows:
                    continue
                gpus[(c, j, node, uuid)] = rows
                until = _floor(min(now, rows[-1].last_ts) - SETTLE, width)
                self._jobs.setdefault((c, j), {})[(node, uuid)] = (until, _between(rows, start, until))
        return gpus


def _read_blocks(conn: psycopg.Connection[Any], width: int, now: datetime, jobs: list[tuple[str, str]],
                 since: list[datetime]) -> dict[tuple[str, str], dict[tuple[str, str], list[_BlockRow]]]:
    """(cluster, job) -> (node, uuid) -> blocks read from each job's ``since``, oldest first."""
    params = {"block": width, "now": now, "c": [c for c, _ in jobs], "j": [j for _, j in jobs], "since": since,
              "from": (first := min(since, default=now))}
    out: dict[tuple[str, str], dict[tuple[str, str], list[_BlockRow]]] = {}
    fine_since = conn.execute(rule_reads.FINE_SINCE).fetchone()
    # Live cycles read the 10 s buckets; a replay of days retention took them from, the samples.
    blocks = rule_reads.BLOCKS if fine_since and first.timestamp() >= fine_since[0] else rule_reads.BLOCKS_FROM_SAMPLES
    for r in conn.execute(blocks, params).fetchall():
        out.setdefault((r[0], r[1]), {}).setdefault((r[2], r[3]), []).append(
            _BlockRow(Block(*r[4:12], int(r[12] or 0), *r[13:17]), *r[17:]))  # type: ignore[call-arg]  # mypy miscounts *Any
    for gpus in out.values():
        for rows in gpus.values():
            rows.sort(key=_block_start)
    return out


def _block_start(r: _BlockRow) -> datetime:
    return r.block.start


def _between(rows: list[_BlockRow], start: datetime, end: datetime) -> list[_BlockRow]:
    """The rows (oldest first) of the blocks that start in [start, end), trimmed from both ends: a
    cycle drops a block or two of a GPU (a bisection per GPU cost a tenth of a second a cycle)."""
    first, last = 0, len(rows)
    while first < last and rows[first].block.start < start:
        first += 1
    while last > first and rows[last - 1].block.start >= end:
        last -= 1
    return rows[first:last]


def _floor(t: datetime, width: int) -> datetime:
    """The start of the block holding ``t`` (blocks are aligned to the epoch, as date_bin does)."""
    return datetime.fromtimestamp(t.timestamp() // width * width, t.tzinfo)


def _update(view: JobView | None, changes: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Apply per-GPU changes ((node, uuid) -> fields) to a view in one pass."""
    if view is not None and changes:
        view.gpus = [dataclasses.replace(g, **changes[(g.node, g.gpu_uuid)]) if (g.node, g.gpu_uuid) in changes
                     else g for g in view.gpus]


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
    changes: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    for (c, j, node, uuid), change in faults.items():
        key = view_of(c, j, node)
        view = views.setdefault(key, JobView([])) if not j else views.get(key)
        if view is None:
            continue
        if not any((g.node, g.gpu_uuid) == (node, uuid) for g in view.gpus):
            first = min([*change["xids"].values(), change.get("lost_at") or params["now"]])
            view.gpus.append(GpuStats(c, j, None, node, uuid, -1, None, first, first, None, reporting=False))
        changes.setdefault(key, {})[(node, uuid)] = change
    for key, change_set in changes.items():
        _update(views[key], change_set)


def _add_history(conn: psycopg.Connection[Any], params: dict[str, object], jobs: dict[tuple[str, str], JobView],
                 thresholds: Thresholds) -> None:
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
    rows = conn.execute(rule_reads.Q["history"], {**params, **columns, "idle_share": thresholds.defaults["idle_share"]})
    changes: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    for c, j, node, uuid, _ in idle:  # a GPU with no 300 s roll-up: never busy, no older idle stretch
        changes.setdefault((c, j), {})[(node, uuid)] = {"ever_busy": False, "idle_before": None}
    for c, j, node, uuid, ever_busy, idle_before in rows.fetchall():
        changes[(c, j)][(node, uuid)] = {"ever_busy": ever_busy, "idle_before": idle_before}
    for key, change_set in changes.items():
        _update(jobs.get(key), change_set)


def _add_hang_evidence(conn: psycopg.Connection[Any], params: dict[str, object],
                       jobs: dict[tuple[str, str], JobView], thresholds: Thresholds) -> None:
    """For jobs whose GPUs all wait as a hung job's do while the look-back shows no working level to
    judge their power by (a hang longer than the look-back): the job's working power since it started;
    for hung jobs: their newest step (steps that go on are work), the phases they say they are in (a
    checkpoint the others wait for), and, where the broken rank exited, the ranks that drove their GPUs."""
    def settings(v: JobView) -> dict[str, Any]:
        return thresholds.for_gpu(v.gpus[0].partition, v.gpus[0].model)

    wanted = [key for key, v in jobs.items() if v.gpus and hang.candidate(v, settings(v))]
    if wanted:
        _read_worked_power(conn, params, jobs, wanted)
    hung = [key for key, v in jobs.items() if v.gpus and hang.hang(v, settings(v)) is not None]
    if not hung:
        return
    arrays = {**params, "c": [c for c, _ in hung], "j": [j for _, j in hung]}
    for c, j, last in conn.execute(rule_reads.Q["last_step"], arrays).fetchall():
        jobs[(c, j)].last_step = last
    for c, j, phase, began, ended in conn.execute(rule_reads.Q["phases"], arrays).fetchall():
        jobs[(c, j)].phases.append((phase, began, ended))
    named = [key for key in hung if hang.unnamed(jobs[key], settings(jobs[key]))]
    if named:
        rows = conn.execute(rule_reads.Q["gpu_ranks"], {**params, "c": [c for c, _ in named],
                                                        "j": [j for _, j in named]})
        for c, j, node, uuid, ranks in rows.fetchall():
            jobs[(c, j)].gpu_ranks[f"{node}/{uuid}"] = list(ranks)


def _read_worked_power(conn: psycopg.Connection[Any], params: dict[str, object],
                       jobs: dict[tuple[str, str], JobView], wanted: list[tuple[str, str]]) -> None:
    starts = [min(g.start for g in jobs[key].gpus) for key in wanted]
    rows = conn.execute(rule_reads.Q["worked_power"], {**params, "c": [c for c, _ in wanted],
                                                       "j": [j for _, j in wanted], "js": starts})
    for c, j, level in rows.fetchall():
        jobs[(c, j)].worked_power = level


def _read_ranks(conn: psycopg.Connection[Any], params: dict[str, object]) -> list[tuple[Any, ...]]:
    """The ranks of the judged jobs over the last 30 s (rows of ``rule_reads.Q["ranks"]``)."""
    return conn.execute(rule_reads.Q["ranks"], params).fetchall()


def _add_processes(conn: psycopg.Connection[Any], params: dict[str, object], jobs: dict[tuple[str, str], JobView],
                   thresholds: Thresholds, minutes: MinuteCache, ranks: list[tuple[Any, ...]]) -> None:
    # Only input_bound reads process minutes: those of jobs with a GPU it will judge.
    wanted = [key for key, v in jobs.items()
              if any(g.reporting and underused(g, thresholds.for_gpu(g.partition, g.model)) for g in v.gpus)]
    procs: dict[tuple[str, str, str, int], ProcStats] = {}
    for c, j, node, pid, rank, uuid, command, cpus in ranks:
        procs[(c, j, node, pid)] = ProcStats(node, pid, rank, uuid, command, cpus=dict(Counter(cpus or [])))
    for c, j, node, pid, rank, uuid, command, minute, cpu, runnable, allowed in minutes.read(conn, params, wanted,
                                                                                             jobs):
        p = procs.get((c, j, node, pid))
        if p is None:
            p = procs[(c, j, node, pid)] = ProcStats(node, pid, rank, uuid, command)
        if cpu is not None:
            p.cpu_by_minute[minute] = cpu
        if runnable:
            p.runnable_by_minute[minute] = runnable
        if allowed:
            p.allowed_by_minute[minute] = allowed
    for (c, j, *_), p in sorted(procs.items()):  # in one order, however the rows came
        if (c, j) in jobs:
            jobs[(c, j)].procs.append(p)


MINUTE = timedelta(seconds=60)


class MinuteCache:
    """The process side of `BlockCache`: the 60 s process roll-ups of the jobs input_bound judges
    that can no longer change, so that a cycle reads only each job's last minutes (all of them, at
    8,000 GPUs, were most of a cycle). A minute is settled once every GPU of its job has reported
    ``SETTLE`` past its end: a node's process and GPU samples travel in the same batches, oldest
    first. A job with a node the cache has not seen (a late node) is read whole."""

    def __init__(self) -> None:
        # (cluster, job) -> (minutes before this are settled, the job's nodes then, those minutes' rows)
        self._jobs: dict[tuple[str, str], tuple[datetime, frozenset[str], list[tuple[Any, ...]]]] = {}

    def read(self, conn: psycopg.Connection[Any], params: dict[str, Any], wanted: list[tuple[str, str]],
             jobs: dict[tuple[str, str], JobView]) -> list[tuple[Any, ...]]:
        """Every process minute in the window of the ``wanted`` jobs: settled ones from the cache,
        the rest read. Keeps what settled; forgets the other jobs."""
        now, start = params["now"], params["now"] - params["lookback"]
        nodes = {key: frozenset(g.node for g in jobs[key].gpus) for key in wanted}
        kept = {key: self._jobs[key] for key in wanted if key in self._jobs and nodes[key] <= self._jobs[key][1]}
        since = [max(kept[key][0], start) if key in kept else start for key in wanted]
        fresh: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for row in conn.execute(rule_reads.Q["cpu"], {**params, "uc": [c for c, _ in wanted], "uj": [j for _, j in wanted],
                                            "us": since, "ufrom": min(since, default=now)}):
            fresh.setdefault((row[0], row[1]), []).append(row)
        self._jobs, out = {}, []
        for key in wanted:
            rows = [r for r in kept[key][2] if r[7] > start] if key in kept else []
            rows += fresh.get(key, [])
            out += rows
            newest = min((g.last_ts for g in jobs[key].gpus if g.blocks), default=None)
            if newest is not None:
                until = _floor(min(now, newest) - SETTLE, 60)
                self._jobs[key] = (until, nodes[key], [r for r in rows if r[7] + MINUTE <= until])
        return out


@dataclass
class Blocks:
    """What the process that runs the rules keeps between cycles: the blocks of its jobs' GPUs and of
    the GPUs no job holds, its jobs' process minutes, and the session it reads beside its own."""

    jobs: BlockCache = dataclasses.field(default_factory=BlockCache)
    unheld: BlockCache = dataclasses.field(default_factory=BlockCache)
    minutes: MinuteCache = dataclasses.field(default_factory=MinuteCache)
    side: Side = dataclasses.field(default_factory=Side)

    def close(self) -> None:
        self.side.close()
