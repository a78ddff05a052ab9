"""Evaluate: run the registry's rules over every running (or just ended) job and keep the flags.

`judge` is pure (statistics in, hits out); `evaluate` reads the statistics from the store, judges
each job on its own (a rule that raises on a job is logged and loses its verdicts there, never the
other rules' or jobs') and writes the flags in one transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol, TypeVar

import psycopg
import structlog

from jobpulse.collector.rules import inputs
from jobpulse.collector.rules.causes import job_wide
from jobpulse.collector.rules.model import Finding, GpuStats, JobView, Rule, Settings
from jobpulse.collector.rules.registry import (
    EXCLUSIVE_GPU_VERDICTS,
    EXPLAINS,
    FAULTS,
    JOB_WIDE,
    READS,
    RULES,
    USAGE,
    cause_of,
)
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.read import rule_reads
from jobpulse.collector.store.state import flags
from jobpulse.collector.store.state.flags import Hit
from jobpulse.collector.store.tiers import fold

log = structlog.get_logger("jobpulse.rules")
T = TypeVar("T")


class CycleResult(NamedTuple):
    """What one rule cycle did: logged by the leader and counted in the collector's metrics."""

    jobs: int
    gpus: int
    hits: int
    opened_or_kept: int
    closed: int
    seconds: float
    failed_jobs: int = 0
    node_flags: int = 0  # open hardware flags of GPUs no job holds


def judge(view: JobView, thresholds: Thresholds, failed: list[str] | None = None) -> list[Hit]:
    """Every rule over one job: per GPU, the first exclusive verdict in precedence and every other
    GPU rule; then the job-wide rules, with the thresholds of the job's first GPU; a GPU rule that
    holds on every reporting GPU is one job-wide hit (`job_wide.merge`). A GPU that stopped
    reporting (lost, or its node silent) is judged for faults only. A rule that raises loses its own
    verdicts on the job, no other rule's (its id goes to ``failed``), as one collector of a node
    exporter fails alone."""
    hits: list[Hit] = []
    broken: set[str] = set()

    def found(r: Rule, check: Callable[[], T]) -> T | None:
        if r.id in broken:
            return None
        try:
            return check()
        except Exception as exc:  # noqa: BLE001 - one rule's failure must not cost the others' verdicts
            broken.add(r.id)
            log.warning("a rule failed on a job", rule=r.id, cluster=view.gpus[0].cluster, job=view.gpus[0].job_id,
                        error=repr(exc)[:300])
            return None

    def on_gpu(r: Rule, g: GpuStats, t: Settings) -> Finding | None:
        check = r.gpu_check
        return found(r, lambda: check(g, t, view)) if check else None

    for g in view.gpus:
        t = thresholds.for_gpu(g.partition, g.model)
        if g.reporting:
            for rule_id in EXCLUSIVE_GPU_VERDICTS:
                if f := on_gpu(RULES[rule_id], g, t):
                    hits.append(RULES[rule_id].hit(f))
                    break
        hits += [r.hit(f) for r in RULES.values()
                 if r.gpu_check and r.id not in EXCLUSIVE_GPU_VERDICTS and (g.reporting or r.id not in USAGE)
                 and (f := on_gpu(r, g, t))]
    first = view.gpus[0]
    t = thresholds.for_gpu(first.partition, first.model)
    reporting = dataclasses.replace(view, gpus=[g for g in view.gpus if g.reporting], memo={})
    for r in RULES.values():
        judged = reporting if r.id in USAGE else view
        if r.job_check and judged.gpus:
            hits += [r.hit(f) for f in found(r, functools.partial(r.job_check, judged, t)) or ()]
    if failed is not None:
        failed += sorted(broken)
    return job_wide.merge(one_cause_each([h for h in hits if h.rule_id not in broken]), reporting.gpus)


def judge_unheld(view: JobView, thresholds: Thresholds) -> list[Hit]:
    """The hardware rules on GPUs no job holds (one node's): a sick GPU is the admins' to hear of
    before a job lands on it."""
    hits = [r.hit(f) for g in view.gpus for r in RULES.values()
            if r.gpu_check and r.category == "hardware" and (f := r.gpu_check(g, thresholds.for_gpu(None, g.model), view))]
    return one_cause_each(hits)


def one_cause_each(hits: list[Hit]) -> list[Hit]:
    """Drop what another finding explains (`registry.EXPLAINS`): a hardware fault anywhere in the
    job, any other finding on its own GPU or on the GPUs its evidence names; then, of the kinds of
    one cause on one place (`registry.GPU_USE`: a straggler is not also low), the first in precedence."""
    everywhere = set(USAGE) if any(h.rule_id in FAULTS for h in hits) else set()
    explained = {(rule_id, key) for h in hits for rule_id in EXPLAINS.get(h.rule_id, ())
                 for key in (h.scope_key, *h.evidence.get("gpus", ()))}
    kept = [h for h in hits if h.rule_id not in everywhere and (h.rule_id, h.scope_key) not in explained]
    first: dict[tuple[tuple[str, ...], str, str], Hit] = {}
    for h in sorted(kept, key=lambda h: cause_of(h.rule_id).index(h.rule_id)):
        first.setdefault((cause_of(h.rule_id), h.scope, h.scope_key), h)
    return [h for h in kept if first[(cause_of(h.rule_id), h.scope, h.scope_key)] is h]


