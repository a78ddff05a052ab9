"""Rule inputs: read what the rules judge, for every running (or just ended) job, in a few queries.

One query over the 10 s roll-ups of the jobs judged (and nothing else: an index leads with the job)
gives every GPU its window block by block; a `BlockCache` kept between live cycles holds the blocks
that can no longer change, so a cycle reads only each job's last minutes. Faults, processes, and a
GPU's history before the window are read only where a rule family asks for them (`model.Read`):
the reader does not judge, and the engine (`engine.read_jobs`) only runs what the families ask.
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

from jobpulse.collector.rules.model import Block, Ecc, GpuStats, JobView, MigSlice, ProcStats
from jobpulse.collector.store.read import rule_reads

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
    for r in rule_reads.topology(conn):
        key = (r.cluster, r.node, r.gpu_uuid)
        topo.models[key] = r.model
        topo.cpus[key] = r.cpus
        if r.parent_uuid is None:
            topo.links.setdefault((r.cluster, r.node), {})[r.gpu_uuid] = r.links or {}
        else:
            topo.slices[key] = MigSlice(r.parent_uuid, r.mig_profile, r.mig_name or r.gpu_uuid)
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


Share = tuple[int, int]
"""(part, parts): the jobs one of ``parts`` rule processes judges, by a hash of cluster and job, so
that each process keeps the caches of the same jobs cycle after cycle."""


class Shape(NamedTuple):
    """The window the rules judge: how far back (`Thresholds.lookback`) and the width of its blocks."""

    lookback: timedelta
    block_seconds: int


@dataclass
class Window:
    """What `gather` read at ``now``: every judged job's view, and its ranks (read beside the blocks:
    the ranks' query is a cycle's largest at 8,000 GPUs), for `add_processes`."""

    now: datetime
    shape: Shape
    views: dict[tuple[str, str], JobView]
    ranks: Callable[[], list[rule_reads.RankRow]]


def gather(conn: psycopg.Connection[Any], shape: Shape, now: datetime, *, replay: bool = False,
           cluster: str | None = None, job: str | None = None,
           topology: Topology | Callable[[], Topology] | None = None, blocks: BlockCache | None = None,
           reads: Reads | None = None, share: Share | None = None) -> Window:
    """The window of every job the rules judge at ``now`` (those of ``share``, if given), with the
    faults of its GPUs.
    ``replay``: judge the jobs that were running at ``now`` (a past time), as a live cycle then would
    have, optionally only one cluster's or one job's. ``blocks``: what earlier cycles read (live
    ones, or those of the same replay: its times only move forward, over stored data).
    ``topology``: read already, or being read (`Reads.soon`). ``reads``: the topology and the ranks
    are read beside the blocks."""
    reads = reads or Reads(conn)
    topo = reads.soon(read_topology) if topology is None else topology if callable(topology) else _ready(topology)
    judged = {(r.cluster, r.job_id): r for r in rule_reads.judged_jobs(conn, now, replay=replay, cluster=cluster,
                                                                       job=job, share=share)}
    ranks = reads.soon(functools.partial(rule_reads.ranks, now=now, job_ids=[j for _, j in judged]))
    jobs = _views(conn, shape, now, topo, judged, blocks)
    _add_faults(rule_reads.faults(conn, now, list(judged), [r.started for r in judged.values()]), now, jobs,
                lambda c, j, node: (c, j))
    return Window(now, shape, jobs, ranks)


def _views(conn: psycopg.Connection[Any], shape: Shape, now: datetime,
           topology: Callable[[], Topology],
           judged: dict[tuple[str, str], rule_reads.JudgedJob],
           blocks: BlockCache | None) -> dict[tuple[str, str], JobView]:
    """A view of every judged job with its GPUs' statistics over the window."""
    cache = blocks if blocks is not None else BlockCache()
    jobs: dict[tuple[str, str], JobView] = {}
    # a run's blocks only (a requeued job's earlier run is not the new run's), and none the scheduler held
    # suspended (its stopped minutes are not the job's)
    read = cache.read(conn, shape, now, list(judged), [j.started for j in judged.values()])
    held = _suspensions(rule_reads.suspended(conn, now, shape.lookback, list(judged)))
    topo = topology()
    for (c, j, node, uuid), found in read.items():
        rows = _unsuspended(found, held.get((c, j)), shape.block_seconds)
        if not rows:
            continue
        job = judged[(c, j)]
        gpu = _gpu(c, j, node, uuid, job.partition, job.start_time, rows, topo.models.get((c, node, uuid)), now,
                   topo.slices.get((c, node, uuid)))
        if rows[-1] is not found[-1]:  # suspended now: still reporting, its usage not judged
            gpu = dataclasses.replace(gpu, reporting=found[-1].read.last_ts >= now - SILENT)
        view = jobs.setdefault((c, j), JobView([], ended_at=job.ended))
        view.gpus.append(gpu)
        if cpus := topo.cpus.get((c, node, uuid)):
            view.local_cpus[gpu.key] = cpus
        view.links.setdefault(node, topo.links.get((c, node), {}))
    return jobs


