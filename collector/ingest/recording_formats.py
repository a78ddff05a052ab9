"""Read GPU recordings people already have: `nvidia-smi --query-gpu` CSV, `nvidia-smi dmon`,
DCGM's `dcgmi dmon` and DCGM fields written as CSV, line by line (a 2 GB log is streamed), into
readings named like the agent's fields, in the agent's units.

Each format is read the way its tool writes it, whatever the columns chosen: `--query-gpu` with or
without units in the values (`nounits`), with or without a header (then `columns` names them), with a
leading index column a spreadsheet or pandas added; `dmon` with any `-s` selection and `-o D`, `T` or
`DT`, its header repeated every screen; `dcgmi dmon` with any `-e` fields, as it prints them or as
CSV (a recorder of one's own, or a Prometheus export, with an entity and a time column). Where DCGM
gave GRACT but neither GPUTL nor SMACT, GRACT stands in for utilization (`Reading.stand_in`): the
share of time the graphics/compute engine was busy, what the duty cycle measures. Values the tool marks as not
available (`[N/A]`, `-`, `N/A`) are not measured, never zero. A line that does not fit the format is a
`RecordingError` naming the line and the column.
"""

from __future__ import annotations

import codecs
import gzip
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import IO

from jobpulse.schema.fields import GPU_FIELDS

MAX_LINE = 64 * 1024
"""No recording has a line this long: a longer one is not a recording (and is never read whole)."""

FORMATS = ("query-gpu", "dmon", "dcgmi-dmon", "dcgm-csv")
UNKNOWN_START = datetime(2000, 1, 1)
"""Where a recording without times begins until it is placed (`--start`, `--recent`)."""

_BOUNDS = {f.name: (f.lo, f.upper, f.python) for f in GPU_FIELDS if f.sql not in ("boolean", "text")}


