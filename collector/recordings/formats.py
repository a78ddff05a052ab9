"""Which recording a file is, and its readings in order: each format's parser (the table and JSON
readers, nvidia-smi's own reports, `nvidia-smi dmon`, `dcgmi dmon`, gpustat's text) behind one call, `readings`,
which also places what the file leaves open: times (an interval, a day for a time of day), GPUs
(rows that cycle through them), and the damage (a time going backwards is skipped and counted).

Formats are recognised from the first lines. Values the tool marks as not measured (`[N/A]`, `-`,
`N/A`) are not measured, never zero. Where DCGM gave GRACT but neither GPUTL nor SMACT, GRACT stands
in for utilization (`Reading.stand_in`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from jobpulse.collector.recordings import gpustat, smi, table
from jobpulse.collector.recordings.faults import RecordingError, Refused, Skip
from jobpulse.collector.recordings.intake import Lines, Source, first_lines, open_text
from jobpulse.collector.recordings.values import NO_GPU, Mapping, Reading, index, put, stand_in
from jobpulse.schema import field_aliases as fa

UNKNOWN_START = datetime(2000, 1, 1)
"""Where a recording without times begins until it is placed (`--start`, `--recent`)."""
SAME_INSTANT_S = 0.025
"""Rows of GPUs without an index taken at one instant lie closer than this (nvidia-smi: about 1 ms)."""
DESCRIBED = {
    "query-gpu": "nvidia-smi --query-gpu CSV", "dcgm-csv": "DCGM fields as CSV", "csv": "a table (CSV/TSV)",
    "wandb-csv": "W&B system metrics (CSV export)", "json": "JSON samples (gpustat --json, nvitop, JSON lines)",
    "dmon": "nvidia-smi dmon", "dcgmi-dmon": "dcgmi dmon", "smi-table": "nvidia-smi's table, repeated",
    "smi-q": "nvidia-smi -q, repeated", "smi-xml": "nvidia-smi -q -x (XML), repeated",
    "gpustat": "gpustat's text, repeated",
}
FORMATS = tuple(DESCRIBED)
ROW_FORMATS = ("query-gpu", "dcgm-csv", "csv", "wandb-csv", "dmon", "dcgmi-dmon", "gpustat")
"""One line, one sample: a last line without its newline is a row cut short, never read."""


def detect(first: list[str]) -> str:
    """The format of a recording from its first lines."""
    text = "\n".join(first)
    if "<nvidia_smi_log" in text or text.lstrip().startswith("<?xml"):
        return "smi-xml"
    if "NVSMI LOG" in text:
        return "smi-q"
    if "NVIDIA-SMI" in text or "│ NVITOP " in text or any(smi.gpu_line(line) for line in first):
        return "smi-table"
    if gpustat.is_gpustat(first):
        return "gpustat"
    for line in first:
        low = line.strip().lower()
        if not low:
            continue
        if low.startswith("{") or low == "[" or re.match(r"\[\s*\{", low):  # an object, or an array of them
            return "json"
        if low.startswith("#") and "entity" in low:
            return "dcgmi-dmon"
        if low.startswith("#") and {"gpu", "idx"} & set(re.split(r"[\s#]+", low)):
            return "dmon"
        if low.startswith("#"):
            continue
        names = re.split(r"[,\t;]", line) if re.search(r"[,\t;]", line) else line.split()
        known = [fa.lookup(n) for n in names]
        if any(known):
            keys = [fa.key(n)[0] for n in names]
            if any(k.startswith("system_gpu_") for k in keys):
                return "wandb-csv"
            if any(k in fa.DCGM_TAGS and n.strip().isupper() or k.startswith("dcgm_fi_") for n, k in zip(names, keys)):
                return "dcgm-csv"
            if any("." in n and k.startswith(("utilization_", "memory_", "power_draw", "temperature_"))
                   for n, k in zip(names, keys)):  # nvidia-smi's property names: utilization.gpu
                return "query-gpu"
            return "csv"
        if len(names) > 1 and sum(bool(re.match(r"^\s*-?[\d.]+", n)) for n in names) > len(names) / 2:
            raise Refused("a table without a header: name its columns as nvidia-smi, DCGM or your logger does "
                          f"(--columns timestamp,utilization.gpu,memory.used,...); it begins {line.strip()[:60]!r}")
        break
    shown = next((x.strip() for x in first if x.strip()), "")[:80]
    raise Refused("not a recording jobpulse knows (nvidia-smi's table, -q or -x, --query-gpu CSV, dmon, dcgmi dmon, "
                  f"DCGM, gpustat or W&B, or a table with named columns); the file begins {shown!r}")


def format_of(src: Source, columns: list[str] | None = None) -> str:
    """A recording's format from its first lines (a headerless table: named ``columns``)."""
    if columns:
        return "csv"
    first = first_lines(src)
    if not any(x.strip() for x in first):
        raise Refused("the file is empty")
    try:
        return detect(first)
    except Refused:
        if src.quotable:
            raise
        raise Refused("not a recording jobpulse knows (its beginning is not quoted: the user who asked "
                      "cannot read this file)") from None