def _suspensions(found: list[rule_reads.Suspension]) -> dict[tuple[str, str], list[tuple[datetime, datetime]]]:
    out: dict[tuple[str, str], list[tuple[datetime, datetime]]] = {}
    for s in found:
        out.setdefault((s.cluster, s.job_id), []).append((s.since, s.until))
    return out


def _unsuspended(rows: list[_BlockRow], held: list[tuple[datetime, datetime]] | None,
                 width: int) -> list[_BlockRow]:
    """The blocks no suspension touches (a block the job spent partly suspended is no measure of it)."""
    if not held:
        return rows
    span = timedelta(seconds=width)
    return [r for r in rows if not any(a < r.block.start + span and r.block.start < b for a, b in held)]


def gather_unheld(conn: psycopg.Connection[Any], shape: Shape, now: datetime, *,
                  topology: Topology | None = None, blocks: BlockCache | None = None) -> dict[tuple[str, str],
                                                                                                JobView]:
    """GPUs no job holds, by (cluster, node): their hardware is judged too (node flags), so admins
    hear of a sick GPU before a job lands on it. Their samples carry no job (job '')."""
    topo = topology or read_topology(conn)
    cache = blocks if blocks is not None else BlockCache()
    clusters = sorted({c for c, _ in topo.links})
    nodes: dict[tuple[str, str], JobView] = {}
    for (c, j, node, uuid), rows in cache.read(conn, shape, now, [(c, "") for c in clusters]).items():
        gpu = _gpu(c, j, node, uuid, None, None, rows, topo.models.get((c, node, uuid)), now,
                   topo.slices.get((c, node, uuid)))
        nodes.setdefault((c, node), JobView([])).gpus.append(gpu)
    _add_faults(rule_reads.unheld_faults(conn, now, shape.lookback), now, nodes, lambda c, j, node: (c, node))
    return nodes


class _BlockRow(NamedTuple):
    """One block of one GPU as read: the rules' evidence, and the row it came from (what the GPU's
    window totals are made of)."""

    block: Block
    read: rule_reads.BlockRow


_COLUMNS = operator.attrgetter("gpu_index", "fb_total", "loaded", "pcie_low", "link", "dbe_lo", "dbe_hi", "sbe_lo",
                               "sbe_hi", "pending", "failure")


