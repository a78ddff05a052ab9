"""Batch: collect records between flushes into one wire ``Batch`` per flush interval.

Every batch is checked against the wire schema before it leaves, so the collector never
refuses a whole batch for one odd reading: a record that does not validate is dropped,
counted, and logged.
"""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version as dist_version

import msgspec
import structlog

from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent.batch")
_AT = re.compile(r"at `\$\.(\w+)\[(\d+)\]")


@dataclass(frozen=True)
class Ready:
    """A batch that passed the wire schema, and its JSON encoding."""

    batch: wire.Batch
    body: bytes


RECORD_LISTS = tuple(f for f in wire.Batch.__struct_fields__ if f not in ("version", "agent", "seq", "created_at",
                                                                        "dropped"))


class Batcher:
    def __init__(self, node: str, cluster: str) -> None:
        self.agent = wire.AgentInfo(instance=uuid.uuid4().hex, node=node, cluster=cluster,
                                    version=dist_version("jobpulse"), started_at=datetime.now(timezone.utc))
        self._lock = threading.Lock()
        self._seq = 0
        self._parts: dict[str, list[msgspec.Struct]] = {name: [] for name in RECORD_LISTS}
        self._dropped = {"gpu_samples": 0, "process_samples": 0, "events": 0, "batches": 0}

    def add(self, part: str, records: list[msgspec.Struct]) -> None:
        with self._lock:
            self._parts[part].extend(records)

    def count_dropped(self, counts: dict[str, int]) -> None:
        with self._lock:
            for k, n in counts.items():
                if k in self._dropped:
                    self._dropped[k] += n

    def take(self) -> Ready | None:
        """The batch of everything added since the last call (validated and encoded); None when
        there is nothing."""
        with self._lock:
            parts = {k: v for k, v in self._parts.items() if v}
            dropped = self._dropped
            if not parts and not any(dropped.values()):
                return None
            self._parts = {k: [] for k in self._parts}
            self._dropped = {k: 0 for k in self._dropped}
            seq, self._seq = self._seq, self._seq + 1
        batch = wire.Batch(version=wire.WIRE_VERSION, agent=self.agent, seq=seq, created_at=datetime.now(timezone.utc),
                           dropped=wire.Dropped(**dropped), **parts)
        return self._valid(batch)

    def _valid(self, batch: wire.Batch) -> Ready:
        while True:
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