class RecordingError(ValueError):
    """A file that is not a recording of a known format, or a line that does not fit its format."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line


@dataclass(frozen=True, slots=True)
class Reading:
    """One GPU at one moment as the recording gives it; ``ts`` None where the format has no time
    column (placed by the interval: `readings` sets it)."""

    line: int
    ts: datetime | None
    gpu: int  # index in the recording
    values: dict[str, float | int]  # agent field name -> value, in the field's unit; absent = not measured
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    timed: bool = True  # the time is the file's own (else placed by the interval)
    stand_in: bool = False  # utilization is DCGM's GRACT (the recording gave no GPUTL or SMACT)


@dataclass(frozen=True)
class Column:
    """How one column of a format maps to an agent field: the field and a factor to its unit."""

    field: str
    factor: float = 1.0


# --query-gpu property names (nvidia-smi --help-query-gpu), without the unit nvidia-smi appends.
QUERY_GPU: dict[str, Column] = {
    **{k: Column("sm_util") for k in ("utilization.gpu",)},
    "utilization.memory": Column("mem_util"),
    "utilization.encoder": Column("enc_util"),
    "utilization.decoder": Column("dec_util"),
    "memory.used": Column("fb_used_mib"),
    "memory.total": Column("fb_total_mib"),
    "memory.reserved": Column("fb_reserved_mib"),
    **{k: Column("power_w") for k in ("power.draw", "power.draw.instant", "power.draw.average")},
    **{k: Column("power_limit_w") for k in ("power.limit", "enforced.power.limit")},
    "temperature.gpu": Column("gpu_temp_c"),
    "temperature.memory": Column("mem_temp_c"),
    **{k: Column("sm_clock_mhz") for k in ("clocks.sm", "clocks.current.sm")},
    **{k: Column("mem_clock_mhz") for k in ("clocks.mem", "clocks.current.memory")},
    **{k: Column("sm_clock_max_mhz") for k in ("clocks.max.sm", "clocks.max.sm_clock")},
    **{k: Column("mem_clock_max_mhz") for k in ("clocks.max.mem", "clocks.max.memory", "clocks.max.memory_clock")},
    **{k: Column("pcie_gen") for k in ("pcie.link.gen.current", "pcie.link.gen.gpucurrent")},
    **{k: Column("pcie_gen_max") for k in ("pcie.link.gen.max", "pcie.link.gen.gpumax")},
    "pcie.link.width.current": Column("pcie_width"),
    "pcie.link.width.max": Column("pcie_width_max"),
    **{k: Column("clock_event_reasons") for k in ("clocks_throttle_reasons.active", "clocks_event_reasons.active",
                                                   "clocks_throttle_reasons", "clocks_event_reasons")},
    "ecc.errors.corrected.volatile.total": Column("ecc_sbe_total"),
    "ecc.errors.uncorrected.volatile.total": Column("ecc_dbe_total"),
}
_GRAPHICS_CLOCK = ("clocks.gr", "clocks.current.graphics")  # the SM clock where the recording has no SM clock
_QUERY_IDENTITY = {"timestamp", "index", "uuid", "gpu_uuid", "name", "gpu_name", "pci.bus_id", "gpu_bus_id"}

# dmon column names (`nvidia-smi dmon --help`: -s p u c v m e t), their unit from the second header line.
DMON: dict[str, Column] = {
    "pwr": Column("power_w"), "gtemp": Column("gpu_temp_c"), "temp": Column("gpu_temp_c"), "mtemp": Column("mem_temp_c"),
    "sm": Column("sm_util"), "mem": Column("mem_util"), "enc": Column("enc_util"), "dec": Column("dec_util"),
    "jpg": Column("jpg_util"), "ofa": Column("ofa_util"),
    "mclk": Column("mem_clock_mhz"), "pclk": Column("sm_clock_mhz"),
    "fb": Column("fb_used_mib"),
    "rxpci": Column("pcie_rx_kbs", 1024), "txpci": Column("pcie_tx_kbs", 1024),  # MB/s
}

# dcgmi dmon field tags (`dcgmi dmon -l`): ratios (0-1) become percent; bytes per second KB/s.
DCGMI: dict[str, Column] = {
    "GPUTL": Column("sm_util"), "MCUTL": Column("mem_util"), "ENCUT": Column("enc_util"), "DECUT": Column("dec_util"),
    "FBUSD": Column("fb_used_mib"), "FBTTL": Column("fb_total_mib"), "FBRSV": Column("fb_reserved_mib"),
    "POWER": Column("power_w"), "PLIM": Column("power_limit_w"), "TMPTR": Column("gpu_temp_c"),
    "MMTMP": Column("mem_temp_c"), "SMCLK": Column("sm_clock_mhz"), "MMCLK": Column("mem_clock_mhz"),
    "SMACT": Column("gpm_sm_active", 100), "SMOCC": Column("gpm_sm_occupancy", 100),
    "TENSO": Column("gpm_tensor_active", 100), "DRAMA": Column("gpm_dram_bw", 100),
    "FP64A": Column("gpm_fp64_active", 100), "FP32A": Column("gpm_fp32_active", 100),
    "FP16A": Column("gpm_fp16_active", 100), "GRACT": Column("gpm_gr_active", 100),
    "PCITX": Column("pcie_tx_kbs", 1 / 1024), "PCIRX": Column("pcie_rx_kbs", 1 / 1024),
    "NVLTX": Column("nvlink_tx_kbs", 1 / 1024), "NVLRX": Column("nvlink_rx_kbs", 1 / 1024),
}

DCGM_NAMED: dict[str, Column] = {f.dcgm.name: Column(f.name, 1 / f.dcgm.scale) for f in GPU_FIELDS
                                  if f.dcgm and f.name in _BOUNDS}
"""The same fields by the names DCGM gives them (`DCGM_FI_...`, as dcgm-exporter and the DCGM API)."""
_DCGM_ENTITY = ("entityid", "entity_id", "entity", "gpu", "gpu_id", "gpuid", "index")
_DCGM_TIME = ("timestamp", "time", "ts", "datetime")

_NOT_MEASURED = {"", "-", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[gpu is lost]",
                 "[insufficient permissions]", "[gpu requires reset]", "unknown", "nan"}
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)\s*$")
_TO_MIB = {"": 1.0, "mib": 1.0, "mb": 1.0, "gib": 1024.0, "gb": 1024.0, "kib": 1 / 1024, "kb": 1 / 1024}
_TIME_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S",
                 "%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S", "%a %b %d %H:%M:%S %Y")


def open_text(path: Path) -> IO[bytes]:
    """The file's bytes as UTF-8: gunzipped where it is gzip, re-encoded where it is UTF-16 (what
    PowerShell's `>` writes)."""
    raw: IO[bytes] = path.open("rb")
    if raw.read(2) == b"\x1f\x8b":
        raw.close()
        raw = gzip.open(path, "rb")  # type: ignore[assignment]
    raw.seek(0)
    if raw.read(2) in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        raw.seek(0)
        return _Utf8(io.TextIOWrapper(raw, encoding="utf-16"))  # type: ignore[return-value]
    raw.seek(0)
    return raw


