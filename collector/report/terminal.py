"""Make text safe for a terminal: job names, users, tags, phase names and command lines come from
users, and an escape sequence in one could retitle the window, clear the screen or fake a line."""

from __future__ import annotations

import unicodedata


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab shown as an escape (``\\x1b``)."""
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf") else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
