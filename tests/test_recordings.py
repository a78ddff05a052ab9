"""The rules on real recordings: every labelled recording under tests/data/recordings (real GPUs,
real people's jobs, found in public repositories, and one known workload of ours on a real H200;
labels written from each one's own context before the rules ran on it) is imported with `jobpulse import` and replayed through the live rules
(`rules backtest`), and scored like the simulated library: precision, recall, time to flag and
flags per place and cause."""

from __future__ import annotations

import statistics
import time
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobpulse.collector.recordings.formats import FORMATS
from jobpulse.collector.recordings.importer import Options, import_recording
from jobpulse.collector.recordings.importer import judge as judge_imported
from jobpulse.collector.rules import backtest
from jobpulse.collector.rules.registry import cause_of
from jobpulse.collector.rules.thresholds import Thresholds

LIBRARY = Path(__file__).parent / "data" / "recordings"
FLOOR = 0.9  # precision and recall on real recordings (the acceptance)


def labels() -> list[dict[str, Any]]:
    return tomllib.loads((LIBRARY / "labels.toml").read_text())["recording"]


def _columns(entry: dict[str, Any]) -> list[str] | None:
    """The column list of a CSV without a header (its label names them), or one whose header names
    columns by no name jobpulse knows (the label's `import_columns`, given as --columns)."""
    if "import_columns" in entry:
        return [c.strip() for c in entry["import_columns"].split(",")]
    if "NO header" not in entry.get("columns", "") and "noheader" not in entry["file"]:
        return None
    return [c.strip() for c in entry["columns"].split("(")[0].split(",")]


@dataclass
class Judged:
    name: str
    expected: list[tuple[str, str, float]]  # cause, place ("" = the job, else the GPU's scope key), at_min
    flags: list[backtest.ReplayedFlag]
    start: datetime
    tp: list[tuple[str, float]] = field(default_factory=list)  # (rule, minutes after the labelled evidence)
    fp: list[str] = field(default_factory=list)
    fn: list[str] = field(default_factory=list)


def judge(dsn: str, entry: dict[str, Any], job_id: str) -> Judged:
    model = entry.get("gpu_model")
    opts = Options(job_id=job_id, recent=True, columns=_columns(entry),
                   model=None if model in (None, "unknown") else model,
                   interval=timedelta(seconds=entry["interval_s"]) if entry.get("interval_s") else None,
                   start=datetime.fromisoformat(entry["start"]) if "start" in entry else None)
    done = import_recording(dsn, LIBRARY / entry["file"], opts)
    flags = judge_imported(dsn, done, Thresholds())
    with psycopg.connect(dsn) as conn:
        stored = conn.execute("SELECT count(*) FROM jobpulse.job_flags WHERE cluster = %s AND job_id = %s",
                              (done.cluster, done.job_id)).fetchone()
        assert stored == (len(flags),), "the replayed flags are the job's history"
        uuid = dict(conn.execute("SELECT gpu_index, node || '/' || gpu_uuid FROM jobpulse.job_gpus"
                                 " WHERE cluster = %s AND job_id = %s", (done.cluster, done.job_id)).fetchall())
    merged: dict[tuple[str, str], float] = {}
    for e in entry["expect"]:
        key = ("|".join(cause_of(e["rule"])), uuid[e["gpu"]] if "gpu" in e else "")
        merged[key] = min(merged.get(key, e["at_min"]), e["at_min"])  # one cause, one flag on a place
    return Judged(entry["file"], [(c, p, at) for (c, p), at in merged.items()], flags, done.start)


def score(j: Judged) -> None:
    found = {("|".join(cause_of(f.rule_id)), f.scope_key): f for f in j.flags}
    for cause, place, at_min in j.expected:
        f = found.pop((cause, place), None)
        if f is None:
            j.fn.append(f"MISSED {cause} {place or '(job)'} (evidence at {at_min:.1f} min)")
        else:
            j.tp.append((f.rule_id, (f.raised_at - j.start).total_seconds() / 60 - at_min))
    j.fp += [f"UNEXPECTED {f.rule_id} {f.scope_key or '(job)'} raised at "
             f"{(f.raised_at - j.start).total_seconds() / 60:.1f} min" for f in found.values()]


@pytest.mark.timeout(900)
def test_real_recordings_score_above_the_floor(dsn: str) -> None:
    entries = labels()
    skipped = [e["file"] for e in entries if e["format"] not in FORMATS]  # described in words: still read
    assert len(entries) >= 15 and len({e["format"] for e in entries}) >= 3
    assert any(e["duration_min"] >= 120 for e in entries), "a multi-hour recording"
    started = time.monotonic()
    judged = []
    for i, entry in enumerate(entries):
        j = judge(dsn, entry, str(880_000 + i))
        score(j)
        judged.append(j)
    tp = sum(len(j.tp) for j in judged)
    fp = sum(len(j.fp) for j in judged)
    fn = sum(len(j.fn) for j in judged)
    precision, recall = tp / (tp + fp) if tp + fp else 1.0, tp / (tp + fn) if tp + fn else 1.0
    delays = [d for j in judged for _, d in j.tp]
    per_place: dict[tuple[str, str, str], int] = defaultdict(int)
    for j in judged:
        for f in j.flags:
            per_place[(j.name, "|".join(cause_of(f.rule_id)), f.scope_key)] += 1
    by_rule: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for j in judged:
        for rule, _ in j.tp:
            by_rule[rule][0] += 1
        for p in j.fp:
            by_rule[p.split()[1]][1] += 1
    print(f"\nreal recordings: {len(entries)} judged ({', '.join(sorted({e['format'] for e in entries}))}), "
          f"{sum(e['duration_min'] for e in entries) / 60:.1f} GPU-job hours, in {time.monotonic() - started:.0f} s; "
          f"formats without a name of their own: {', '.join(skipped) or 'none'}")
    print(f"TP {tp}  FP {fp}  FN {fn}  precision {precision:.2f}  recall {recall:.2f}  "
          f"time to flag after the labelled evidence: median {statistics.median(delays) if delays else 0:+.1f} min, "
          f"max {max(delays, key=abs) if delays else 0:+.1f} min; most flags on one place and cause: "
          f"{max(per_place.values(), default=0)}")
    for rule, (t, f) in sorted(by_rule.items()):
        print(f"  {rule:18} TP {t:3d}  FP {f:3d}")
    for j in judged:
        kinds = ", ".join(f"{f.rule_id}{'(' + '>'.join(f.kinds) + ')' if len(f.kinds) > 1 else ''} "
                          f"{f.scope_key.split('/')[-1][-2:] if f.scope_key else 'job'}" for f in j.flags)
        print(f"  {j.name}: {kinds or 'no flags'}")
        for p in j.fp + j.fn:
            print(f"      {p}")
    assert max(per_place.values(), default=0) <= 1, "one flag per place and cause over any job"
    assert precision >= FLOOR and recall >= FLOOR, (precision, recall)
