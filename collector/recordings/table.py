"""Recordings as tables: a header and rows (CSV, TSV, `--query-gpu`, DCGM fields, W&B's system-metrics
export, people's own loggers) or one JSON object per sample (gpustat `--json`, nvitop's metric
collector, JSON-lines loggers). Every column is named through the one alias table
(`schema.field_aliases`); `--columns` names those of a file without a header.

A row gives one GPU (its index column, or none: `readings` numbers the GPUs) or, in a wide file,
several (a column per GPU and field); a node column (hostname, node, ...) says whose GPU: a cluster's
log is its nodes, each with its own GPU indices. A line that does not fit is a `Skip`; a header repeated where
logs were appended is counted and read again.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from jobpulse.collector.recordings.faults import RecordingError, Refused, Skip
from jobpulse.collector.recordings.times import Clock
from jobpulse.collector.recordings.values import NO_GPU, Mapping, Reading, index, node_name, put, stand_in
from jobpulse.schema import field_aliases as fa

MAX_GPUS = 64
"""GPUs told apart by bus id or UUID in one node (a node has at most a few dozen)."""
MAX_NODES = 1024
"""Nodes one file may name (a job's; a new name on every row is damage, not a cluster)."""
BusIds = dict[str, dict[str, int]]
"""Per node, each GPU told apart by bus id or UUID -> the index it is given."""
MAX_JSON = 1 << 20
"""The largest JSON document read as one sample (gpustat's pretty-printed output is a few KiB)."""
_NUMERIC = re.compile(r"^\s*-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\s*(?:[A-Za-z%/]+\s*)?$")


class Plan:
    """How a header's columns become readings: which column is the time, the GPU, a field."""

    def __init__(self, names: Sequence[str], mapping: Mapping) -> None:
        self.names = [n.strip().strip('"') for n in names]
        self.fields: list[tuple[int, str, fa.Alias, int | None]] = []
        self.times: list[int] = []
        self.elapsed: int | None = None
        self.index: int | None = None
        self.uuid: int | None = None
        self.model: int | None = None
        self.bus_id: int | None = None
        self.node: int | None = None
        for i, name in enumerate(self.names):
            found = fa.lookup(name)
            mapping.note(name, found[0].field if found else None)
            if found is None:
                continue
            alias, gpu = found
            if alias.field == fa.TIME:
                self.times.append(i)
            elif alias.field in fa.IDENTITY:
                attr = {fa.ELAPSED: "elapsed", fa.INDEX: "index", fa.UUID: "uuid", fa.MODEL: "model",
                        fa.BUS_ID: "bus_id", fa.NODE: "node"}[alias.field]
                # a plain "index" may be pandas' row number: a named GPU column (EntityId, gpu) wins
                if getattr(self, attr) is None or attr == "index" and self._plain_index():
                    setattr(self, attr, i)
            else:
                self.fields.append((i, name, alias, gpu))
        self.wide = any(gpu is not None for *_, gpu in self.fields)
        if self.node is not None:
            mapping.node_column = self.names[self.node]

    def _plain_index(self) -> bool:
        return self.index is not None and fa.key(self.names[self.index])[0] == "index"

    def readings(self, cells: Sequence[str], line: int, clock: Clock, bus_ids: BusIds) -> list[Reading]:
        if len(cells) != len(self.names):
            raise RecordingError(f"{len(cells)} columns where the header has {len(self.names)}", line)
        node = node_name(cells[self.node], self.names[self.node], line) if self.node is not None else ""
        if node not in bus_ids and len(bus_ids) >= MAX_NODES:
            raise RecordingError(f"a node beyond the {MAX_NODES} one file may name ({node!r})", line)
        known = bus_ids.setdefault(node, {})
        ts = self._time(cells, line, clock)
        per_gpu: dict[int | None, dict[str, float | int]] = {}
        for i, name, alias, gpu in self.fields:
            if self.wide and gpu is None:
                continue  # a column of no GPU in a file of a column per GPU (host CPU, the job's own)
            put(per_gpu.setdefault(gpu, {}), alias.field, cells[i], name, line, alias.factor)
        if self.wide:
            return [Reading(line, ts, gpu, v, stand_in=stand_in(v), node=node) for gpu, v in sorted(per_gpu.items())
                    if v and gpu is not None]
        values = per_gpu.get(None, {})
        uuid, model, bus = (cells[c].strip().strip('"') or None if c is not None else None
                            for c in (self.uuid, self.model, self.bus_id))
        if self.index is not None:
            gpu = index(cells[self.index], line)
        elif bus or uuid:
            if str(bus or uuid) not in known and len(known) >= MAX_GPUS:
                raise RecordingError(f"a GPU beyond the {MAX_GPUS} a node has ({bus or uuid!r})", line)
            gpu = known.setdefault(str(bus or uuid), len(known))
        else:
            gpu = NO_GPU
        return [Reading(line, ts, gpu, values, uuid, model, bus, stand_in=stand_in(values), node=node)]

    def _time(self, cells: Sequence[str], line: int, clock: Clock) -> datetime | None:
        if self.times:
            return clock.read(" ".join(cells[i].strip() for i in self.times), line)
        if self.elapsed is not None:
            clock.elapsed = True
            return clock.read(cells[self.elapsed], line)
        return None


def _is_header(cells: Sequence[str]) -> bool:
    return not any(_NUMERIC.match(c) for c in cells if c.strip()) and any(fa.lookup(c) for c in cells)


def _splitter(header: str) -> str | None:
    for d in (",", "\t", ";"):
        if d in header:
            return d
    return None  # whitespace


def _cells(text: str, delimiter: str | None) -> list[str]:
    if delimiter is None:
        return text.split()
    if '"' not in text:
        return [c.strip() for c in text.split(delimiter)]
    try:
        return [c.strip() for c in next(csv.reader((text,), delimiter=delimiter, skipinitialspace=True), [])]
    except csv.Error:  # a carriage return inside a quoted cell: split as it stands
        return [c.strip().strip('"') for c in text.split(delimiter)]


def table(numbered: Iterable[tuple[int, str]], mapping: Mapping, start: datetime | None,
          columns: list[str] | None = None, time_format: str | None = None) -> Iterator[Reading | Skip]:
    """A delimited table: a header (or ``columns``) and rows; a header met again is counted."""
    plan = Plan(columns, mapping) if columns else None
    delimiter: str | None = None  # the file's own, named columns or not
    header: list[str] | None = None
    clock, bus_ids = Clock(start, form=time_format), BusIds()
    for number, text in numbered:
        if not text.strip() or text.lstrip().startswith("#") and plan is None:
            continue
        if delimiter is None:
            delimiter = _splitter(text)
        cells = _cells(text, delimiter)
        if _is_header(cells):
            if header is not None:
                yield Skip(number, "repeated header", "a header again (logs appended)", text)
            if header != cells:
                header, plan = cells, Plan(cells, mapping) if not columns else plan
            continue
        if plan is None:
            raise Refused("a table without a header: name its columns (--columns timestamp,index,"
                          "utilization.gpu,...)", number)
        try:
            yield from plan.readings(cells, number, clock, bus_ids)
        except Refused:
            raise
        except RecordingError as exc:
            yield Skip(number, "malformed", exc.reason, text)
    mapping.time_form = clock.described


def json_lines(numbered: Iterable[tuple[int, str]], mapping: Mapping, start: datetime | None,
               columns: list[str] | None = None, time_format: str | None = None) -> Iterator[Reading | Skip]:
    """One JSON object per sample, on one line or pretty-printed over several (gpustat --json in a
    loop): its scalars are columns (nested keys joined by '.'), a list of objects ("gpus") one row each.
    An object is parsed once, when its brackets close: bounded in size (`MAX_JSON`) and depth
    (`MAX_DEPTH`), so no input costs more than a pass over it."""
    clock, bus_ids, plans = Clock(start, form=time_format), BusIds(), dict[tuple[str, ...], Plan]()
    pending: list[str] = []
    first = depth = size = 0
    for number, text in numbered:
        if not pending and text.strip() in ("", "[", "]"):  # a pretty-printed array of samples: its brackets
            continue
        if not pending:
            first, depth, size = number, 0, 0
        pending.append(text)
        size += len(text)
        depth += text.count("{") + text.count("[") - text.count("}") - text.count("]")
        if depth > 0 and size <= MAX_JSON and depth <= MAX_DEPTH:
            continue
        if depth > 0:  # too large or too deep: skip to where its brackets close
            if pending[0] is not _TOO_BIG:
                yield Skip(first, "malformed", f"a JSON object over {MAX_JSON >> 10} KiB or {MAX_DEPTH} levels deep",
                           pending[0])
            pending = [_TOO_BIG]
            continue
        body, pending = "\n".join(pending).rstrip().removesuffix(","), []  # "}," between an array's samples
        if body.startswith(_TOO_BIG):
            continue
        yield from _sample(body, first, mapping, clock, bus_ids, plans)
    if pending and pending[0] is not _TOO_BIG:
        yield Skip(first, "malformed", "a JSON object cut short", pending[0])
    mapping.time_form = clock.described


MAX_DEPTH = 32
"""JSON nested deeper than this is no GPU sample (gpustat's is four levels)."""
MAX_PLANS = 64
"""Column sets kept planned at once (a JSON sample's keys may differ from the last one's)."""
_TOO_BIG = "\x00too big"


def _sample(body: str, line: int, mapping: Mapping, clock: Clock, bus_ids: BusIds,
            plans: dict[tuple[str, ...], Plan]) -> Iterator[Reading | Skip]:
    """The readings of one JSON sample."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        yield Skip(line, "malformed", "not a JSON object", body.splitlines()[0])
        return
    samples = obj if isinstance(obj, list) else [obj]  # a one-line array of samples: each one
    if not samples or not all(isinstance(o, dict) for o in samples):
        yield Skip(line, "malformed", "not a JSON object", body.splitlines()[0])
        return
    for row in (row for o in samples for row in _rows(o)):
        names = tuple(row)
        if names not in plans and len(plans) >= MAX_PLANS:
            plans.clear()  # keys that change from sample to sample: plan again rather than keep them all
        plan = plans.get(names) or plans.setdefault(names, Plan(list(names), mapping))
        try:
            yield from plan.readings([row[n] for n in names], line, clock, bus_ids)
        except Refused:
            raise
        except RecordingError as exc:
            yield Skip(line, "malformed", exc.reason, body.splitlines()[0])


def _rows(obj: dict[str, Any]) -> list[dict[str, str]]:
    """A JSON sample as rows of text cells: its scalars, and one row per object of a list in it."""
    scalars: dict[str, str] = {}
    lists: list[list[dict[str, Any]]] = []

    def walk(prefix: str, value: Any) -> None:
        if prefix.count(".") > MAX_DEPTH:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            if value and all(isinstance(v, dict) for v in value) and not prefix.endswith("processes"):
                lists.append(value)
        elif len(scalars) < 1000:
            scalars[prefix] = "" if value is None else str(value)

    walk("", obj)
    if not lists:
        return [scalars]
    rows = []
    for i, element in enumerate(lists[0]):
        row = dict(scalars)
        inner: dict[str, str] = {}
        for k, v in element.items():
            if not isinstance(v, (dict, list)):
                inner[k] = "" if v is None else str(v)
        if not any(fa.lookup(k) and fa.lookup(k)[0].field == fa.INDEX for k in inner):  # type: ignore[index]
            inner["index"] = str(i)
        rows.append({**row, **inner})
    return rows
