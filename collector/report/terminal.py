"""Make text safe for a terminal: job names, users, tags, phase names and command lines come from
users, and an escape sequence in one could retitle the window, clear the screen or fake a line."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab shown as an escape (``\\x1b``)."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf") else _escape(ch) for ch in text)


def lines(rows: Iterable[str | None]) -> str:
    """Report lines as one text, each line a line: every control character within a line (CR, LF,
    tab, ESC, ... and Unicode's line and paragraph separators) shown as an escape, so a job's own
    string (a phase named "checkpoint\\r\\nBcc: x") can neither break a line nor fake one. What the text
    report and the node validation report end with; rows that are None are left out."""
    return "\n".join("".join(ch if unicodedata.category(ch) not in _BREAKING else _escape(ch) for ch in row)
                     for row in rows if row is not None)


_BREAKING = ("Cc", "Cf", "Zl", "Zp")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
