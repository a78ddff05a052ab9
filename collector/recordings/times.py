"""Times as people write them in GPU logs: Unix epoch in seconds, ms, µs or ns (integer or float),
ISO 8601 with or without a zone, nvidia-smi's own (`2024/05/01 09:00:00.123`, `Wed May  1 09:00:00
2024`), `date`'s default, a time of day (dmon -o T), and seconds since the start (which need the
start: never read as 1970).

A column's form is decided by its first value and kept (a later value in another form is a bad line,
not a new rule), or named (`--time-format`, a strftime form). A date whose day and month could be
either way round (`03-11-2026`) is read day first with dashes or dots and month first with slashes,
until a value says otherwise: a first field above 12 in a month-first form, or a second one in a
day-first form, where every value before could have been read that way too, means the file is
read again in the other form (`TimeForm`). Naive times come back naive (`--tz` places them); epoch
times come back in UTC.
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
_EITHER_WAY = {"%d.%m.%Y %H:%M:%S": "%m.%d.%Y %H:%M:%S", "%d-%m-%Y %H:%M:%S.%f": "%m-%d-%Y %H:%M:%S.%f",
               "%d-%m-%Y %H:%M:%S": "%m-%d-%Y %H:%M:%S", "%m/%d/%Y %H:%M:%S.%f": "%d/%m/%Y %H:%M:%S.%f",
               "%m/%d/%Y %H:%M:%S": "%d/%m/%Y %H:%M:%S", "%m/%d/%Y %I:%M:%S %p": "%d/%m/%Y %I:%M:%S %p"}
"""A date read one way round -> the other way (day first with dots and dashes, month first with slashes,
as they are written where those separators are usual)."""
_EITHER_WAY |= {other: first for first, other in _EITHER_WAY.items()}
_TEXT_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%a %b %d %H:%M:%S %Y", "%a %d %b %Y %I:%M:%S %p",
                 "%a %d %b %Y %H:%M:%S", "%a %b %d %I:%M:%S %p %Y", "%Y%m%d %H:%M:%S", "%Y%m%d %H:%M", "%d.%m.%Y %H:%M:%S",
                 "%m.%d.%Y %H:%M:%S", "%d-%m-%Y %H:%M:%S.%f", "%d-%m-%Y %H:%M:%S", "%m-%d-%Y %H:%M:%S.%f",
                 "%m-%d-%Y %H:%M:%S", "%m/%d/%Y %H:%M:%S.%f", "%m/%d/%Y %H:%M:%S", "%m/%d/%Y %I:%M:%S %p",
                 "%d/%m/%Y %H:%M:%S.%f", "%d/%m/%Y %H:%M:%S", "%d/%m/%Y %I:%M:%S %p", "%H:%M:%S.%f", "%H:%M:%S")
_ZONE_NAME = re.compile(r"(?<!\s)\s+[A-Z]{2,5}(?=\s+\d{4}$|$)")  # `date`'s "EST", "CEST": --tz says which
_FRACTION = re.compile(r"[.,](\d{7,})")  # ns digits: fromisoformat takes six


class TimeForm(Exception):  # not an error: the file is read again in this form
    """The dates were read the wrong way round: a value fits only ``form``, as every one before did."""

    def __init__(self, form: str) -> None:
        super().__init__(form)
        self.form = form


class Clock:
    """Reads one time column: ``elapsed`` for a column named as seconds since the start; ``start``
    (naive, the recording's zone) places those; ``form`` (a strftime form) names the column's form."""

    def __init__(self, start: datetime | None = None, elapsed: bool = False, form: str | None = None) -> None:
        self.start = start
        self.elapsed = elapsed
        self.form: str | None = form  # "epoch s", "elapsed", "iso", or a strptime format
        self.named = form is not None  # by --time-format: kept whatever the values say
        self.either_way: str | None = None  # the other way round, while no value has ruled it out
        self.zoned: bool | None = None  # the column's first time had a zone: so must every other
        self._read: Callable[[str], datetime] | None = partial(_named, fmt=form) if form else None

    @property
    def described(self) -> str | None:
        """The form as `--dry-run` says it; a date no value told the way round of says so."""
        if self.either_way is None or self.form is None:
            return self.form
        first = "day" if self.form.index("%d") < self.form.index("%m") else "month"
        return (f"{self.form} ({first} first: no value says which way round; --time-format "
                f"'{self.either_way}' reads it the other way)")

    def read(self, text: str, line: int) -> datetime:
        t = text.strip().strip('"')
        if self._read is None:
            self._read = self._decide(t, line)
        try:
            ts = self._read(t)
        except (ValueError, OverflowError, OSError):  # OSError: a Unix time beyond the C library's
            if self.either_way is not None and _fits(t, self.either_way):
                raise TimeForm(self.either_way) from None
            raise RecordingError(f"time {t[:40]!r} is not in the column's form ({self.form})", line) from None
        if self.either_way is not None and _rules_out(t, self.form or ""):
            self.either_way = None
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
        self.form, self._read, self.either_way = None, None, None

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
                          "--start TIME, or place it so that it ends now (--recent)", line)
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
            other = _EITHER_WAY.get(fmt)
            self.either_way = other if other and _fits(bare, other) else None
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


def _named(text: str, fmt: str) -> datetime:
    return datetime.strptime(text, fmt)


def _fits(text: str, fmt: str) -> bool:
    try:
        _strptime(text, fmt)
    except ValueError:
        return False
    return True


def _rules_out(text: str, fmt: str) -> bool:
    """Whether a date read in ``fmt`` could not be read the other way round: its day is above 12
    (by its first two fields, not a second strptime: every line of an undecided file comes here)."""
    sep = fmt[2]
    parts = text.split(sep, 2)
    day = 0 if fmt.index("%d") < fmt.index("%m") else 1
    return len(parts) == 3 and parts[day].strip().isdigit() and int(parts[day]) > 12


def time_format(value: str) -> str:
    """A strftime form as `--time-format` gives it, checked by writing a time in it and reading it back."""
    probe = datetime(2026, 11, 23, 15, 13, 16, 250000)
    try:
        ok = "%" in value and datetime.strptime(probe.strftime(value), value) is not None
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{value!r} is not a strftime form that reads a time back, such as '%d-%m-%Y %H:%M:%S'")
    return value


def parse_time(text: str, line: int, clock: Clock | None = None) -> datetime:
    """One time in any form jobpulse reads (a block format's 'Timestamp : ...' line); ``clock``
    keeps a file's times of one kind (all with a zone, or all without)."""
    clock = clock or Clock()
    clock.forget_form()  # each report's date line is read afresh, its zone kept alike
    return clock.read(text, line)
