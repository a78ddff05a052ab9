"""What PostgreSQL can store: the collector's rule for text and JSON, and the agent's way to meet it.

The collector refuses a batch that PostgreSQL could not store whole (a NUL in any string, JSON
nested past ``MAX_DEPTH``), so one bad string never fails a batch half-way in the database. The agent
must never ship such a batch: every string a user controls (event messages and attributes, job
names, ``#SBATCH`` tags) passes through ``text`` / ``json_value`` first, which replace what cannot be
stored (NUL, lone surrogates) with U+FFFD and flatten JSON nested too deep. Both sides import this
module, so the rule and its remedy cannot drift apart.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 32
"""Deepest JSON nesting an attribute value may have (PostgreSQL's jsonb and the decoders' stack
limits lie far beyond; a deeper value is stored as its JSON text)."""
REPLACEMENT = "\ufffd"
INT64 = 2**63
# A JSON escape \u0000 preceded by an even number of backslashes (an odd count escapes it).
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str every one is lone: a pair would be one character


def nul_in_json(body: bytes) -> bool:
    """The collector's check: does this JSON document hold a NUL in any string?"""
    return b"\\u0000" in body and _NUL_ESCAPE.search(body) is not None


def text(value: str) -> str:
    """``value`` with NUL and lone surrogates (what UTF-8 and PostgreSQL cannot hold) replaced by U+FFFD."""
    if "\x00" in value:
        value = value.replace("\x00", REPLACEMENT)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates, e.g. undecodable bytes of os.environ (surrogateescape)
        value = _SURROGATE.sub(REPLACEMENT, value)
    return value


def json_value(value: Any, depth: int = 0) -> Any:
    """A JSON value PostgreSQL's jsonb stores as given: strings and keys through ``text``, NaN and
    infinities as null, integers beyond 64 bits as their decimal text, nesting past ``MAX_DEPTH`` as
    the nested value's JSON text."""
    if isinstance(value, str):
        return text(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -INT64 <= value < INT64 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        return text(json.dumps(value, default=str)[:8192])
    if isinstance(value, dict):
        return {text(str(k)): json_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v, depth + 1) for v in value]
    return text(str(value))


def depth_of(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep ``value`` nests, counting no further than ``limit + 1``."""
    if limit < 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((depth_of(v, limit - 1) for v in items), default=0)
