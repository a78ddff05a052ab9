"""The first pass over a recording: what it holds (format, columns, GPUs, times, what it measures)
and what is wrong with it (lines skipped, by kind), read whole before anything is stored. A file whose
damage dominates is refused, quoting its first bad lines; a few bad lines are counted and said.
`--dry-run` prints this and stops."""

from __future__ import annotations

import hashlib
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from jobpulse.collector.recordings.faults import Refused, Skip
from jobpulse.collector.recordings.formats import DESCRIBED, ReadOptions, format_of, readings
from jobpulse.collector.recordings.intake import Source
from jobpulse.collector.recordings.times import TimeForm
from jobpulse.collector.recordings.values import Mapping, Reading
from jobpulse.collector.rules.registry import (
    HELD_BACK,
    HW_THROTTLING,
    IDLE_GPU,
    IMBALANCE,
    INPUT_BOUND,
    LOW_UTILIZATION,
    MEMORY_UNDERUSED,
    NO_TENSOR_CORES,
    OVER_ALLOCATION,
)

MEASURES: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "activity": (("sm_util", "gpm_sm_active"), "GPU utilization",
                 (IDLE_GPU, LOW_UTILIZATION, IMBALANCE, HELD_BACK, OVER_ALLOCATION, INPUT_BOUND)),
    "memory": (("fb_used_mib",), "GPU memory used", (MEMORY_UNDERUSED,)),
    "memory total": (("fb_total_mib",), "GPU memory total", (MEMORY_UNDERUSED,)),
    "power": (("power_w",), "power draw", ()),
    "clocks": (("sm_clock_mhz",), "SM clock", ()),
    "throttle reasons": (("clock_event_reasons",), "clock event (throttle) reasons", (HW_THROTTLING,)),
    "tensor activity": (("gpm_tensor_active",), "tensor-core activity (GPM / DCGM profiling)", (NO_TENSOR_CORES,)),
}
"""What a recording may lack, by the fields that measure it, and the rules that need it."""
STAND_IN = "DCGM's GRACT (graphics engine active), the recording has no GPUTL or SMACT"
QUOTED = 3
"""Bad lines quoted in a refusal or a dry run."""


@dataclass
class Gpu:
    index: int
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    readings: int = 0


@dataclass
class Survey:
    """What one file holds, and what was left out of it."""

    name: str
    digest: str
    fmt: str
    mapping: Mapping = field(default_factory=Mapping)
    opts: ReadOptions = field(default_factory=ReadOptions)  # how it was read: the second pass reads it so
    readings: int = 0
    first: datetime | None = None  # aware, as recorded
    last: datetime | None = None
    nodes: dict[str, dict[int, Gpu]] = field(default_factory=dict)  # the file's node ("": none named) -> GPUs
    measured: set[str] = field(default_factory=set)
    gaps: list[float] = field(default_factory=list)  # seconds between a GPU's readings (the first 100,000)
    timed: bool = True  # the file gives its own times
    stand_in: bool = False  # GRACT stood in for utilization (`Reading.stand_in`)
    skipped: Counter[str] = field(default_factory=Counter)
    bad: list[Skip] = field(default_factory=list)  # the first few, quoted

    @property
    def gpus(self) -> dict[int, Gpu]:
        """The GPUs of a file of one node (the one it names, or none); {} for several."""
        return next(iter(self.nodes.values())) if len(self.nodes) == 1 else {}

    @property
    def lacks(self) -> list[str]:
        return [what for what, (fields, _, _) in MEASURES.items() if not self.measured & set(fields)]

    @property
    def unjudged(self) -> dict[str, str]:
        """Rules that cannot judge it -> what they miss."""
        out: dict[str, str] = {}
        for what in self.lacks:
            for rule in MEASURES[what][2]:
                out.setdefault(rule, MEASURES[what][1])
        return out

    @property
    def interval_s(self) -> float | None:
        return statistics.median(self.gaps) if self.gaps else None

    @property
    def damage(self) -> int:
        return sum(n for kind, n in self.skipped.items() if kind not in NOT_DAMAGE)

    def skipped_text(self, kinds: tuple[str, ...] | None = None) -> str:
        """'skipped 1 truncated line at the end, 2 malformed lines' ('' where nothing was)."""
        parts = [_plural(n, SAID[kind]) for kind, n in sorted(self.skipped.items()) if n and kind in (kinds or SAID)]
        return "skipped " + ", ".join(parts) if parts else ""