def evaluate(conn: psycopg.Connection[Any], thresholds: Thresholds,
             blocks: inputs.Blocks | None = None, judges: Judging | None = None) -> CycleResult:
    """One cycle over every running (or just ended) job and every GPU no job holds; commits the
    flags. ``blocks``: what a process that runs cycle after cycle keeps between them, so that each
    cycle reads only the last minutes of the window; without it a cycle reads the whole window.
    ``judges``: processes that read and judge a share of the jobs each (`workers.Judges`) while this
    one judges the GPUs no job holds; the flags are written here either way."""
    if blocks is None:  # one cycle: nothing to keep after it
        with contextlib.closing(inputs.Blocks()) as once:
            return evaluate(conn, thresholds, once, judges)
    started = time.perf_counter()
    fold.run(conn, timedelta(0), begin=False)  # what the leader left raw: the cycle reads every sample stored before it
    cycle_start = rule_reads.start_cycle(conn)
    if judges is None:
        with without_cyclic_gc():
            found = verdicts(conn, thresholds, blocks, cycle_start)
    else:  # the jobs in the rule processes; meanwhile, the GPUs no job holds here
        judges.send(cycle_start)
        try:
            with without_cyclic_gc():
                nodes = node_verdicts(conn, thresholds, blocks.unheld, cycle_start)
        finally:
            found = judges.receive()  # even after a failure here: no answer is left for the next cycle
        found = dataclasses.replace(found, nodes=nodes)
    open_flags = flags.open_job_wide(conn, sorted(JOB_WIDE), list(found.jobs))
    jobs = {key: job_wide.carry_on(hits, open_flags.get(key, {})) for key, hits in found.jobs.items()}
    kept, closed = flags.write(conn, jobs, cycle_start, thresholds.flag_hold, cause_of)
    node_flags = flags.write_nodes(conn, found.nodes, thresholds.flag_hold)
    return CycleResult(len(found.jobs), found.gpus, sum(len(h) for h in found.jobs.values()), kept, closed,
                       time.perf_counter() - started, found.failed, node_flags)


class Judging(Protocol):
    """Processes that read and judge a share of the jobs each (`workers.Judges`): a cycle is sent to
    them, and their verdicts received when this process has judged the GPUs no job holds."""

    def send(self, now: datetime) -> None: ...

    def receive(self) -> Verdicts: ...


@contextlib.contextmanager
def without_cyclic_gc() -> Iterator[None]:
    """A cycle builds a million short- and long-lived objects (blocks, GPU statistics) with no
    reference cycles among them: refcounting frees them, and the cyclic collector's full passes,
    triggered again and again by the allocations, cost a fifth of a cycle at 8,000 GPUs."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


@dataclass(frozen=True)
class Verdicts:
    """A cycle's hits, before they are written: by (cluster, job), and by (cluster, node) for GPUs
    no job holds."""

    jobs: dict[tuple[str, str], list[Hit]]
    nodes: dict[tuple[str, str], list[Hit]]
    gpus: int  # GPUs of the judged jobs
    failed: int  # jobs on which a rule raised (those rules' verdicts on them dropped, the others' kept)


def verdicts(conn: psycopg.Connection[Any], thresholds: Thresholds, blocks: inputs.Blocks,
             now: datetime, share: inputs.Share | None = None) -> Verdicts:
    """Read and judge every running (or just ended) job and every GPU no job holds at ``now``; with
    ``share``, only its jobs (and no GPU no job holds: `node_verdicts`)."""
    with inputs.Reads(conn, blocks.side) as reads:
        topology = reads.soon(inputs.read_topology)
        jobs = read_jobs(conn, thresholds, now, blocks, topology=topology, reads=reads, share=share)
    hits: dict[tuple[str, str], list[Hit]] = {}
    failed = 0
    for key, view in jobs.items():
        broken: list[str] = []
        hits[key] = judge(view, thresholds, broken)
        failed += bool(broken)
    nodes = {} if share else node_verdicts(conn, thresholds, blocks.unheld, now, topology())
    return Verdicts(hits, nodes, sum(len(v.gpus) for v in jobs.values()), failed)


def node_verdicts(conn: psycopg.Connection[Any], thresholds: Thresholds, cache: inputs.BlockCache,
                  now: datetime, topology: inputs.Topology | None = None) -> dict[tuple[str, str], list[Hit]]:
    """The hits on GPUs no job holds at ``now``, by (cluster, node)."""
    return {key: judge_unheld(view, thresholds)
            for key, view in inputs.gather_unheld(conn, shape(thresholds), now, topology=topology,
                                                  blocks=cache).items()}


def shape(thresholds: Thresholds) -> inputs.Shape:
    return inputs.Shape(thresholds.lookback, thresholds.defaults["evidence_block_seconds"])


def read_jobs(conn: psycopg.Connection[Any], thresholds: Thresholds, now: datetime, blocks: inputs.Blocks,
              **gather: Any) -> dict[tuple[str, str], JobView]:
    """The window of every job judged at ``now`` (`inputs.gather`, which takes ``gather``'s
    options), then what the rule families ask to read once they have seen it (`registry.READS`, in
    order: a later read sees what the earlier ones found), each GPU by its own settings."""
    window = inputs.gather(conn, shape(thresholds), now, blocks=blocks.jobs, **gather)

    def settings_of(g: GpuStats) -> Settings:
        return thresholds.for_gpu(g.partition, g.model)
    for read in READS:
        asked = {key: items for key, v in window.views.items() if v.gpus and (items := list(read.asks(v, settings_of)))}
        inputs.read(conn, window, read.query, asked, blocks)
    return window.views