# ------------------------------------------------------------------------------------------- dmon


def dmon(numbered: Iterable[tuple[int, str]], mapping: Mapping) -> Iterator[Reading | Skip]:
    """`nvidia-smi dmon [-s ...] [-o D|T|DT]`: a names line and a units line (both '#'), repeated;
    rows of whitespace-separated values, '-' for what the GPU does not support."""
    names: list[str] | None = None
    units: list[str] = []
    for number, text in numbered:
        if not text.strip():
            continue
        if text.lstrip().startswith("#"):
            cells = text.lstrip("# \t").split()
            if names is None or (cells and cells[0].lower() in ("gpu", "date", "time")):
                names = [c.lower() for c in cells]
                for n in names:
                    mapping.note(n, fa.DMON[n].field if n in fa.DMON else ("@time" if n in ("date", "time") else None))
            else:
                units = [c.lower() for c in cells]
            continue
        if names is None:
            raise Refused("dmon rows before its header line ('# gpu ...')", number)
        try:
            yield _dmon_row(names, units, text.split(), number)
        except RecordingError as exc:
            yield Skip(number, "malformed", exc.reason, text)


def _dmon_row(names: list[str], units: list[str], cells: list[str], number: int) -> Reading:
    if len(cells) != len(names):
        raise RecordingError(f"{len(cells)} values where the header has {len(names)} columns", number)
    row = dict(zip(names, cells, strict=True))
    unit_of = dict(zip(names, units, strict=False))
    values: dict[str, float | int] = {}
    for name, cell in row.items():
        alias = fa.DMON.get(name)
        if alias is None or alias.field in fa.IDENTITY:
            continue
        factor = fa.unit_factor(alias.field, unit_of.get(name, ""))  # the units line: MB, W, MHz, MB/s
        put(values, alias.field, cell, name, number, alias.factor if factor is None else factor)
    gpu = row.get("gpu", row.get("idx"))
    if gpu is None:
        raise Refused("no gpu column in the dmon header", number)
    return Reading(number, _dmon_time(row, number), index(gpu, number), values)


def _dmon_time(row: dict[str, str], number: int) -> datetime | None:
    """-o D gives the date (YYYYMMDD), -o T the time of day; a time without a date is placed on the
    day `readings` is given (its start), returned here on 1900-01-01."""
    day, clock = row.get("date"), row.get("time")
    if day is None and clock is None:
        return None
    try:
        d = datetime.strptime(day, "%Y%m%d").date() if day else date(1900, 1, 1)
        t = time.fromisoformat(clock) if clock else time(0)
    except ValueError:
        raise RecordingError(f"dmon date/time {day or ''} {clock or ''} is not YYYYMMDD HH:MM:SS", number) from None
    if day and not 1990 <= d.year < 2200:
        raise RecordingError(f"dmon date {day} is year {d.year}: not a time a GPU was recorded", number)
    return datetime.combine(d, t)


