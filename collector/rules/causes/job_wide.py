"""One flag per cause per job: where a GPU rule finds the same cause on every GPU of a job (pipeline
bubbles, a keep-alive after the work, a slow load), the job gets one flag of that rule, scoped to the
job, that names the GPUs, their levels and one advice; where the GPUs differ in cause (one GPU idle
of eight), each keeps its own flag.

A job-wide flag, once open, goes on naming the GPUs on which its cause still holds (`carry_on`): a GPU
that recovers for a cycle, or one whose evidence wavers, does not split it into per-GPU flags. The
flags' lifecycle (`store.state.flags.write`, `backtest.replay`) makes the job-wide flag take over the
per-GPU flags of its cause that were open on its GPUs when it formed: one or the other, never both.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from jobpulse.collector.rules.model import GpuStats
from jobpulse.collector.rules.registry import JOB_WIDE
from jobpulse.collector.store.state.flags import Hit

_LEVELS = (("mean_percent", "{:.0f}%"), ("sm_active_percent", "{:.0f}% SM activity"), ("idle_share", "{:.0%} idle"))
"""What a GPU's level is in words, by the first of these its evidence holds."""


def merge(hits: list[Hit], gpus: Sequence[GpuStats]) -> list[Hit]:
    """The hits of one job with each JOB_WIDE rule that fired on every one of ``gpus`` (the job's
    reporting GPUs, two or more) made one job-wide hit; the rest as they were."""
    names = {g.key: g.where for g in sorted(gpus, key=lambda g: (g.node, g.gpu_index, g.key))}
    if len(names) < 2:
        return hits
    by_rule: dict[str, list[Hit]] = {}
    for h in hits:
        if h.scope == "gpu" and h.rule_id in JOB_WIDE and h.scope_key in names:
            by_rule.setdefault(h.rule_id, []).append(h)
    whole = {rule for rule, found in by_rule.items() if len({h.scope_key for h in found}) == len(names)}
    return _merged(hits, {rule: by_rule[rule] for rule in whole}, names, len(names))


def carry_on(hits: list[Hit], open_flags: Mapping[str, dict[str, Any]]) -> list[Hit]:
    """A job's hits with its open job-wide flags carried on: ``open_flags`` maps a rule to the
    evidence of the job's open job-wide flag of it; the per-GPU hits of that rule on the GPUs the flag
    names become one job-wide hit naming those still hit (however few)."""
    carried: dict[str, list[Hit]] = {}
    names: dict[str, str] = {}
    gpus_in_job = 0
    for rule, evidence in open_flags.items():
        named = _named(evidence)
        found = [h for h in hits if h.rule_id == rule and h.scope == "gpu" and h.scope_key in named]
        if found:
            carried[rule] = found
            names.update(named)
            gpus_in_job = max(gpus_in_job, int(evidence.get("gpus_in_job") or len(named)))
    return _merged(hits, carried, names, gpus_in_job) if carried else hits


def _named(evidence: dict[str, Any]) -> dict[str, str]:
    """GPU key -> its name, from a job-wide flag's evidence (``gpus`` and ``per_gpu`` side by side)."""
    keys, per_gpu = evidence.get("gpus"), evidence.get("per_gpu")
    if not isinstance(keys, list) or not isinstance(per_gpu, list) or len(keys) != len(per_gpu):
        return {}
    return {str(k): str(p.get("gpu", k)) if isinstance(p, dict) else str(k) for k, p in zip(keys, per_gpu, strict=True)}


def _merged(hits: list[Hit], groups: dict[str, list[Hit]], names: dict[str, str], gpus_in_job: int) -> list[Hit]:
    """``hits`` with each group's per-GPU hits replaced, where the first of them stood, by one job-wide
    hit listing its GPUs in the order of ``names`` (node, then GPU index)."""
    if not groups:
        return hits
    out: list[Hit] = []
    for h in hits:
        found = groups.get(h.rule_id)
        if found is None or h.scope != "gpu" or h.scope_key not in names:
            out.append(h)
        elif h is found[0]:
            order = list(names)
            out.append(job_hit(sorted(found, key=lambda x: order.index(x.scope_key)), names, gpus_in_job))
    return out


def job_hit(found: list[Hit], names: dict[str, str], gpus_in_job: int) -> Hit:
    """One rule's hits on several GPUs of a job as one job-wide hit: the earliest onset, the evidence
    the GPUs share (means of their numbers), each GPU's own (``per_gpu``, beside ``gpus``), and the
    first GPU's advice followed by every GPU's level."""
    first = found[0]
    per_gpu = [{"gpu": names[h.scope_key], **h.evidence} for h in found]
    levels = ", ".join(f"{names[h.scope_key]} {_level(h.evidence)}".rstrip() for h in found)
    every = "all" if len(found) == gpus_in_job else f"{len(found)} of the"
    return replace(first, scope="job", scope_key="", started_at=min(h.started_at for h in found),
                   evidence={**_shared([h.evidence for h in found]), "gpus": [h.scope_key for h in found],
                             "gpus_flagged": len(found), "gpus_in_job": gpus_in_job, "per_gpu": per_gpu},
                   advice=f"{first.advice} The same on {every} {gpus_in_job} GPUs of the job: {levels}.")


def _level(evidence: dict[str, Any]) -> str:
    for key, form in _LEVELS:
        if isinstance(evidence.get(key), int | float):
            return form.format(evidence[key])
    return ""


def _shared(evidences: list[dict[str, Any]]) -> dict[str, Any]:
    """What the GPUs' evidence has in common: a value they all give, the mean of a measure (a float),
    the union of lists (ranks); what differs otherwise (a PID, a count) stays in each GPU's own
    evidence only."""
    out: dict[str, Any] = {}
    for key, value in evidences[0].items():
        values = [e.get(key) for e in evidences]
        if all(v == value for v in values):
            out[key] = value
        elif all(isinstance(v, float) for v in values):
            mean = statistics.fmean(values)  # type: ignore[arg-type]  # numbers, as checked
            out[key] = round(mean, 3 if all(abs(v) <= 1 for v in values) else 1)  # type: ignore[arg-type]
        elif all(isinstance(v, list) for v in values):
            out[key] = list(dict.fromkeys(x for v in values for x in v))  # type: ignore[union-attr]
    return out
