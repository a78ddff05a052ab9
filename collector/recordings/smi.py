"""nvidia-smi's own reports repeated over time: the default table (`nvidia-smi -l N`, `watch
nvidia-smi`, on Linux, Windows and WSL; nvitop's `nvitop -1` prints the same table with box-drawing
borders), `nvidia-smi -q` text and `nvidia-smi -q -x` XML. Each
report is a block: its time (the date line, `Timestamp`, `<timestamp>`) and one reading per GPU, in
the order the report lists them (that order is the index).

The -q and XML keys go through the one alias table as "section/key" paths (`Utilization/GPU`,
`fb_memory_usage/used`). A block that does not fit is one `Skip`; an XML report is parsed with the
standard library's expat (no external entities, bounded in size).
"""

from __future__ import annotations

import contextlib
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from datetime import datetime

from jobpulse.collector.recordings.faults import RecordingError, Skip
from jobpulse.collector.recordings.times import Clock, parse_time
from jobpulse.collector.recordings.values import Mapping, Reading, put
from jobpulse.schema import field_aliases as fa

MAX_XML = 4 << 20
"""The largest `nvidia-smi -q -x` report read (8 GPUs with processes: about 100 KiB)."""
_DATE_LINE = re.compile(r"([A-Z][a-z]{2} +[A-Z][a-z]{2} +\d{1,2} +\d\d:\d\d:\d\d +\d{4})")
_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d")
_DISPLAY_MODES = ("On", "Off", "WDDM", "TCC")
# A number starts where no digit stands before it: one try per run of digits, not one per digit.
_POWER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)W\s*/\s*(\d+(?:\.\d+)?)W")
_MEMORY = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?\s*[KMG]iB)\s*/\s*(\d+(?:\.\d+)?\s*[KMG]iB)")  # nvitop: 9.31MiB / 32.00GiB
_BOX = str.maketrans("│╒╕╘╛╞╡├┤╪┼┬┴╤╧═─", "|++++++++++++++=-")
"""nvitop's borders as nvidia-smi's."""
_TEMP = re.compile(r"(?<!\S)(\d+)C(?!\S)")
_UTIL = re.compile(r"^\s*(\d+)%")


def gpu_line(text: str) -> tuple[int, str, str | None] | None:
    """A table's GPU name line ('|   0  NVIDIA A100-SXM4-40GB   On  | 00000000:07:00.0 Off |') as its
    index, name and bus id, read by its cells and words: no pattern that a hostile line could make
    backtrack."""
    cells = text.split("|")
    if len(cells) < 3 or cells[0] or not cells[1][:1].isspace():
        return None
    words = cells[1].split()
    if len(words) < 3 or not (words[0].isascii() and words[0].isdigit()) or words[-1] not in _DISPLAY_MODES:
        return None
    bus = _BUS_ID.match(cells[2].lstrip())
    return int(words[0]), " ".join(words[1:-1]), bus.group(0) if bus else None


def table_reports(numbered: Iterable[tuple[int, str]], mapping: Mapping) -> Iterator[Reading | Skip]:
    """`nvidia-smi` (the default table) printed again and again: a date line, then per GPU a name
    line and a figures line (fan, temperature, perf, power / cap | memory used / total | util)."""
    mapping.columns.update({"Pwr:Usage": "power_w", "Pwr:Cap": "power_limit_w", "Memory-Usage (used)": "fb_used_mib",
                            "Memory-Usage (total)": "fb_total_mib", "GPU-Util": "sm_util", "Temp": "gpu_temp_c"})
    ts: datetime | None = None
    clock = Clock()
    gpu: tuple[int, str, str | None, int] | None = None  # index, name, bus id, line
    for number, text in numbered:
        text = text.translate(_BOX)
        if not text.startswith(("|", "+")):
            m = _DATE_LINE.search(text)
            if m:
                try:
                    ts = parse_time(m.group(1), number, clock)
                except RecordingError as exc:
                    yield Skip(number, "malformed", exc.reason, text)
            elif text.strip():  # `date` in a loop before each report ("Fri 21 Nov 2025 11:41:31 PM EST")
                with contextlib.suppress(RecordingError):
                    ts = parse_time(text.strip(), number, clock)
            continue
        if found := gpu_line(text):
            gpu = (*found, number)
            continue
        if gpu is None:
            continue
        index, name, bus, _ = gpu
        gpu = None
        cells = text.strip("|").split("|")
        if len(cells) < 3:
            yield Skip(number, "malformed", "a GPU's figures line cut short", text)
            continue
        values: dict[str, float | int] = {}
        try:
            if p := _POWER.search(cells[0]):
                put(values, "power_w", p.group(1), "Pwr:Usage", number)
                put(values, "power_limit_w", p.group(2), "Pwr:Cap", number)
            if t := _TEMP.search(cells[0]):
                put(values, "gpu_temp_c", t.group(1), "Temp", number)
            if mem := _MEMORY.search(cells[1]):
                put(values, "fb_used_mib", mem.group(1), "Memory-Usage", number)
                put(values, "fb_total_mib", mem.group(2), "Memory-Usage", number)
            if u := _UTIL.match(cells[2]):
                put(values, "sm_util", u.group(1), "GPU-Util", number)
        except RecordingError as exc:
            yield Skip(number, "malformed", exc.reason, text)
            continue
        if not values:
            yield Skip(number, "malformed", "a GPU's figures line with no figures", text)
            continue
        yield Reading(number, ts, index, values, model=name, pci_bus_id=bus)


