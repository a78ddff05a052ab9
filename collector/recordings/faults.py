"""What can be wrong with a recording, and how much of it: a line that does not fit is counted and
skipped (`Skip`), a file that cannot be read as a recording at all is refused (`Refused`), and the
survey refuses one whose damage dominates, quoting its first bad lines."""

from __future__ import annotations

from dataclasses import dataclass


class RecordingError(ValueError):
    """A line that does not fit its format (counted and skipped), or, raised from the survey, a file
    refused whole. The message names the line and the column."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.reason = message


class Refused(RecordingError):
    """Not a matter of one line: the whole file cannot be read (binary data, too large, an option
    it needs), so nothing is skipped and nothing stored."""


@dataclass(frozen=True, slots=True)
class Skip:
    """A line left out, and why: ``kind`` is what the count says ("malformed", "time going
    backwards", "repeated header", "truncated at the end")."""

    line: int
    kind: str
    reason: str
    text: str = ""