def _gpu(c: str, j: str, node: str, uuid: str, partition: str | None, start: datetime | None,
         rows: list[_BlockRow], model: str | None, now: datetime, mig: MigSlice | None = None) -> GpuStats:
    """One GPU's statistics over the window from its blocks (oldest first), as SQL aggregates
    would total them (NULLs ignored): a column at a time through the builtins, since a cycle builds
    thousands (`bench/rules.py` at 8,000 GPUs)."""
    index, fb_total, loaded, pcie_low, link, dbe_lo, dbe_hi, sbe_lo, sbe_hi, pending, failure = zip(
        *(_COLUMNS(r.read) for r in rows), strict=True)
    loaded, pcie_low = sum(loaded), sum(pcie_low)
    first, last = rows[0].read, rows[-1].read  # blocks are disjoint and in order
    dbe_lo, dbe_hi, sbe_lo, sbe_hi = _least(dbe_lo), _most(dbe_hi), _least(sbe_lo), _most(sbe_hi)
    return GpuStats(
        c, j, partition, node, uuid, max(0, max(index)), model, first.first_ts, last.last_ts, start,
        tuple(r.block for r in rows), fb_total_mib=_most(fb_total), last_mem_mib=last.last_fb,
        pcie_below_max_share=pcie_low / loaded if loaded else None, pcie_loaded_samples=loaded,
        pcie_link=_least(link),
        ecc=Ecc(int(dbe_hi - dbe_lo) if dbe_lo is not None and dbe_hi is not None else 0,
                int(sbe_hi - sbe_lo) if sbe_lo is not None and sbe_hi is not None else 0,
                any(pending), any(failure)),
        reporting=last.last_ts >= now - SILENT, mig=mig)


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
        self._shape: Shape | None = None
        self._now: datetime | None = None
        # (cluster, job) -> (node, uuid) -> (blocks before this are settled, those blocks)
        self._jobs: dict[tuple[str, str], dict[tuple[str, str], tuple[datetime, list[_BlockRow]]]] = {}

    def read(self, conn: psycopg.Connection[Any], shape: Shape, now: datetime, jobs: list[tuple[str, str]],
             begins: list[datetime] | None = None) -> dict[GpuKey, list[_BlockRow]]:
        """Every block in the window of every GPU of ``jobs``, oldest first, from the block holding each
        job's ``begins`` (its run's start) where that is later: settled ones from the cache, the rest
        read. Keeps what settled; forgets jobs not asked for."""
        width = shape.block_seconds
        # The window starts on a block boundary: its oldest block is whole, and cached like the rest.
        window = _floor(now - shape.lookback, width)
        if self._shape != shape or (self._now is not None and now < self._now):
            self._jobs = {}
        self._shape, self._now = shape, now
        starts = ({key: max(window, _floor(b, width)) for key, b in zip(jobs, begins, strict=True)} if begins
                  else dict.fromkeys(jobs, window))
        kept = {key: self._jobs[key] for key in jobs if key in self._jobs}
        since = {key: max(min(until for until, _ in gpus.values()), starts[key]) for key, gpus in kept.items() if gpus}
        fresh = _read_blocks(conn, width, now, jobs, [since.get(key, starts[key]) for key in jobs])
        # A GPU first seen in a job read only from `since` may have older blocks: read that job whole.
        grown = [key for key, gpus in fresh.items() if key in since and not gpus.keys() <= kept[key].keys()]
        if grown:
            fresh.update(_read_blocks(conn, width, now, grown, [starts[key] for key in grown]))
            for key in grown:
                del since[key]
        gpus: dict[GpuKey, list[_BlockRow]] = {}
        self._jobs = {}
        for c, j in jobs:
            start = starts[(c, j)]
            cut = since.get((c, j), start)
            cached = kept.get((c, j), {}) if (c, j) in since else {}
            read = fresh.get((c, j), {})
            for node, uuid in sorted(cached.keys() | read.keys()):
                held = cached.get((node, uuid), (cut, []))[1]  # oldest first, as read
                rows = [*_between(held, start, cut), *read.get((node, uuid), [])]
                if not rows:
                    continue
                gpus[(c, j, node, uuid)] = rows
                until = _floor(min(now, rows[-1].read.last_ts) - SETTLE, width)
                self._jobs.setdefault((c, j), {})[(node, uuid)] = (until, _between(rows, start, until))
        return gpus