class _Utf8:
    """A UTF-16 text file read as UTF-8 bytes, line by line (bounded) or in chunks."""

    def __init__(self, text: io.TextIOWrapper) -> None:
        self.text = text

    def readline(self, size: int = -1) -> bytes:
        try:
            return self.text.readline(size).encode()
        except UnicodeDecodeError:
            return b"\xff"  # not UTF-16 after all: `lines` names the line

    def read(self, size: int = -1) -> bytes:
        return self.text.read(size).encode(errors="replace")

    def __enter__(self) -> _Utf8:
        return self

    def __exit__(self, *exc: object) -> None:
        self.text.close()


def lines(stream: IO[bytes]) -> Iterator[tuple[int, str]]:
    """Numbered text lines, bounded in length; binary data is an error naming its line."""
    number = 0
    while True:
        try:
            raw = stream.readline(MAX_LINE + 1)
        except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
            raise RecordingError(f"cannot read the file: {exc}", number + 1) from None
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE:
            raise RecordingError(f"longer than {MAX_LINE // 1024} KiB: not a recording", number)
        if b"\x00" in raw:
            raise RecordingError("binary data (a NUL byte): not a text recording", number)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RecordingError("not UTF-8 text: not a recording", number) from None
        yield number, text.lstrip("\ufeff").rstrip("\r\n") if number == 1 else text.rstrip("\r\n")


def detect(first: list[str]) -> str:
    """The format of a recording from its first non-empty lines."""
    for line in first:
        low = line.strip().lower()
        if not low:
            continue
        if low.startswith("#") and "entity" in low:
            return "dcgmi-dmon"
        if "," in low and any(_dcgm_column(c) for c in line.split(",")):
            return "dcgm-csv"
        if low.startswith("#") and {"gpu", "idx"} & set(re.split(r"[\s#]+", low)):
            return "dmon"
        if "," in low and any(name in low for name in (*QUERY_GPU, "timestamp", "index")):
            return "query-gpu"
        break
    shown = next((x.strip() for x in first if x.strip()), "")[:80]
    raise RecordingError("not a recording jobpulse knows: expected nvidia-smi --query-gpu CSV, nvidia-smi dmon, "
                         f"dcgmi dmon output or DCGM fields as CSV; the file begins {shown!r}")


def value(text: str, column: str, line: int, factor: float = 1.0) -> float | None:
    """A number without its unit (MiB, %, W, MHz; GiB and KiB converted to MiB), None where the
    tool said it was not measured; hex for bitmasks."""
    t = text.strip()
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
    unit = m.group(2).lower()
    scale = _TO_MIB.get(unit, 1.0) if unit.endswith("b") else 1.0
    return float(m.group(1)) * scale * factor


def _checked(field: str, v: float, column: str, line: int) -> float | int:
    lo, hi, kind = _BOUNDS[field]
    if not lo <= v <= hi:
        raise RecordingError(f"{column}: {v:g} is outside what the field holds ({lo:g} to {hi:g})", line)
    return round(v) if kind is int else v


