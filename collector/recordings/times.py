"""Times as people write them in GPU logs: Unix epoch in seconds, ms, µs or ns (integer or float),
ISO 8601 with or without a zone, nvidia-smi's own (`2024/05/01 09:00:00.123`, `Wed May  1 09:00:00
2024`), `date`'s default, a time of day (dmon -o T), and seconds since the start (which need the
start: never read as 1970).

A column's form is decided by its first value and kept (a later value in another form is a bad line,
not a new rule). Naive times come back naive (`--tz` places them); epoch times come back in UTC.
A time outside 1990-2200 is no GPU's: a bad line, never a time that would overflow a date.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial

from jobpulse.collector.recordings.faults import RecordingError, Refused

EARLIEST, LATEST = datetime(1990, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)
TIME_OF_DAY = datetime(1900, 1, 1)
"""The day a time of day without a date is returned on; `readings` places it on the start's day."""
_MAX_ELAPSED = timedelta(days=3650).total_seconds()
_EPOCH_UNITS = ((1e17, 1e9, "ns"), (1e14, 1e6, "µs"), (1e11, 1e3, "ms"), (3e8, 1.0, "s"))
"""Magnitude -> divisor: an epoch time in ns, µs, ms or s (s from 1979 on); smaller numbers are
seconds since the start."""
_TEXT_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%a %b %d %H:%M:%S %Y", "%a %d %b %Y %I:%M:%S %p",
                 "%a %d %b %Y %H:%M:%S", "%a %b %d %I:%M:%S %p %Y", "%Y%m%d %H:%M:%S", "%d.%m.%Y %H:%M:%S",
                 "%d-%m-%Y %H:%M:%S.%f", "%d-%m-%Y %H:%M:%S",
                 "%m/%d/%Y %H:%M:%S", "%m/%d/%Y %I:%M:%S %p", "%H:%M:%S.%f", "%H:%M:%S")
_ZONE_NAME = re.compile(r"(?<!\s)\s+[A-Z]{2,5}(?=\s+\d{4}$|$)")  # `date`'s "EST", "CEST": --tz says which
_FRACTION = re.compile(r"[.,](\d{7,})")  # ns digits: fromisoformat takes six


class Clock:
    """Reads one time column: ``elapsed`` for a column named as seconds since the start; ``start``
    (naive, the recording's zone) places those."""

    def __init__(self, start: datetime | None = None, elapsed: bool = False) -> None:
        self.start = start
        self.elapsed = elapsed
        self.form: str | None = None  # "epoch s", "elapsed", "iso", or a strptime format
        self.zoned: bool | None = None  # the column's first time had a zone: so must every other
        self._read: Callable[[str], datetime] | None = None

    def read(self, text: str, line: int) -> datetime:
        t = text.strip().strip('"')
        if self._read is None:
            self._read = self._decide(t, line)
        try:
            ts = self._read(t)
        except (ValueError, OverflowError, OSError):  # OSError: a Unix time beyond the C library's
            raise RecordingError(f"time {t[:40]!r} is not in the column's form ({self.form})", line) from None
        if self.zoned is None:
            self.zoned = ts.tzinfo is not None
        elif self.zoned != (ts.tzinfo is not None):
            raise RecordingError(f"time {t[:40]!r} {'lacks' if self.zoned else 'has'} a zone where the column's first "
                                 f"time {'had' if self.zoned else 'had none'}", line)
        aware = ts if ts.tzinfo else ts.replace(tzinfo=UTC)
        if ts != TIME_OF_DAY and ts.year != 1900 and not EARLIEST <= aware < LATEST:
            raise RecordingError(f"time {t[:40]!r} is year {ts.year}: not a time a GPU was recorded", line)
        return ts

    def forget_form(self) -> None:
        """Decide the form again at the next time (a block format's date lines, read one by one)."""
        self.form, self._read = None, None

    def _decide(self, t: str, line: int) -> Callable[[str], datetime]:
        try:
            number = float(t)
        except ValueError:
            return self._text_form(t, line)
        if not self.elapsed:
            for floor, divisor, unit in _EPOCH_UNITS:
                if number >= floor:
                    self.form = f"Unix time in {unit}"
                    return partial(_epoch, divisor=divisor)
        if self.start is None:
            raise Refused(f"times are seconds from the start ({t[:20]}, not a date): say when it began with "
                          "--start TIME", line)
        self.form = "seconds from the start"
        return partial(_since, start=self.start)

    def _text_form(self, t: str, line: int) -> Callable[[str], datetime]:
        try:
            _iso(t)
            self.form = "nvidia-smi's YYYY/MM/DD hh:mm:ss" if t[4:5] == "/" else "ISO 8601"
            return _iso
        except ValueError:
            pass
        bare = _ZONE_NAME.sub("", t)
        for fmt in _TEXT_FORMATS:
            try:
                datetime.strptime(bare, fmt)
            except ValueError:
                continue
            self.form = fmt
            return partial(_strptime, fmt=fmt)  # a time of day: on 1900-01-01
        raise RecordingError(f"time {t[:40]!r} is not a time jobpulse reads (Unix time, ISO 8601, nvidia-smi's "
                             "2024/05/01 09:00:00.000, or seconds from --start)", line)


def _iso(t: str) -> datetime:
    """ISO 8601 and its near relatives: '/' in the date (nvidia-smi), ',' before the fraction, ns."""
    t = _FRACTION.sub(lambda m: "." + m.group(1)[:6], t)
    if len(t) >= 10 and t[4] == "/" and t[7] == "/":
        t = t[:4] + "-" + t[5:7] + "-" + t[8:]
    if t.endswith(("Z", "z")):
        t = t[:-1] + "+00:00"
    if len(t) < 16 or t[4] != "-":  # not a date and a time: "2024" or a number
        raise ValueError(t)
    return datetime.fromisoformat(t)


def _epoch(text: str, divisor: float) -> datetime:
    return datetime.fromtimestamp(float(text) / divisor, UTC)


def _since(text: str, start: datetime) -> datetime:
    seconds = float(text)
    if not 0 <= seconds <= _MAX_ELAPSED:
        raise ValueError(seconds)
    return start + timedelta(seconds=seconds)


def _strptime(text: str, fmt: str) -> datetime:
    return datetime.strptime(_ZONE_NAME.sub("", text), fmt)


def parse_time(text: str, line: int, clock: Clock | None = None) -> datetime:
    """One time in any form jobpulse reads (a block format's 'Timestamp : ...' line); ``clock``
    keeps a file's times of one kind (all with a zone, or all without)."""
    clock = clock or Clock()
    clock.forget_form()  # each report's date line is read afresh, its zone kept alike
    return clock.read(text, line)