def _read_blocks(conn: psycopg.Connection[Any], width: int, now: datetime, jobs: list[tuple[str, str]],
                 since: list[datetime]) -> dict[tuple[str, str], dict[tuple[str, str], list[_BlockRow]]]:
    """(cluster, job) -> (node, uuid) -> blocks read from each job's ``since``, oldest first."""
    out: dict[tuple[str, str], dict[tuple[str, str], list[_BlockRow]]] = {}
    for r in rule_reads.blocks(conn, width, now, jobs, since):
        out.setdefault((r.cluster, r.job_id), {}).setdefault((r.node, r.gpu_uuid), []).append(_BlockRow(
            Block(r.block, r.n, r.n_idle, r.n_busy, r.act, r.sm_active, r.tensor, r.fb, int(r.throttled or 0),
                  r.power, r.duty, r.traffic, r.power_limit), r))
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


def _add_faults(read: list[rule_reads.Fault], now: datetime, views: dict[tuple[str, str], JobView],
                view_of: Callable[[str, str, str], tuple[str, str]]) -> None:
    """XIDs and lost GPUs onto the GPUs they concern; a GPU silent for the whole look-back (lost)
    still carries its fault."""
    faults: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for f in read:
        found = faults.setdefault((f.cluster, f.job_id, f.node, f.gpu_uuid), {"xids": {}})
        if f.kind == "gpu_lost":
            found["lost_at"] = f.first
        elif f.code is not None:
            found["xids"][int(f.code)] = f.first
    changes: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    for (c, j, node, uuid), change in faults.items():
        key = view_of(c, j, node)
        view = views.setdefault(key, JobView([])) if not j else views.get(key)
        if view is None:
            continue
        if not any((g.node, g.gpu_uuid) == (node, uuid) for g in view.gpus):
            first = min([*change["xids"].values(), change.get("lost_at") or now])
            view.gpus.append(GpuStats(c, j, None, node, uuid, -1, None, first, first, None, reporting=False))
        changes.setdefault(key, {})[(node, uuid)] = change
    for key, change_set in changes.items():
        _update(views[key], change_set)


def add_history(conn: psycopg.Connection[Any], window: Window, asked: dict[tuple[str, str], list[Any]]) -> None:
    """For the GPUs asked (``(node, uuid, before, idle_share)`` of a job: idle for idle_minutes or
    more): was the GPU ever busy since the job started (never: over-allocation), and when did an idle
    stretch that reaches past ``before`` (its window's start) begin, by its own idle_share?"""
    idle = [rule_reads.IdleGpu(c, j, *gpu) for (c, j), gpus in asked.items() for gpu in gpus]
    if not idle:
        return
    changes: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
    for gpu in idle:  # a GPU with no 300 s roll-up: never busy, no older idle stretch
        changes.setdefault((gpu.cluster, gpu.job_id), {})[(gpu.node, gpu.gpu_uuid)] = {
            "ever_busy": False, "idle_before": None}
    for h in rule_reads.history(conn, window.now, idle):
        changes[(h.cluster, h.job_id)][(h.node, h.gpu_uuid)] = {"ever_busy": h.ever_busy, "idle_before": h.idle_before}
    for key, change_set in changes.items():
        _update(window.views.get(key), change_set)


def add_rows(conn: psycopg.Connection[Any], window: Window, query: str, asked: list[tuple[str, str]]) -> None:
    """A per-job read (`rule_reads.JOB_READS`) of the ``asked`` jobs, its rows onto their views."""
    if not asked:
        return
    starts = [min(g.start for g in window.views[key].gpus) for key in asked]
    for key in asked:
        window.views[key].rows[query] = []
    for row in rule_reads.of_jobs(conn, query, window.now, window.shape.lookback, asked, starts):
        window.views[(row[0], row[1])].rows[query].append(row)


