"""Batch: collect records between flushes into one wire ``Batch`` per flush interval.

Every batch is checked against the wire schema and the storage rule (`jobpulse.schema.storable`)
before it leaves, so the collector never refuses a whole batch for one odd reading or one user's
text: text PostgreSQL cannot hold is replaced, a record that does not validate is dropped, counted
and logged, and a batch that cannot be encoded at all still carries its GPU and process samples.
Application events get a byte budget per batch, so no flood of them can push a batch past the
collector's size limit.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version as dist_version
from typing import Any

import msgspec
import structlog

from jobpulse.schema import storable, wire

log = structlog.get_logger("jobpulse.agent.shipping.batch")
_AT = re.compile(r"at `\$\.(\w+)\[(\d+)\]")


@dataclass(frozen=True)
class Ready:
    """A batch that passed the wire schema, and its JSON encoding."""

    batch: wire.Batch
    body: bytes


RECORD_LISTS = tuple(f for f in wire.Batch.__struct_fields__ if f not in ("version", "agent", "seq", "created_at",
                                                                        "dropped"))
MEASURED = ("gpu_samples", "process_samples", "topology")
"""What the agent reads from NVML and /proc: no user writes a string into these."""
EVENT_BUDGET_BYTES = 2 * 1024 * 1024
"""Application events one batch may carry, by what they cost in memory (`sources.app_events`): well under the collector's body limit (32 MiB by default) with room for
the samples; at one flush a second, some 2,500 events with a few attributes each."""


MAX_CAPTURES = 16
"""Capture answers one batch may carry (the wire format's bound)."""


def _storable(value: object) -> object:
    """A record with every string and JSON value made storable (`storable.text`, `storable.json_value`)."""
    if isinstance(value, msgspec.Struct):
        return msgspec.structs.replace(value, **{f: _storable(getattr(value, f)) for f in value.__struct_fields__})
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return storable.json_value(value)
    if isinstance(value, str):
        return storable.text(value)
    return value


class Batcher:
    def __init__(self, node: str, cluster: str, process_interval_s: float = 1.0) -> None:
        self.agent = wire.AgentInfo(instance=uuid.uuid4().hex, node=node, cluster=cluster,
                                    version=dist_version("jobpulse"), started_at=datetime.now(UTC),
                                    process_interval_s=process_interval_s)
        self._lock = threading.Lock()
        self._seq = 0
        self._parts: dict[str, list[msgspec.Struct]] = {name: [] for name in RECORD_LISTS}
        self._dropped = {"gpu_samples": 0, "process_samples": 0, "events": 0, "batches": 0}
        self._event_bytes = 0

    def add(self, part: str, records: Sequence[msgspec.Struct]) -> None:
        with self._lock:
            self._parts[part].extend(records)

    def add_events(self, events: list[tuple[wire.AppEvent, int]]) -> int:
        """Application events with their sizes, within this batch's byte budget; returns how many
        did not fit (counted as dropped)."""
        with self._lock:
            room = EVENT_BUDGET_BYTES - self._event_bytes
            taken = 0
            for _, size in events:
                if size > room:
                    break
                room -= size
                taken += 1
            self._event_bytes = EVENT_BUDGET_BYTES - room
            self._parts["events"].extend(e for e, _ in events[:taken])
            self._dropped["events"] += len(events) - taken
        return len(events) - taken

    def count_dropped(self, counts: dict[str, int]) -> None:
        with self._lock:
            for k, n in counts.items():
                if k in self._dropped:
                    self._dropped[k] += n

    def take(self) -> Ready | None:
        """The batch of everything added since the last call (validated and encoded); None when
        there is nothing."""
        with self._lock:
            parts: dict[str, Any] = {k: v for k, v in self._parts.items() if v}
            dropped = self._dropped
            if not parts and not any(dropped.values()):
                return None
            later = parts.get("captures", [])[MAX_CAPTURES:]  # what a batch may carry; the rest goes next
            if later:
                parts["captures"] = parts["captures"][:MAX_CAPTURES]
            self._parts = {k: [] for k in self._parts}
            self._parts["captures"] = later
            self._dropped = {k: 0 for k in self._dropped}
            self._event_bytes = 0
            seq, self._seq = self._seq, self._seq + 1
        batch = wire.Batch(version=wire.WIRE_VERSION, agent=self.agent, seq=seq, created_at=datetime.now(UTC),
                           dropped=wire.Dropped(**dropped), **parts)
        try:
            return self._valid(batch)
        except Exception:  # nothing a user wrote may cost the samples of this batch
            log.exception("batch could not be encoded: its events and job records dropped, samples kept")
            lost = {"events": batch.dropped.events + len(batch.events)}
            kept = {part: getattr(batch, part) for part in MEASURED}
            return self._valid(wire.Batch(version=batch.version, agent=batch.agent, seq=batch.seq,
                                          created_at=batch.created_at,
                                          dropped=msgspec.structs.replace(batch.dropped, **lost), **kept))

    def _valid(self, batch: wire.Batch) -> Ready:
        while True:
            try:
                body = wire.encode(batch)
            except UnicodeEncodeError:  # a lone surrogate: as storable text
                batch = self._storable(batch)
                body = wire.encode(batch)
            if storable.nul_in_json(body):
                batch = self._storable(batch)
                body = wire.encode(batch)
            try:
                wire.decode(body)
                return Ready(batch, body)
            except msgspec.ValidationError as exc:
                m = _AT.search(str(exc))
                if not m:
                    raise
                part, index = m.group(1), int(m.group(2))
                log.error("record dropped: invalid reading", part=part, error=str(exc))
                records = list(getattr(batch, part))
                del records[index]
                kind = part if part in ("gpu_samples", "process_samples", "events") else None
                dropped = batch.dropped
                if kind:
                    dropped = msgspec.structs.replace(dropped, **{kind: getattr(dropped, kind) + 1})
                batch = msgspec.structs.replace(batch, dropped=dropped, **{part: records})

    @staticmethod
    def _storable(batch: wire.Batch) -> wire.Batch:
        """The batch with the text of every record a user may have written made storable."""
        log.warning("text PostgreSQL cannot store replaced (NUL or lone surrogate)")
        return msgspec.structs.replace(batch, **{part: _storable(getattr(batch, part)) for part in RECORD_LISTS
                                                 if part not in MEASURED and getattr(batch, part)})
