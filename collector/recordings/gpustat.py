"""gpustat's plain-text output repeated over time (`gpustat -i N > log`, `while :; do gpustat; sleep
60; done >> log`, `watch gpustat` captured): per snapshot a host line (host name, the time as
gpustat's `%c` writes it, the driver version), then one line per GPU:

    compute3                          Mon Dec 19 18:33:32 2022  465.19.01
    [0] NVIDIA GeForce RTX 2070 SUPER | 60'C,  68 % |  3712 /  7982 MB | root(3709M)

with the options' extra figures in gpustat's own order: `-F` a fan speed before the utilization,
`-e` the encoder and decoder in brackets after it, `-P` power draw / limit in W
(`34°C,  31 %,   1 % (E:   0 %  D:   0 %),   70 / 215 W`). gpustat's MB are MiB; `??` is not
measured. Each figure is named by gpustat's JSON key (`utilization.gpu`, `memory.used`, ...) and
goes through the one alias table. Colours and the screen control of `-i`/`--watch` (ANSI escapes)
are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime

from jobpulse.collector.recordings.faults import RecordingError, Skip
from jobpulse.collector.recordings.times import Clock, parse_time
from jobpulse.collector.recordings.values import Mapping, Reading, index, put
from jobpulse.schema import field_aliases as fa

GPU_LINE = re.compile(r"^\[(\d+)\]\s([^|]*)\|(.*)$")
"""A GPU's line: '[index] name | figures | memory | processes' (the name: group 2, stripped)."""
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[A-Za-z]|[()][A-Za-z0-9]|[=>])")
_DATE = re.compile(r"[A-Z][a-z]{2} +[A-Z][a-z]{2} +\d{1,2} +\d\d:\d\d:\d\d +\d{4}")  # %c in the C locale
_TEMP = re.compile(r"^\s*(\S{1,16}?)\s*(?:°|'|º)?C\s*$")
_PERCENT = re.compile(r"^\s*([^\s%]{1,16})\s*%\s*(?:\((.*)\)\s*)?$")
_CODEC = re.compile(r"([ED]):\s*([^\s%]{1,16})\s*%")
_WATTS = re.compile(r"^\s*([^\s/]{1,16})\s*(?:/\s*([^\s/]{1,16})\s*)?W\s*$")
_MIB = re.compile(r"^\s*([^\s/]{1,16})\s*/\s*([^\s/]{1,16})\s*MB\s*$")
_MEMORY = re.compile(r"\|\s*[^\s/|]{1,16}\s*/\s*[^\s/|]{1,16}\s*MB\b")
# A figure is a few characters: bounded tokens, and no two quantifiers that can take the same characters
# side by side, keep a hostile 64 KiB line linear to match (tests/unit/test_patterns.py).
_UNKNOWN = ("??", "?")


def is_gpustat(first: list[str]) -> bool:
    """gpustat's text: a GPU line ('[0] name | ... | used / total MB |') among the first lines."""
    return any(GPU_LINE.match(_ANSI.sub("", x)) and _MEMORY.search(x) for x in first)


def _put(values: dict[str, float | int], key: str, cell: str, number: int, mapping: Mapping) -> None:
    """A figure under gpustat's JSON key, through the alias table (unknown: nothing)."""
    found = fa.lookup(key)
    mapping.note(key, found[0].field if found else None)
    if found is None or cell.strip() in _UNKNOWN:
        return
    put(values, found[0].field, cell, key, number, found[0].factor)


def _figures(cells: list[str], number: int, mapping: Mapping) -> dict[str, float | int]:
    """The figures of a GPU line: temperature, [fan,] utilization [(E: D:)] [, power] | memory."""
    values: dict[str, float | int] = {}
    parts = [p for p in cells[0].split(",") if p.strip()]
    if not parts or not (t := _TEMP.match(parts[0])):
        raise RecordingError(f"{cells[0].strip()[:30]!r} does not begin with a temperature", number)
    _put(values, "temperature.gpu", t.group(1), number, mapping)
    percents = [(i, m) for i, p in enumerate(parts[1:], 1) if (m := _PERCENT.match(p))]
    if not percents:
        raise RecordingError(f"{cells[0].strip()[:40]!r} has no utilization", number)
    if len(percents) > 1:
        _put(values, "fan.speed", percents[0][1].group(1), number, mapping)
    last, util = percents[-1]
    _put(values, "utilization.gpu", util.group(1), number, mapping)
    for which, cell in _CODEC.findall(util.group(2) or ""):
        _put(values, "utilization.enc" if which == "E" else "utilization.dec", cell, number, mapping)
    for p in parts[last + 1:]:
        if w := _WATTS.match(p):
            _put(values, "power.draw", w.group(1), number, mapping)
            if w.group(2):
                _put(values, "enforced.power.limit", w.group(2), number, mapping)
    if len(cells) < 2 or not (m := _MIB.match(cells[1])):
        raise RecordingError("no 'used / total MB' memory figures", number)
    _put(values, "memory.used", m.group(1), number, mapping)
    _put(values, "memory.total", m.group(2), number, mapping)
    return values


def _snapshot_time(text: str, number: int, clock: Clock) -> datetime | None:
    """The time of a host line ('host  Mon Dec 19 18:33:32 2022  465.19.01'); None if it has none."""
    if m := _DATE.search(text):
        return parse_time(m.group(0), number, clock)
    words = text.split()
    for lo, hi in ((1, len(words) - 1), (1, len(words)), (0, len(words))):  # host, time, driver
        candidate = " ".join(words[lo:hi])
        if candidate and any(c.isdigit() for c in candidate):
            try:
                found = parse_time(candidate, number, clock)
            except RecordingError:
                continue
            if found.year != 1900:  # a date, not a stray time of day
                return found
    return None


def reports(numbered: Iterable[tuple[int, str]], mapping: Mapping) -> Iterator[Reading | Skip]:
    """Every GPU line of every snapshot, at its host line's time."""
    ts: datetime | None = None
    timed = after_gpu = False
    clock = Clock()
    for number, raw in numbered:
        text = _ANSI.sub("", raw).rstrip()
        if not text.strip():
            continue
        g = GPU_LINE.match(text.lstrip())
        if g is None:
            try:
                found = _snapshot_time(text, number, clock)
            except RecordingError as exc:
                found = None
                yield Skip(number, "malformed", exc.reason, raw)
            if found is not None:
                ts, timed = found, True
            elif timed and after_gpu:  # the next snapshot's host line, its time unread: not the last one's
                ts = None
            after_gpu = False
            continue
        after_gpu = True
        if timed and ts is None:
            yield Skip(number, "malformed", "its snapshot's host line has no time jobpulse reads", raw)
            continue
        try:
            gpu = index(g.group(1), number)
            values = _figures(g.group(3).split("|"), number, mapping)
        except RecordingError as exc:
            yield Skip(number, "malformed", exc.reason, raw)
            continue
        yield Reading(number, ts, gpu, values, model=g.group(2).strip() or None)
