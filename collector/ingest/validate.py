"""Validate: turn a body into a ``Batch`` that can be stored whole, or reject it naming the field.

Types and ranges are checked by msgspec against the wire structs; this module adds what a
struct cannot know: the wire version this collector speaks, every timestamp within bounds (records within
[retention horizon, now + allowed clock skew]; agent and job times within [2000, now + skew]),
and what PostgreSQL cannot store (`jobpulse.schema.storable`: a NUL anywhere, attributes nested too
deep), so a batch never fails half-way in the database. The agent meets the same rule before it ships.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import msgspec

from jobpulse.collector.errors import Rejected
from jobpulse.collector.store.database import ValidBatch
from jobpulse.schema import storable, wire

_AT_PATH = re.compile(r" - at `(\$[^`]*)`$")


class _Envelope(msgspec.Struct):
    version: Any = None


_envelope = msgspec.json.Decoder(_Envelope)


@dataclass(frozen=True)
class Limits:
    oldest_day: date
    """Data before this UTC day would be dropped by retention: refused."""
    max_skew: timedelta
    """How far in the future (agent clock ahead of ours) a timestamp may be."""


def _version_of(body: bytes) -> object:
    try:
        return _envelope.decode(body).version
    except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError):
        return None


SANE_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
"""No job, agent or sample of this system predates it; a time before it is a bug or an attack."""


def _other_times(batch: wire.Batch) -> Iterator[tuple[str, datetime | None]]:
    """The timestamps that are not a record's ``ts``: the agent's start and the jobs' times."""
    yield "$.agent.started_at", batch.agent.started_at
    for i, job in enumerate(batch.jobs):
        for name in ("submit_time", "start_time", "end_time"):
            yield f"$.jobs[{i}].{name}", getattr(job, name)


def _check_times(batch: wire.Batch, limits: Limits, now: datetime) -> ValidBatch:
    """Bounds-check every timestamp in the batch; returns it with the UTC days its records span. Records'
    times lie within [retention horizon, now + skew]; the agent's and jobs' times within
    [2000-01-01, now + skew]. Min/max first: the hot path touches each record once, and the
    offending record is searched only on failure."""
    latest = now + limits.max_skew
    earliest = datetime.combine(limits.oldest_day, time(0), tzinfo=UTC)
    for path, ts in _other_times(batch):
        if ts is not None and not SANE_EARLIEST <= ts <= latest:
            raise Rejected(422, f"timestamp {ts.isoformat()} is outside [{SANE_EARLIEST.date().isoformat()}, "
                                f"now + {limits.max_skew.total_seconds():.0f} s]", path)
    lo, hi = time_span(batch)
    if hi > latest or lo < earliest:
        path, ts = _first_out_of_bounds(batch, earliest, latest)
        if ts > latest:
            raise Rejected(422, f"timestamp {ts.isoformat()} is more than {limits.max_skew.total_seconds():.0f} s "
                                f"in the future (agent clock ahead?)", path)
        raise Rejected(422, f"timestamp {ts.isoformat()} is older than the retention horizon "
                            f"{limits.oldest_day.isoformat()}", path)
    return ValidBatch.spanning(batch, lo, hi)


def time_span(batch: wire.Batch) -> tuple[datetime, datetime]:
    """The oldest and newest time among the batch's created_at and its records'."""
    lo = hi = batch.created_at
    for name in (*wire.TIME_SERIES, "topology"):
        records = getattr(batch, name)
        if records:
            lo = min(lo, min(r.ts for r in records))
            hi = max(hi, max(r.ts for r in records))
    return lo, hi


def _first_out_of_bounds(batch: wire.Batch, earliest: datetime, latest: datetime) -> tuple[str, datetime]:
    if not earliest <= batch.created_at <= latest:
        return "$.created_at", batch.created_at
    for name in (*wire.TIME_SERIES, "topology"):
        for i, rec in enumerate(getattr(batch, name)):
            if not earliest <= rec.ts <= latest:
                return f"$.{name}[{i}].ts", rec.ts
    raise AssertionError("no timestamp out of bounds")


def validate(body: bytes, limits: Limits, now: datetime | None = None) -> ValidBatch:
    """Decode and check a batch body; raises ``Rejected`` (400 malformed, 422 invalid)."""
    if storable.nul_in_json(body):
        raise Rejected(422, "strings must not contain NUL (\\u0000): PostgreSQL cannot store it")
    try:
        batch = wire.decode(body)
    except msgspec.ValidationError as exc:
        version = _version_of(body)
        if version not in wire.SUPPORTED_VERSIONS and isinstance(version, int):
            raise Rejected(422, f"unsupported wire version {version}; this collector accepts "
                                f"{list(wire.SUPPORTED_VERSIONS)}", "$.version") from None
        m = _AT_PATH.search(str(exc))
        raise Rejected(422, str(exc), m.group(1) if m else None) from None
    except msgspec.DecodeError as exc:
        raise Rejected(400, f"malformed JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise Rejected(400, f"body is not valid UTF-8: {exc}") from None
    except RecursionError:
        raise Rejected(400, "JSON nested too deeply") from None
    if batch.version not in wire.SUPPORTED_VERSIONS:
        raise Rejected(422, f"unsupported wire version {batch.version}; this collector accepts "
                            f"{list(wire.SUPPORTED_VERSIONS)}", "$.version")
    _check_depth(batch)
    return _check_times(batch, limits, now or datetime.now(UTC))


def _check_depth(batch: wire.Batch) -> None:
    """Free-form attributes nest at most ``storable.MAX_DEPTH`` deep."""
    for part in ("events", "health_events"):
        for i, rec in enumerate(getattr(batch, part)):
            if rec.attrs and storable.depth_of(rec.attrs) > storable.MAX_DEPTH:
                raise Rejected(422, f"attributes nest deeper than {storable.MAX_DEPTH} levels", f"$.{part}[{i}].attrs")