def timestamp(text: str, line: int) -> datetime:
    t = text.strip()
    for fmt in _TIME_FORMATS:
        try:
            return datetime.strptime(t, fmt)
        except ValueError:
            continue
    try:
        return datetime.fromisoformat(t)
    except ValueError:
        raise RecordingError(f"timestamp: {t[:40]!r} is not a time nvidia-smi writes", line) from None


# ------------------------------------------------------------------------------------- --query-gpu


def _header_names(line: str) -> list[str]:
    """Property names of a --query-gpu header: units ("[MiB]") dropped, lower case."""
    return [re.sub(r"\s*\[.*?\]\s*$", "", c.strip()).strip().lower() for c in line.split(",")]


def _is_header(cells: list[str]) -> bool:
    return any(c in QUERY_GPU or c in _QUERY_IDENTITY for c in cells)


def query_gpu(numbered: Iterator[tuple[int, str]], columns: list[str] | None = None) -> Iterator[Reading]:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`; ``columns`` names the
    columns of a file without a header. A header repeated (logs appended to) is skipped; a leading
    column with no name (a spreadsheet's or pandas' row index) is dropped."""
    names = [c.strip().lower() for c in columns] if columns else None
    drop_first = False
    bus_ids: dict[str, int] = {}  # without an index column: GPUs numbered as first seen
    for number, text in numbered:
        if not text.strip():
            continue
        cells = [c.strip() for c in text.split(",")]
        header = _header_names(text)
        if _is_header(header):
            drop_first = header[0] in ("", "unnamed: 0") and not columns
            if names is None or not columns:
                names = header[1:] if drop_first else header
            continue
        if names is None:
            raise RecordingError("a CSV without a header: name its columns (--columns timestamp,index,...)", number)
        if drop_first:
            cells = cells[1:]
        if len(cells) != len(names):
            raise RecordingError(f"{len(cells)} columns where the header has {len(names)} (a truncated or "
                                 "mixed line)", number)
        yield _query_reading(dict(zip(names, cells, strict=True)), number, bus_ids)


def _query_reading(row: dict[str, str], number: int, bus_ids: dict[str, int]) -> Reading:
    values: dict[str, float | int] = {}
    for name, cell in row.items():
        col = QUERY_GPU.get(name) or (QUERY_GPU["clocks.sm"] if name in _GRAPHICS_CLOCK else None)
        if col is None or (name in _GRAPHICS_CLOCK and "sm_clock_mhz" in values):
            continue
        v = value(cell, name, number, col.factor)
        if v is not None:
            values[col.field] = _checked(col.field, v, name, number)
    index = row.get("index")
    if index is not None:
        gpu = _index(index, number)
    else:  # told apart by bus id or UUID
        key = row.get("pci.bus_id") or row.get("uuid") or row.get("gpu_bus_id") or row.get("gpu_uuid") or ""
        gpu = bus_ids.setdefault(key, len(bus_ids))
    ts = row.get("timestamp")
    return Reading(number, timestamp(ts, number) if ts else None, gpu, values,
                   uuid=row.get("uuid") or row.get("gpu_uuid") or None, model=row.get("name") or row.get("gpu_name") or None,
                   pci_bus_id=row.get("pci.bus_id") or row.get("gpu_bus_id") or None)


def _index(text: str, number: int) -> int:
    try:
        i = int(text.strip())
    except ValueError:
        raise RecordingError(f"GPU index {text.strip()[:20]!r} is not a number", number) from None
    if not 0 <= i < 4096:
        raise RecordingError(f"GPU index {i} is out of range", number)
    return i


# ------------------------------------------------------------------------------------------- dmon


def dmon(numbered: Iterator[tuple[int, str]]) -> Iterator[Reading]:
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
            else:
                units = [c.lower() for c in cells]
            continue
        if names is None:
            raise RecordingError("dmon rows before its header line ('# gpu ...')", number)
        cells = text.split()
        if len(cells) != len(names):
            raise RecordingError(f"{len(cells)} values where the header has {len(names)} columns", number)
        row = dict(zip(names, cells, strict=True))
        unit_of = dict(zip(names, units, strict=False))
        values: dict[str, float | int] = {}
        for name, cell in row.items():
            col = DMON.get(name)
            if col is None:
                continue
            factor = col.factor * (_TO_MIB.get(unit_of.get(name, ""), 1.0) if col.field == "fb_used_mib" else 1.0)
            v = value(cell, name, number, factor)
            if v is not None:
                values[col.field] = _checked(col.field, v, name, number)
        if "gpu" not in row:
            raise RecordingError("no gpu column in the dmon header", number)
        yield Reading(number, _dmon_time(row, number), _index(row["gpu"], number), values)


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
    return datetime.combine(d, t)


# ------------------------------------------------------------------------------------ dcgmi dmon


def dcgmi_dmon(numbered: Iterator[tuple[int, str]]) -> Iterator[Reading]:
    """`dcgmi dmon -e ...`: a '#Entity' line of field tags, an 'ID' line, rows 'GPU 0 v v ...'.
    Rows of other entities (MIG instances: GPU-I, GPU-CI; NvSwitches) are not GPUs: skipped."""
    tags: list[str] | None = None
    for number, text in numbered:
        cells = text.split()
        if not cells:
            continue
        if cells[0].startswith("#"):
            tags = [c.upper() for c in text.lstrip("# \t").split()[1:]]  # after "Entity"
            continue
        if cells[0].upper() == "ID" or set(text.strip()) <= {"-", " "}:
            continue
        if tags is None:
            raise RecordingError("dcgmi dmon rows before its '#Entity' header line", number)
        if cells[0].upper() != "GPU":
            continue
        if len(cells) != len(tags) + 2:
            raise RecordingError(f"{len(cells) - 2} values where the header has {len(tags)} fields", number)
        values, stand_in = _dcgm_values(((tag, DCGMI[tag], cell) for tag, cell in zip(tags, cells[2:], strict=True)
                                         if tag in DCGMI), number)
        yield Reading(number, None, _index(cells[1], number), values, stand_in=stand_in)


def _dcgm_column(name: str) -> Column | None:
    """A column named by its dcgmi tag (GRACT) or its DCGM name (DCGM_FI_PROF_GR_ENGINE_ACTIVE)."""
    n = name.strip().upper()
    return DCGMI.get(n) or DCGM_NAMED.get(n)


def _dcgm_values(cells: Iterator[tuple[str, Column, str]], number: int) -> tuple[dict[str, float | int], bool]:
    """A row's (name, column, text) in the agent's fields and units, and whether GRACT had to stand in
    for utilization."""
    values: dict[str, float | int] = {}
    for name, col, cell in cells:
        v = value(cell, name, number, col.factor)
        if v is not None:
            values[col.field] = _checked(col.field, v, name, number)
    stand_in = "gpm_gr_active" in values and "sm_util" not in values and "gpm_sm_active" not in values
    if stand_in:
        values["sm_util"] = round(values["gpm_gr_active"])
    return values, stand_in


def dcgm_csv(numbered: Iterator[tuple[int, str]]) -> Iterator[Reading]:
    """DCGM fields as CSV: a header naming them by tag (GRACT, FBUSD) or DCGM name, an entity column
    (EntityId, GPU; none: one GPU) and a time column (Unix seconds, milli- or microseconds as DCGM
    stamps them, or a date and time); other columns (a spreadsheet's or pandas' row index) are left out."""
    names: list[str] | None = None
    cols: dict[str, Column] = {}
    entity = clock = None
    for number, text in numbered:
        if not text.strip():
            continue
        cells = [c.strip() for c in text.split(",")]
        if any(_dcgm_column(c) for c in cells):  # a header, or one repeated where files were appended
            names = [c.upper() if _dcgm_column(c) else c.lower() for c in cells]
            cols = {n: col for n in names if (col := _dcgm_column(n))}
            entity = next((c for c in _DCGM_ENTITY if c in names), None)  # EntityId before a row "index"
            clock = next((c for c in names if c in _DCGM_TIME), None)
            continue
        if names is None:
            raise RecordingError("DCGM CSV rows before its header line", number)
        if len(cells) != len(names):
            raise RecordingError(f"{len(cells)} columns where the header has {len(names)} (a truncated or mixed "
                                 "line)", number)
        row = dict(zip(names, cells, strict=True))
        values, stand_in = _dcgm_values(((n, col, row[n]) for n, col in cols.items()), number)
        yield Reading(number, _dcgm_time(row[clock], number) if clock else None,
                      _index(row[entity], number) if entity else 0, values, stand_in=stand_in)


def _dcgm_time(text: str, number: int) -> datetime:
    """Unix time in seconds, ms or us (UTC, returned aware), or a date and time as the file gives it."""
    try:
        t = float(text)
    except ValueError:
        return timestamp(text, number)
    for scale in (1.0, 1e3, 1e6):
        if t / scale < 1e10:  # before the year 2286 in this unit
            try:
                return datetime.fromtimestamp(t / scale, UTC)
            except (OverflowError, OSError, ValueError):
                break
    raise RecordingError(f"timestamp: {text[:40]!r} is not a Unix time", number)


def format_of(path: Path, columns: list[str] | None = None) -> str:
    """A recording's format from its first non-empty line (a headerless CSV: named ``columns``)."""
    if columns:
        return "query-gpu"
    with open_text(path) as stream:
        for _, text in lines(stream):
            if text.strip():
                return detect([text])
    raise RecordingError("the file is empty")


PARSERS: dict[str, Callable[[Iterator[tuple[int, str]]], Iterator[Reading]]] = {
    "query-gpu": query_gpu, "dmon": dmon, "dcgmi-dmon": dcgmi_dmon, "dcgm-csv": dcgm_csv}


def readings(path: Path, fmt: str | None = None, columns: list[str] | None = None,
             start: datetime | None = None, interval: timedelta | None = None) -> Iterator[Reading]:
    """Every reading of a recording, streamed, each with a naive time: the file's own where it has
    one (a dmon time of day placed on ``start``'s day, rolling over midnight), else ``start`` plus
    one ``interval`` per round of GPUs (a round ends where a GPU index repeats; dmon's and dcgmi's
    default interval is a second), from 2000-01-01 where ``start`` is not known."""
    fmt = fmt or format_of(path, columns)
    interval = interval or (timedelta(seconds=1) if fmt in ("dmon", "dcgmi-dmon") else None)
    with open_text(path) as stream:
        numbered = lines(stream)
        parse = (lambda n: query_gpu(n, columns)) if fmt == "query-gpu" else PARSERS[fmt]
        rounds, seen, day_shift, last = -1, set[int](), timedelta(0), None
        for r in parse(numbered):
            if r.gpu in seen or rounds < 0:
                rounds, seen = rounds + 1, set()
            seen.add(r.gpu)
            ts = r.ts
            if ts is None:
                if interval is None:
                    raise RecordingError(f"the {fmt} recording has no time column: say its interval (--interval "
                                         "SECONDS, as given to nvidia-smi -l)", r.line)
                ts = (start or UNKNOWN_START) + rounds * interval
            elif ts.year == 1900:  # a dmon time of day
                if start is None:
                    raise RecordingError("dmon -o T gives no date: say the day it began (--start)", r.line)
                ts = datetime.combine(start.date(), ts.time()) + day_shift
                if last is not None and ts < last - timedelta(hours=1):
                    day_shift += timedelta(days=1)
                    ts += timedelta(days=1)
            last = ts
            yield Reading(r.line, ts, r.gpu, r.values, r.uuid, r.model, r.pci_bus_id, timed=r.ts is not None,
                          stand_in=r.stand_in)

