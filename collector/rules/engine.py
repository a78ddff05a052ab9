"""Evaluate: run the registry's rules over every running (or just ended) job and keep the flags.

`judge` is pure (statistics in, hits out); `evaluate` reads the statistics from the store, judges
each job on its own (one job whose data breaks a rule is logged, never stops the others) and writes
the flags in one transaction.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import structlog

from jobpulse.collector.rules.model import Hit, JobView
from jobpulse.collector.rules.registry import EXCLUSIVE_GPU_VERDICTS, EXPLAINS, FAULTS, RULES, USAGE
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store import flags, rule_inputs

log = structlog.get_logger("jobpulse.rules")


@dataclass(frozen=True)
class CycleResult:
    jobs: int
    gpus: int
    hits: int
    opened_or_kept: int
    closed: int
    seconds: float
    failed_jobs: int = 0
    node_flags: int = 0  # open hardware flags of GPUs no job holds


def judge(view: JobView, thresholds: Thresholds) -> list[Hit]:
    """Every rule over one job: per GPU, the first exclusive verdict in precedence and every other
    GPU rule; then the job-wide rules, with the thresholds of the job's first GPU. A GPU that stopped
    reporting (lost, or its node silent) is judged for faults only."""
    hits: list[Hit] = []
    for g in view.gpus:
        t = thresholds.for_gpu(g.partition, g.model)
        if g.reporting:
            for rule_id in EXCLUSIVE_GPU_VERDICTS:
                found = RULES[rule_id].gpu_check(g, t, view)  # type: ignore[misc]
                if found:
                    hits.append(RULES[rule_id].hit(found))
                    break
        hits += [r.hit(f) for r in RULES.values()
                 if r.gpu_check and r.id not in EXCLUSIVE_GPU_VERDICTS and (g.reporting or r.id not in USAGE)
                 and (f := r.gpu_check(g, t, view))]
    first = view.gpus[0]
    t = thresholds.for_gpu(first.partition, first.model)
    reporting = dataclasses.replace(view, gpus=[g for g in view.gpus if g.reporting])
    for r in RULES.values():
        judged = reporting if r.id in USAGE else view
        if r.job_check and judged.gpus:
            hits += [r.hit(f) for f in r.job_check(judged, t)]
    return one_cause_each(hits)


def judge_unheld(view: JobView, thresholds: Thresholds) -> list[Hit]:
    """The hardware rules on GPUs no job holds (one node's): a sick GPU is the admins' to hear of
    before a job lands on it."""
    hits = [r.hit(f) for g in view.gpus for r in RULES.values()
            if r.gpu_check and r.category == "hardware" and (f := r.gpu_check(g, thresholds.for_gpu(None, g.model), view))]
    return one_cause_each(hits)


def one_cause_each(hits: list[Hit]) -> list[Hit]:
    """Drop what another finding explains (`registry.EXPLAINS`): a hardware fault anywhere in the
    job, any other finding on its own GPU or on the GPUs its evidence names."""
    everywhere = set(USAGE) if any(h.rule_id in FAULTS for h in hits) else set()
    explained = {(rule_id, key) for h in hits for rule_id in EXPLAINS.get(h.rule_id, ())
                 for key in (h.scope_key, *h.evidence.get("gpus", ()))}
    return [h for h in hits if h.rule_id not in everywhere and (h.rule_id, h.scope_key) not in explained]


def evaluate(conn: psycopg.Connection[Any], thresholds: Thresholds,
             blocks: rule_inputs.Blocks | None = None) -> CycleResult:
    """One cycle over every running (or just ended) job and every GPU no job holds; commits the
    flags. ``blocks``: what a process that runs cycle after cycle keeps between them, so that each
    cycle reads only the last minutes of the window; without it a cycle reads the whole window."""
    collecting = gc.isenabled()
    # A cycle builds a million short- and long-lived objects (blocks, GPU statistics) with no
    # reference cycles among them: refcounting frees them, and the cyclic collector's full passes,
    # triggered again and again by the allocations, cost a fifth of a cycle at 8,000 GPUs.
    gc.disable()
    try:
        return _evaluate(conn, thresholds, blocks or rule_inputs.Blocks())
    finally:
        if collecting:
            gc.enable()


def _evaluate(conn: psycopg.Connection[Any], thresholds: Thresholds, blocks: rule_inputs.Blocks) -> CycleResult:
    started = time.perf_counter()
    cycle_start = rule_inputs.start_cycle(conn)
    found = verdicts(conn, thresholds, blocks, cycle_start)
    kept, closed = flags.write(conn, found.jobs, cycle_start, thresholds.flag_hold)
    node_flags = flags.write_nodes(conn, found.nodes, thresholds.flag_hold)
    return CycleResult(len(found.jobs), found.gpus, sum(len(h) for h in found.jobs.values()), kept, closed,
                       time.perf_counter() - started, found.failed, node_flags)


@dataclass(frozen=True)
class Verdicts:
    """A cycle's hits, before they are written: by (cluster, job), and by (cluster, node) for GPUs
    no job holds."""

    jobs: dict[tuple[str, str], list[Hit]]
    nodes: dict[tuple[str, str], list[Hit]]
    gpus: int  # GPUs of the judged jobs
    failed: int  # jobs whose judging raised


def verdicts(conn: psycopg.Connection[Any], thresholds: Thresholds, blocks: rule_inputs.Blocks,
             now: datetime) -> Verdicts:
    """Read and judge every running (or just ended) job and every GPU no job holds at ``now``."""
    with rule_inputs.Reads(conn) as reads:
        topology = reads.soon(rule_inputs.read_topology)
        jobs = rule_inputs.gather(conn, thresholds, now, topology=topology, blocks=blocks.jobs,
                                  minutes=blocks.minutes, reads=reads)
    hits: dict[tuple[str, str], list[Hit]] = {}
    failed = 0
    for key, view in jobs.items():
        try:
            hits[key] = judge(view, thresholds)
        except Exception as exc:  # noqa: BLE001 - one job's bad data must not stop the others' verdicts
            failed += 1
            log.warning("rules failed for a job", cluster=key[0], job=key[1], error=repr(exc)[:300])
    nodes = {key: judge_unheld(view, thresholds)
             for key, view in rule_inputs.gather_unheld(conn, thresholds, now, topology=topology(),
                                                        blocks=blocks.unheld).items()}
    return Verdicts(hits, nodes, sum(len(v.gpus) for v in jobs.values()), failed)