def _gpu_values(pairs: Iterable[tuple[str, str]], line: int, mapping: Mapping,
                ) -> tuple[dict[str, float | int], str | None, str | None]:
    """A GPU's (section/key, text) pairs of a -q report as values, UUID and model."""
    values: dict[str, float | int] = {}
    uuid = model = None
    for path, text in pairs:
        found = fa.lookup(path)
        mapping.note(path, found[0].field if found else None)
        if found is None:
            continue
        alias = found[0]
        if alias.field == fa.UUID:
            uuid = text.strip()
        elif alias.field == fa.MODEL:
            model = text.strip()
        elif alias.field not in fa.IDENTITY and alias.field not in values:
            put(values, alias.field, text, path, line, alias.factor)
    return values, uuid, model


def query_reports(numbered: Iterable[tuple[int, str]], mapping: Mapping) -> Iterator[Reading | Skip]:
    """`nvidia-smi -q` repeated (`-l N`): '==NVSMI LOG==' blocks; 'Timestamp : ...'; per GPU a
    'GPU 00000000:3B:00.0' line and its indented sections ('    Utilization' / '        GPU : 87 %')."""
    ts: datetime | None = None
    clock = Clock()
    gpus: list[tuple[str, int, list[tuple[str, str]]]] = []  # bus id, line, pairs

    def flush() -> Iterator[Reading | Skip]:
        for i, (bus, line, pairs) in enumerate(gpus):
            try:
                values, uuid, model = _gpu_values(pairs, line, mapping)
            except RecordingError as exc:
                yield Skip(line, "malformed", exc.reason, f"GPU {bus}")
                continue
            yield Reading(line, ts, i, values, uuid, model, bus)
        gpus.clear()

    sections: list[tuple[int, str]] = []  # (indent, name) of the open sections
    for number, text in numbered:
        if "NVSMI LOG" in text:
            yield from flush()
            continue
        stripped = text.strip()
        if not stripped:
            continue
        if text.startswith("GPU ") and ":" in stripped[4:]:
            gpus.append((stripped[4:], number, []))
            sections = []
            continue
        key, sep, rest = stripped.partition(" : ") if " : " in stripped else stripped.partition(":")
        key = key.strip()
        if key == "Timestamp" and not gpus:
            try:
                ts = parse_time(rest, number, clock)
            except RecordingError as exc:
                yield Skip(number, "malformed", exc.reason, text)
            continue
        if not gpus:
            continue
        indent = len(text) - len(text.lstrip())
        while sections and sections[-1][0] >= indent:
            sections.pop()
        if not sep or not rest.strip():
            sections.append((indent, key))
            continue
        path = f"{sections[-1][1]}/{key}" if sections else key
        if len(sections) <= 1:
            gpus[-1][2].append((path, rest.strip()))
    yield from flush()


def xml_reports(numbered: Iterable[tuple[int, str]], mapping: Mapping) -> Iterator[Reading | Skip]:
    """`nvidia-smi -q -x` repeated: one <nvidia_smi_log> document after another."""
    doc: list[str] = []
    first = size = 0
    clock = Clock()
    for number, text in numbered:
        if "<nvidia_smi_log" in text:
            doc, first, size = [text[text.index("<nvidia_smi_log"):]], number, 0
            if "</nvidia_smi_log>" not in text:
                continue
        elif doc:
            doc.append(text)
            size += len(text)
            if size > MAX_XML:
                yield Skip(first, "malformed", f"a report over {MAX_XML >> 20} MiB", doc[0])
                doc = []
                continue
            if "</nvidia_smi_log>" not in text:
                continue
        else:
            continue
        body, doc = "\n".join(doc), []
        try:
            root = ET.fromstring(body[:body.index("</nvidia_smi_log>") + len("</nvidia_smi_log>")])
        except ET.ParseError as exc:
            yield Skip(first, "malformed", f"not an nvidia-smi XML report ({exc})", body.splitlines()[0])
            continue
        try:
            ts = parse_time(root.findtext("timestamp") or "", first, clock)
        except RecordingError as exc:
            yield Skip(first, "malformed", exc.reason, body.splitlines()[0])
            continue
        for i, gpu in enumerate(root.iter("gpu")):
            pairs = [(f"{section.tag}/{leaf.tag}" if leaf is not section else section.tag, leaf.text or "")
                     for section in gpu for leaf in (section.iter() if len(section) else (section,))
                     if not len(leaf)]
            try:
                values, uuid, model = _gpu_values(pairs, first, mapping)
            except RecordingError as exc:
                yield Skip(first, "malformed", exc.reason, f"<gpu id={gpu.get('id')}>")
                continue
            yield Reading(first, ts, i, values, uuid, model, gpu.get("id"))
    if doc:
        yield Skip(first, "malformed", "an XML report cut short", doc[0])
