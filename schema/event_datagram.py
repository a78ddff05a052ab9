"""The application-event datagram a job's code sends to the node agent (`jobpulse.agent.client`).

One JSON object per datagram, at most ``MAX_BYTES``::

    {"v": 1, "ts": 1767225600.25, "kind": "step", "level": "info", "name": "step",
     "message": "step 120", "attrs": {"step": 120, "samples_per_s": 812.5}}

What it does not carry is the point: job, step, rank and PID come from the kernel's view of the
sender, never from the message. Standard library only: the client imports it inside training code.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from jobpulse.schema import storable

VERSION = 1
MAX_BYTES = 60_000  # one datagram; larger ones are refused (and counted) by the agent
LEVELS = ("debug", "info", "warning", "error", "critical")
MAX_KIND, MAX_NAME, MAX_MESSAGE = 32, 255, 8192
MAX_VALUES = 1000
"""Values (keys, items, scalars) the attributes of one event may hold as JSON; beyond, they are kept
as their JSON text (at most MAX_MESSAGE characters): 60 KB of ``[{},{},...]`` would otherwise be
20,000 objects, some 30 times its size in memory."""


@dataclass(frozen=True)
class Datagram:
    """A parsed datagram: text cut to its limits and made storable (`storable`), an unknown level read
    as info, a bad kind as log."""

    ts: float | None
    kind: str = "log"
    level: str = "info"
    name: str | None = None
    message: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    cost: int = 0  # bytes the parsed attributes hold in memory (what the agent counts while it keeps them)


def build(kind: str, message: str, level: str, name: str | None, attrs: dict[str, Any], ts: float) -> dict[str, Any]:
    """The JSON object the client sends."""
    return {"v": VERSION, "ts": ts, "kind": kind, "level": level if level in LEVELS else "info", "name": name,
            "message": str(message), "attrs": attrs}


def _text(value: Any, limit: int) -> str:
    return storable.text((value if isinstance(value, str) else "" if value is None else str(value))[:limit])


def _kind(value: Any) -> str:
    kind = _text(value, MAX_KIND)
    return kind if kind and kind[0].isalpha() and kind.islower() and kind.replace("_", "").isalnum() else "log"


def parse(data: bytes) -> Datagram:
    """The datagram, or ValueError saying why it is not one."""
    try:
        msg = json.loads(data)  # ValueError (JSONDecodeError, UnicodeDecodeError) on garbage
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(msg, dict):
        raise ValueError(f"expected a JSON object, got {type(msg).__name__}")
    ts = msg.get("ts")
    attrs = storable.json_value(msg.get("attrs") if isinstance(msg.get("attrs"), dict) else
                                {} if msg.get("attrs") is None else {"value": msg.get("attrs")})
    cost = _weigh(attrs)
    if cost is None:
        attrs = {"clipped": True, "json": _text(json.dumps(attrs, default=str), MAX_MESSAGE)}
        cost = _weigh(attrs) or 0
    return Datagram(
        ts=float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None,
        kind=_kind(msg.get("kind")),
        level=msg["level"] if msg.get("level") in LEVELS else "info",
        name=_text(msg.get("name"), MAX_NAME) or None,
        message=_text(msg.get("message"), MAX_MESSAGE),
        attrs=attrs, cost=cost,
    )


def _weigh(value: Any) -> int | None:
    """Bytes ``value`` holds in memory, every object counted; None past MAX_VALUES values."""
    total, seen, stack = 0, 0, [value]
    while stack:
        v = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            return None
        total += sys.getsizeof(v)
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return total