def add_processes(conn: psycopg.Connection[Any], window: Window, wanted: list[tuple[str, str]],
                  minutes: MinuteCache) -> None:
    """Every job's ranks, and the process minutes of the ``wanted`` jobs (CPU, runnable and allowed
    time: what a data pipeline's saturation is weighed by)."""
    jobs = window.views
    procs: dict[tuple[str, str, str, int], ProcStats] = {}
    for r in window.ranks():
        procs[(r.cluster, r.job_id, r.node, r.pid)] = ProcStats(r.node, r.pid, r.rank, r.gpu_uuid, r.command,
                                                               cpus=dict(Counter(r.cpus or [])))
    for m in minutes.read(conn, window.now, window.shape.lookback, wanted, jobs):
        p = procs.get((m.cluster, m.job_id, m.node, m.pid))
        if p is None:
            p = procs[(m.cluster, m.job_id, m.node, m.pid)] = ProcStats(m.node, m.pid, m.rank, m.gpu_uuid, m.command)
        if m.cpu is not None:
            p.cpu_by_minute[m.bucket] = m.cpu
        if m.runnable:
            p.runnable_by_minute[m.bucket] = m.runnable
        if m.allowed:
            p.allowed_by_minute[m.bucket] = m.allowed
    for (c, j, *_), p in sorted(procs.items()):  # in one order, however the rows came
        if (c, j) in jobs:
            jobs[(c, j)].procs.append(p)


def read(conn: psycopg.Connection[Any], window: Window, query: str, asked: dict[tuple[str, str], list[Any]],
         blocks: Blocks) -> None:
    """One family read (`model.Read`) of the jobs that asked: a reader of its own, else a per-job read
    of the store. Every job's ranks come with the process read, asked or not."""
    if query == "history":
        add_history(conn, window, asked)
    elif query == "processes":
        add_processes(conn, window, list(asked), blocks.minutes)
    else:
        add_rows(conn, window, query, list(asked))


READERS = ("history", "processes")
"""The reads of their own (`read`); every other `model.Read` names a per-job read of the store."""


MINUTE = timedelta(seconds=60)


class MinuteCache:
    """The process side of `BlockCache`: the 60 s process roll-ups of the jobs input_bound judges
    that can no longer change, so that a cycle reads only each job's last minutes (all of them, at
    8,000 GPUs, were most of a cycle). A minute is settled once every GPU of its job has reported
    ``SETTLE`` past its end: a node's process and GPU samples travel in the same batches, oldest
    first. A job with a node the cache has not seen (a late node) is read whole."""

    def __init__(self) -> None:
        # (cluster, job) -> (minutes before this are settled, the job's nodes then, those minutes' rows)
        self._jobs: dict[tuple[str, str], tuple[datetime, frozenset[str], list[rule_reads.CpuMinute]]] = {}

    def read(self, conn: psycopg.Connection[Any], now: datetime, lookback: timedelta, wanted: list[tuple[str, str]],
             jobs: dict[tuple[str, str], JobView]) -> list[rule_reads.CpuMinute]:
        """Every process minute in the window of the ``wanted`` jobs: settled ones from the cache,
        the rest read. Keeps what settled; forgets the other jobs."""
        start = now - lookback
        nodes = {key: frozenset(g.node for g in jobs[key].gpus) for key in wanted}
        kept = {key: self._jobs[key] for key in wanted if key in self._jobs and nodes[key] <= self._jobs[key][1]}
        since = [max(kept[key][0], start) if key in kept else start for key in wanted]
        fresh: dict[tuple[str, str], list[rule_reads.CpuMinute]] = {}
        for row in rule_reads.cpu_minutes(conn, now, lookback, wanted, since):
            fresh.setdefault((row.cluster, row.job_id), []).append(row)
        self._jobs, out = {}, []
        for key in wanted:
            rows = [r for r in kept[key][2] if r.bucket > start] if key in kept else []
            rows += fresh.get(key, [])
            out += rows
            newest = min((g.last_ts for g in jobs[key].gpus if g.blocks), default=None)
            if newest is not None:
                until = _floor(min(now, newest) - SETTLE, 60)
                self._jobs[key] = (until, nodes[key], [r for r in rows if r.bucket + MINUTE <= until])
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