SAID = {"malformed": "malformed line", "repeated header": "repeated header",
        "time going backwards": "line whose time goes backwards", "time repeated": "line whose time repeats the last",
        "truncated line at the end": "truncated line at the end"}
"""How each kind of skipped line is counted in words."""
NOT_DAMAGE = ("repeated header", "time repeated")
"""Skipped but no sign of a bad file: a header again where logs were appended, a second sample in
the same instant (nvidia-smi's table gives whole seconds; a loop without a sleep prints several)."""


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what.replace('line', 'lines', 1).replace('header', 'headers', 1)}"


def digest_of(src: Source) -> str:
    h = hashlib.sha256()
    with src.path.open("rb") as f:
        left = src.size
        while left > 0 and (chunk := f.read(min(1 << 20, left))):
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def aware(ts: datetime, tz: ZoneInfo | None) -> datetime:
    return ts.replace(tzinfo=tz or UTC) if ts.tzinfo is None else ts


def read_options(opts: ReadOptions, tz: ZoneInfo | None, start: datetime | None) -> ReadOptions:
    """``opts`` with the start as the file's own clock writes it (naive, in ``tz``)."""
    local = start.astimezone(tz or UTC).replace(tzinfo=None) if start else None
    return replace(opts, start=local)


def survey(src: Source, fmt: str | None, opts: ReadOptions, tz: ZoneInfo | None) -> Survey:
    """Read the whole recording once: every line checked, nothing written; refused where it holds no
    readings, no utilization, or more bad lines than good ones. Dates found the other way round
    (`TimeForm`) are read again, from the start, in that form."""
    fmt = fmt or format_of(src, opts.columns)
    try:
        return _survey(src, fmt, opts, tz)
    except TimeForm as turned:
        return _survey(src, fmt, replace(opts, time_format=turned.form), tz)


def _survey(src: Source, fmt: str, opts: ReadOptions, tz: ZoneInfo | None) -> Survey:
    found = Survey(src.name, digest_of(src), fmt, opts=opts)
    prev: dict[tuple[str, int], datetime] = {}
    for r in readings(src, found.fmt, opts, found.mapping):
        if isinstance(r, Skip):
            found.skipped[r.kind] += 1
            if r.kind not in NOT_DAMAGE and len(found.bad) < QUOTED:
                found.bad.append(r)
            continue
        _count(found, r, aware(r.ts, tz), prev)  # type: ignore[arg-type]  # readings sets every time
    _name_the_cut(found)
    _judge_damage(found, src.quotable)
    if not found.measured & set(MEASURES["activity"][0]):
        raise Refused("the recording has no GPU utilization column (utilization.gpu, dmon sm, DCGM GPUTL, SMACT or "
                      "GRACT, W&B system.gpu.N.gpu, ...): there is nothing to judge; name it with --columns")
    return found


def _count(found: Survey, r: Reading, ts: datetime, prev: dict[tuple[str, int], datetime]) -> None:
    found.readings += 1
    found.timed = found.timed and r.timed
    found.stand_in = found.stand_in or r.stand_in
    gpus = found.nodes.get(r.node)
    if gpus is None:
        gpus = found.nodes.setdefault(r.node, {})
    g = gpus.get(r.gpu) or gpus.setdefault(r.gpu, Gpu(r.gpu))
    g.readings += 1
    g.uuid, g.model, g.pci_bus_id = g.uuid or r.uuid, g.model or r.model, g.pci_bus_id or r.pci_bus_id
    found.measured.update(r.values)
    found.first = ts if found.first is None else min(found.first, ts)
    found.last = ts if found.last is None else max(found.last, ts)
    before = prev.get((r.node, r.gpu))
    if before is not None and ts > before and len(found.gaps) < 100_000:
        found.gaps.append((ts - before).total_seconds())
    prev[(r.node, r.gpu)] = ts