# ------------------------------------------------------------------------------------ dcgmi dmon


def dcgmi_dmon(numbered: Iterable[tuple[int, str]], mapping: Mapping) -> Iterator[Reading | Skip]:
    """`dcgmi dmon -e ...`: a '#Entity' line of field tags, an 'ID' line, rows 'GPU 0 v v ...'.
    Rows of other entities (MIG instances: GPU-I, GPU-CI; NvSwitches) are not GPUs: skipped."""
    tags: list[str] | None = None
    for number, text in numbered:
        cells = text.split()
        if not cells:
            continue
        if cells[0].startswith("#"):
            tags = [c.lower() for c in text.lstrip("# \t").split()[1:]]  # after "Entity"
            for t in tags:
                mapping.note(t.upper(), fa.ALIASES[t].field if t in fa.DCGM_TAGS else None)
            continue
        if cells[0].upper() == "ID" or set(text.strip()) <= {"-", " "}:
            continue
        if tags is None:
            raise Refused("dcgmi dmon rows before its '#Entity' header line", number)
        if cells[0].upper() != "GPU":
            continue
        try:
            if len(cells) != len(tags) + 2:
                raise RecordingError(f"{len(cells) - 2} values where the header has {len(tags)} fields", number)
            values: dict[str, float | int] = {}
            for tag, cell in zip(tags, cells[2:], strict=True):
                if tag in fa.DCGM_TAGS:
                    alias = fa.ALIASES[tag]
                    put(values, alias.field, cell, tag.upper(), number, alias.factor)
            yield Reading(number, None, index(cells[1], number), values, stand_in=stand_in(values))
        except RecordingError as exc:
            yield Skip(number, "malformed", exc.reason, text)


# -------------------------------------------------------------------------------------- readings

Parser = Callable[[Iterable[tuple[int, str]], Mapping, datetime | None, list[str] | None, str | None],
                  Iterator[Reading | Skip]]
PARSERS: dict[str, Parser] = {
    **{f: table.table for f in ("query-gpu", "dcgm-csv", "csv", "wandb-csv")},
    "json": table.json_lines,
    "dmon": lambda n, m, s, c, t: dmon(n, m), "dcgmi-dmon": lambda n, m, s, c, t: dcgmi_dmon(n, m),
    "smi-table": lambda n, m, s, c, t: smi.table_reports(n, m),
    "smi-q": lambda n, m, s, c, t: smi.query_reports(n, m),
    "smi-xml": lambda n, m, s, c, t: smi.xml_reports(n, m),
    "gpustat": lambda n, m, s, c, t: gpustat.reports(n, m),
}
TIMED_BY_COLUMN = ("query-gpu", "dcgm-csv", "csv", "wandb-csv", "json")
"""Formats whose times are a column's, which `--time-format` names."""


@dataclass(frozen=True)
class ReadOptions:
    """How `readings` places what the file leaves open (the import's options, as it sees them)."""

    columns: list[str] | None = None
    start: datetime | None = None  # naive, in the recording's zone
    interval: timedelta | None = None
    gpu_count: int | None = None  # rows cycle through this many GPUs (a file that names none)
    time_format: str | None = None  # the time column's strftime form (`--time-format`); None: read from its values


class Placer:
    """Numbers the GPUs of rows that name none (one placer a node): cycling through ``count``, else one
    instant's rows (times closer than `SAME_INSTANT_S`) are its GPUs in order."""

    def __init__(self, count: int | None) -> None:
        self.count, self.n = count, -1
        self.instant: datetime | None = None

    def gpu(self, ts: datetime | None) -> int:
        self.n += 1
        if self.count:
            return self.n % self.count
        if ts is None or self.instant is None or abs((ts - self.instant).total_seconds()) > SAME_INSTANT_S:
            self.n, self.instant = 0, ts
        return self.n


