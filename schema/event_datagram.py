"""The application-event datagram a job's code sends to the node agent (`jobpulse.agent.client`).

One JSON object per datagram, at most ``MAX_BYTES``::

    {"v": 1, "ts": 1767225600.25, "kind": "step", "level": "info", "name": "step",
     "message": "step 120", "attrs": {"step": 120, "samples_per_s": 812.5}}

What it does not carry is the point: job, step, rank and PID come from the kernel's view of the
sender, never from the message. Standard library only: the client imports it inside training code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jobpulse.schema import storable

VERSION = 1
MAX_BYTES = 60_000  # one datagram; larger ones are refused (and counted) by the agent
LEVELS = ("debug", "info", "warning", "error", "critical")
MAX_KIND, MAX_NAME, MAX_MESSAGE = 32, 255, 8192


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
    attrs = msg.get("attrs")
    return Datagram(
        ts=float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None,
        kind=_kind(msg.get("kind")),
        level=msg["level"] if msg.get("level") in LEVELS else "info",
        name=_text(msg.get("name"), MAX_NAME) or None,
        message=_text(msg.get("message"), MAX_MESSAGE),
        attrs=storable.json_value(attrs if isinstance(attrs, dict) else {} if attrs is None else {"value": attrs}),
    )