def _name_the_cut(found: Survey) -> None:
    """A bad last line is the logger killed mid-write: said as such."""
    last = found.bad[-1] if found.bad else None
    cut = last is not None and ("cut short" in last.reason or last.line == found.mapping.lines and (
        found.mapping.unterminated or "where the header has" in last.reason))
    if last is not None and last.kind == "malformed" and cut:
        found.skipped["malformed"] -= 1
        found.skipped += Counter()  # drop a zero count
        found.skipped["truncated line at the end"] += 1
        found.bad[-1] = Skip(last.line, "truncated line at the end", last.reason, last.text)


def _judge_damage(found: Survey, quotable: bool) -> None:
    """A file mostly damaged is refused, quoting its first bad lines where the one who asked may read it."""
    if found.readings and found.damage <= found.readings:
        return
    quoted = "; ".join((f"line {s.line}: {s.reason}" + (f" ({s.text.strip()[:60]!r})" if s.text else ""))
                       if quotable else f"line {s.line}: {s.kind}" for s in found.bad)
    if not found.readings and not found.damage:
        raise Refused("the recording holds no readings")
    damage = found.skipped_text(tuple(k for k in SAID if k not in NOT_DAMAGE)).removeprefix("skipped ")
    raise Refused(f"{found.damage} bad lines ({damage}) against {found.readings} good readings, read as "
                  f"{DESCRIBED[found.fmt]}: too damaged to trust; first: {quoted}")


def describe(found: Survey, node: str, first: datetime, last: datetime) -> list[str]:
    """What `--dry-run` prints of one file: what was understood, before anything is stored."""
    m = found.mapping
    where = f"nodes from its {m.node_column} column" if m.node_column else f"node {node}"
    lines = [f"{found.name}: {DESCRIBED[found.fmt]} ({found.fmt}), {where}",
             f"  columns: {', '.join(f'{k} -> {v}' for k, v in list(m.columns.items())[:40]) or 'by position'}"]
    if m.ignored:
        lines.append(f"  ignored: {', '.join(m.ignored[:20])}{' ...' if len(m.ignored) > 20 else ''}")
    if m.time_form:
        lines.append(f"  times: {m.time_form}")
    elif not found.timed:
        lines.append("  times: none in the file (placed by the interval)")
    for name, held in found.nodes.items():
        gpus = ", ".join(f"{g.index}" + (f" ({g.model})" if g.model else "") for g in held.values())
        lines.append(f"  {'node ' + name + ': ' if m.node_column else ''}GPUs: {len(held)} [{gpus}]"
                     + ("" if m.named or len(held) == 1 else " (numbered by the order of rows at one time)"))
    lines.append(f"  {found.readings} readings, {first.isoformat(timespec='seconds')} .. "
                 f"{last.isoformat(timespec='seconds')}"
                 + (f", {found.interval_s:.3g} s apart" if found.interval_s else ""))
    if found.skipped:
        lines.append(f"  {found.skipped_text()}")
        lines += [f"    line {s.line}: {s.reason}" for s in found.bad]
    if found.stand_in:
        lines.append(f"  utilization: {STAND_IN}")
    unjudged = found.unjudged
    lines.append("  judged by every rule of the recorded fields" + (
        "; not judged: " + ", ".join(f"{rule} (no {what})" for rule, what in unjudged.items()) if unjudged else ""))
    return lines


def spread(surveys: list[Survey]) -> tuple[datetime, datetime]:
    """The first and last time over all files of one job."""
    firsts = [s.first for s in surveys if s.first is not None]
    lasts = [s.last for s in surveys if s.last is not None]
    return min(firsts), max(lasts)