def readings(src: Source, fmt: str, opts: ReadOptions, mapping: Mapping | None = None) -> Iterator[Reading | Skip]:
    """Every reading of a recording, streamed, each with a naive time (or aware, where the file gives
    a zone or Unix time), and every line left out: the file's own time where it has one (a time of
    day placed on ``start``'s day, rolling over midnight), else ``start`` plus one ``interval`` per
    round of GPUs (a round ends where a GPU repeats; dmon's and dcgmi's default interval is a second),
    from 2000-01-01 where ``start`` is not known. A GPU's time that does not advance is skipped. A GPU
    is its node's (the file's node column; "" where it names none) and its index there.
    Raises `times.TimeForm` where the dates turn out to be the other way round (read again in that form)."""
    mapping = mapping or Mapping()
    interval = opts.interval or (timedelta(seconds=1) if fmt in ("dmon", "dcgmi-dmon") else None)
    if opts.time_format and fmt not in TIMED_BY_COLUMN:
        raise Refused(f"--time-format names a time column's form: {DESCRIBED[fmt]} has none (its times are "
                      "its own reports')")
    with open_text(src) as stream:
        numbered = Lines(stream, src.limits.max_bytes, hold_cut=fmt in ROW_FORMATS)
        rounds, seen, day_shift, last = -1, set[tuple[str, int]](), timedelta(0), None
        placers: dict[str, Placer] = {}
        previous: dict[tuple[str, int], datetime] = {}
        for r in PARSERS[fmt](numbered, mapping, opts.start, opts.columns, opts.time_format):
            if isinstance(r, Skip):
                yield r
                continue
            mapping.named = mapping.named or r.gpu != NO_GPU
            if r.gpu == NO_GPU:
                placer = placers.get(r.node) or placers.setdefault(r.node, Placer(opts.gpu_count))
                gpu = placer.gpu(r.ts)
            else:
                gpu = r.gpu
            if (r.node, gpu) in seen or rounds < 0:
                rounds, seen = rounds + 1, set()
            seen.add((r.node, gpu))
            ts = r.ts
            if ts is None:
                if interval is None:
                    raise Refused(f"the {fmt} recording has no time column: say its interval (--interval "
                                  "SECONDS, as given to nvidia-smi -l)", r.line)
                ts = (opts.start or UNKNOWN_START) + rounds * interval
            elif ts.year == 1900:  # a time of day
                if opts.start is None:
                    raise Refused("times of day without a date: say the day it began (--start), or place it so "
                                  "that it ends now (--recent)", r.line)
                ts = datetime.combine(opts.start.date(), ts.time()) + day_shift
                if last is not None and ts < last - timedelta(hours=1):
                    day_shift += timedelta(days=1)
                    ts += timedelta(days=1)
            last = ts
            before = previous.get((r.node, gpu))
            if before is not None and _not_after(ts, before):
                kind = "time going backwards" if ts < before else "time repeated"
                where = f"{r.node} GPU {gpu}" if r.node else f"GPU {gpu}"
                yield Skip(r.line, kind, f"{where} at {ts.isoformat()}, not after {before.isoformat()}")
                continue
            previous[(r.node, gpu)] = ts
            yield Reading(r.line, ts, gpu, r.values, r.uuid, r.model, r.pci_bus_id, timed=r.ts is not None,
                          stand_in=r.stand_in, node=r.node)
        if numbered.cut:
            yield Skip(numbered.cut[0], "truncated line at the end", "cut short (no end of line)", numbered.cut[1])
        mapping.lines, mapping.unterminated = numbered.count, not numbered.ended_with_newline


def _not_after(ts: datetime, before: datetime) -> bool:
    if (ts.tzinfo is None) != (before.tzinfo is None):
        return False
    return ts <= before
