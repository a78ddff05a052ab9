"""One reading of one GPU as a recording gives it, and the values in it: a number with or without its
unit, in the field's unit and bounds; what the tool marks as not measured is absent, never zero."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from jobpulse.collector.recordings.faults import RecordingError
from jobpulse.schema.field_aliases import MIB_PER, unit_factor
from jobpulse.schema.fields import GPU_FIELDS

BOUNDS = {f.name: (f.lo, f.upper, f.python) for f in GPU_FIELDS if f.sql not in ("boolean", "text")}
NO_GPU = -1
"""A reading whose GPU the recording does not name (no index column): `readings` numbers it."""

_NOT_MEASURED = {"", "-", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[gpu is lost]",
                 "[insufficient permissions]", "[gpu requires reset]", "unknown", "nan", "none", "null", "err!"}
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(?:([A-Za-z%/°]+)\s*)?$")


@dataclass(frozen=True, slots=True)
class Reading:
    """One GPU at one moment as the recording gives it; ``ts`` None where the format has no time
    column (placed by the interval: `readings` sets it)."""

    line: int
    ts: datetime | None
    gpu: int  # index in the recording; NO_GPU where it names none
    values: dict[str, float | int]  # agent field name -> value, in the field's unit; absent = not measured
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    timed: bool = True  # the time is the file's own (else placed by the interval)
    stand_in: bool = False  # utilization is DCGM's GRACT (the recording gave no GPUTL or SMACT)
    node: str = ""  # the node the recording names (a host column); "" where it names none


@dataclass
class Mapping:
    """What a parser understood of the file's columns, for `--dry-run` and the refusal messages."""

    columns: dict[str, str] = field(default_factory=dict)  # the file's name -> our field (or @identity)
    ignored: list[str] = field(default_factory=list)
    time_form: str | None = None
    lines: int = 0  # read, after the whole file
    named: bool = False  # the file names its GPUs (an index, bus id or UUID, a column per GPU)
    node_column: str | None = None  # the column that names each row's node (hostname, node, ...)
    unterminated: bool = False  # its last line has no newline (cut short where the logger was killed)

    def note(self, name: str, target: str | None) -> None:
        if target is None:
            if name not in self.ignored and len(self.ignored) < 200:
                self.ignored.append(name)
        elif name not in self.columns and len(self.columns) < 200:
            self.columns[name] = target


def value(text: str, column: str, line: int, factor: float = 1.0, field_name: str | None = None) -> float | None:
    """A number in ``field_name``'s unit: a unit after it ('1.5 GiB', '250 mW', '87 %') is converted
    and replaces the column's ``factor``; None where the tool said it was not measured; hex for bitmasks."""
    t = text.strip().strip('"')
    if t.lower() in _NOT_MEASURED:
        return None
    if t.lower().startswith("0x"):
        try:
            return int(t, 16)
        except ValueError:
            pass
    m = _NUMBER.match(t)
    if m is None:
        raise RecordingError(f"{column}: {t[:40]!r} is not a number", line)
    unit = (m.group(2) or "").lower()
    own = unit_factor(field_name, unit) if field_name and unit else None
    if own is not None:
        return float(m.group(1)) * own
    scale = MIB_PER.get(unit, 1.0) if unit.endswith("b") else 1.0
    return float(m.group(1)) * scale * factor


def checked(field_name: str, v: float, column: str, line: int) -> float | int:
    """``v`` within what the field holds, as its type; outside is a bad line naming the column."""
    lo, hi, kind = BOUNDS[field_name]
    if v != v or not lo <= v <= hi:  # NaN too
        raise RecordingError(f"{column}: {v:g} is outside what the field holds ({lo:g} to {hi:g})", line)
    return round(v) if kind is int else v


def put(values: dict[str, float | int], field_name: str, cell: str, column: str, line: int,
        factor: float = 1.0) -> None:
    """Store a cell's value under its field (not measured: nothing)."""
    v = value(cell, column, line, factor, field_name)
    if v is not None:
        values[field_name] = checked(field_name, v, column, line)


def stand_in(values: dict[str, float | int]) -> bool:
    """Where DCGM gave GRACT but neither GPUTL nor SMACT, GRACT stands in for utilization (both are
    the share of time the engine was busy); says whether it had to."""
    needed = "gpm_gr_active" in values and "sm_util" not in values and "gpm_sm_active" not in values
    if needed:
        values["sm_util"] = round(values["gpm_gr_active"])
    return needed


def index(text: str, number: int) -> int:
    """A GPU index as the recording writes it."""
    t = text.strip().strip('"')
    named = re.fullmatch(r"(?:cuda|gpu|device)\s*(?:[:#_-]\s*)?(\d+)", t, re.IGNORECASE)  # cuda:0, GPU 1
    try:
        i = int(named.group(1)) if named else int(float(t))
    except (ValueError, OverflowError):
        raise RecordingError(f"GPU index {t[:20]!r} is not a number", number) from None
    if not 0 <= i < 4096:
        raise RecordingError(f"GPU index {i} is out of range", number)
    return i


def node_name(text: str, column: str, number: int) -> str:
    """A node as a host column writes it, as Slurm names it: the short hostname ('gpu03.cluster.example'
    -> 'gpu03'; an address kept whole), characters a node name cannot hold replaced."""
    t = text.strip().strip('"')
    if not t or t.lower() in _NOT_MEASURED:
        raise RecordingError(f"{column}: no node named", number)
    short = t if t.replace(".", "").isdigit() else t.split(".")[0]
    return re.sub(r"[^A-Za-z0-9_.:-]", "-", short)[:60]
