"""Import a recording (`recording_formats`) as a job, stored like live samples, so `rules backtest`,
`report` and the dashboards judge it as they judge a job the agents watched.

Two passes over the file, both streamed: the first reads it all (every line checked, what it measures,
its GPUs and time range), so a bad file is refused before anything is written; the second builds agent
batches and stores them through the collector's own validation and storage. The batches are named by
the file's content (agent instance = its SHA-256), so importing the same file again stores nothing new.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.metadata import version as dist_version
from pathlib import Path
from zoneinfo import ZoneInfo

from jobpulse.collector.errors import Rejected
from jobpulse.collector.ingest.recording_formats import RecordingError, format_of, open_text, readings
from jobpulse.collector.ingest.validate import Limits, validate
from jobpulse.collector.rules import backtest
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store import flags, fold, partitions
from jobpulse.collector.store.connect import connect
from jobpulse.collector.store.database import Storage, ValidBatch
from jobpulse.schema import wire

SAMPLES_PER_BATCH = 2000
BATCHES_PER_COMMIT = 8

MEASURES: dict[str, tuple[tuple[str, ...], str]] = {
    "activity": (("sm_util", "gpm_sm_active"), "GPU utilization"),
    "memory": (("fb_used_mib",), "GPU memory used"),
    "memory total": (("fb_total_mib",), "GPU memory total"),
    "power": (("power_w",), "power draw"),
    "clocks": (("sm_clock_mhz",), "SM clock"),
    "throttle reasons": (("clock_event_reasons",), "clock event (throttle) reasons"),
    "tensor activity": (("gpm_tensor_active",), "tensor-core activity (GPM / DCGM profiling)"),
}
"""What a recording may lack, by the fields that measure it: said in the job's tags and the output."""
STAND_IN = "DCGM's GRACT (graphics engine active), the recording has no GPUTL or SMACT"


@dataclass(frozen=True)
class Options:
    """Where the recording goes and how to read it (the `jobpulse import` options)."""

    fmt: str | None = None
    columns: list[str] | None = None
    job_id: str | None = None
    node: str | None = None
    cluster: str = "imported"
    user: str | None = None
    partition: str | None = None
    gpus: frozenset[int] | None = None  # the job's GPUs (indices in the recording); None: all
    model: str | None = None
    tz: ZoneInfo | None = None  # of naive timestamps; None: UTC
    start: datetime | None = None  # aware: where the first sample goes (or when it was taken, without times)
    recent: bool = False  # place the recording so that it ends now
    interval: timedelta | None = None  # of a recording without times
    retention_days: int = 30
    max_skew: timedelta = timedelta(minutes=5)


@dataclass
class Gpu:
    index: int
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    readings: int = 0


@dataclass
class Survey:
    """The first pass: what the file holds."""

    digest: str
    fmt: str
    readings: int = 0
    first: datetime | None = None  # aware, as recorded
    last: datetime | None = None
    gpus: dict[int, Gpu] = field(default_factory=dict)
    measured: set[str] = field(default_factory=set)
    gaps: list[float] = field(default_factory=list)  # seconds between a GPU's readings (the first 100,000)
    timed: bool = True  # the file gives its own times
    stand_in: bool = False  # GRACT stood in for utilization (`Reading.stand_in`)

    @property
    def lacks(self) -> list[str]:
        return [what for what, (fields, _) in MEASURES.items() if not self.measured & set(fields)]

    @property
    def interval_s(self) -> float | None:
        return statistics.median(self.gaps) if self.gaps else None


@dataclass(frozen=True)
class Imported:
    cluster: str
    node: str
    job_id: str
    fmt: str
    gpus: list[int]
    readings: int
    skipped: int  # readings of GPUs the job did not hold
    start: datetime
    end: datetime
    interval_s: float | None
    lacks: list[str]
    stand_in: bool
    batches: int
    duplicates: int  # batches stored before (the file was imported already)

    def text(self, name: str) -> str:
        lines = [f"imported {name} ({self.fmt}) as job {self.job_id} on {self.cluster}/{self.node}: "
                 f"{len(self.gpus)} GPU{'s' * (len(self.gpus) != 1)}, {self.readings} readings, "
                 f"{_iso(self.start)} .. {_iso(self.end)}"
                 + (f", {self.interval_s:.3g} s apart" if self.interval_s else "")]
        if self.skipped:
            lines.append(f"  {self.skipped} readings of GPUs the job did not hold were left out")
        if self.duplicates == self.batches:
            lines.append("  already imported: nothing new stored")
        elif self.duplicates:
            lines.append(f"  {self.duplicates} of {self.batches} batches were stored before")
        if self.lacks:
            lines.append(f"  not measured: {', '.join(self.lacks)} (rules that need them do not judge this job)")
        if self.stand_in:
            lines.append(f"  utilization: {STAND_IN}")
        lines.append(f"  report: jobpulse report {self.job_id} --cluster {self.cluster}")
        return "\n".join(lines)


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="seconds")


def digest_of(path: Path) -> str:
    h = hashlib.sha256()
    with open_text(path) as stream:
        while chunk := stream.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _aware(ts: datetime, tz: ZoneInfo | None) -> datetime:
    return ts.replace(tzinfo=tz or UTC) if ts.tzinfo is None else ts


def survey(path: Path, opts: Options) -> Survey:
    """Read the whole recording once: every line checked; nothing is written."""
    found = Survey(digest_of(path), opts.fmt or format_of(path, opts.columns))
    start = opts.start.astimezone(opts.tz or UTC).replace(tzinfo=None) if opts.start else None
    prev: dict[int, datetime] = {}  # each GPU's previous reading
    for r in readings(path, found.fmt, opts.columns, start, opts.interval):
        ts = _aware(r.ts, opts.tz)  # type: ignore[arg-type]  # readings sets every time
        found.readings += 1
        found.timed = found.timed and r.timed
        found.stand_in = found.stand_in or r.stand_in
        g = found.gpus.setdefault(r.gpu, Gpu(r.gpu))
        g.readings += 1
        g.uuid, g.model, g.pci_bus_id = g.uuid or r.uuid, g.model or r.model, g.pci_bus_id or r.pci_bus_id
        found.measured.update(r.values)
        found.first = ts if found.first is None else min(found.first, ts)
        found.last = ts if found.last is None else max(found.last, ts)
        before = prev.get(r.gpu)
        if before is not None and ts > before and len(found.gaps) < 100_000:
            found.gaps.append((ts - before).total_seconds())
        prev[r.gpu] = ts
    if not found.readings:
        raise RecordingError("the recording holds no readings")
    if not found.measured & set(MEASURES["activity"][0]):
        raise RecordingError("the recording has no GPU utilization column (utilization.gpu, dmon sm, DCGM GPUTL, "
                             "SMACT or GRACT): there is nothing to judge")
    missing = sorted((opts.gpus or frozenset()) - set(found.gpus))
    if missing:
        raise RecordingError(f"--gpus names GPU {', '.join(map(str, missing))}, which the recording does not have "
                             f"(it has {', '.join(map(str, sorted(found.gpus)))})")
    return found


def _job_id(digest: str) -> str:
    return str(int(digest[:8], 16))


def _node_name(path: Path) -> str:
    stem = path.name.split(".")[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", stem)[:60] or "imported"


def placement(found: Survey, opts: Options, now: datetime) -> timedelta:
    """How far the recording moves: to ``start``, to end now (``recent``), or not at all; refused
    where the result lies outside what the collector keeps (retention) or ahead of now."""
    assert found.first is not None and found.last is not None
    if opts.recent:
        shift = now - timedelta(seconds=1) - found.last
    elif opts.start:
        shift = opts.start - found.first
    elif not found.timed:
        raise RecordingError("the recording has no times: say when it began (--start TIME) or place it so that it "
                             "ends now (--recent)")
    else:
        shift = timedelta(0)
    first, last = found.first + shift, found.last + shift
    horizon = datetime.combine(partitions.horizon(opts.retention_days, now.date()), datetime.min.time(), tzinfo=UTC)
    if first < horizon:
        raise RecordingError(f"the recording begins {first.isoformat()}, before the {opts.retention_days}-day "
                             "retention horizon: place it with --recent (it then ends now) or --start TIME")
    if last > now + opts.max_skew:
        raise RecordingError(f"the recording ends {last.isoformat()}, in the future: check --tz or --start")
    return shift


def batches(path: Path, found: Survey, opts: Options, shift: timedelta) -> Iterator[wire.Batch]:
    """The second pass: the job's readings as agent batches, in file order."""
    assert found.first is not None and found.last is not None
    node = opts.node or _node_name(path)
    job_id = opts.job_id or _job_id(found.digest)
    held = sorted(opts.gpus if opts.gpus is not None else found.gpus)
    uuids = {i: found.gpus[i].uuid or f"GPU-{found.digest[:12]}-{i}" for i in held}
    first, last = found.first + shift, found.last + shift
    agent = wire.AgentInfo(instance=f"import-{found.digest[:40]}", node=node, cluster=opts.cluster,
                           version=dist_version("jobpulse"), started_at=first)
    tags = {"imported_from": path.name[:200], "format": found.fmt}
    if found.lacks:
        tags["not_measured"] = ", ".join(found.lacks)
    if found.stand_in:
        tags["utilization"] = STAND_IN
    start_record = wire.JobRecord(
        job_id=job_id, user_name=opts.user, partition=opts.partition, job_name=path.name[:200], nodes=[node],
        gpus_total=len(held), start_time=first, state="RUNNING", tags=tags,
        gpus=[wire.JobGpu(uuids[i], i, found.gpus[i].pci_bus_id) for i in held])
    topology = [wire.TopologyGpu(ts=first, gpu_uuid=uuids[i], gpu_index=i, pci_bus_id=found.gpus[i].pci_bus_id,
                                 model=opts.model or found.gpus[i].model) for i in held]
    seq, samples = 0, []
    start = opts.start.astimezone(opts.tz or UTC).replace(tzinfo=None) if opts.start else None
    for r in readings(path, found.fmt, opts.columns, start, opts.interval):
        if r.gpu not in uuids:
            continue
        samples.append(wire.GpuSample(ts=_aware(r.ts, opts.tz) + shift,  # type: ignore[arg-type]
                                      gpu_uuid=uuids[r.gpu], gpu_index=r.gpu, job_id=job_id, **r.values))
        if len(samples) >= SAMPLES_PER_BATCH:
            yield _batch(agent, seq, samples, [start_record] if seq == 0 else [], topology if seq == 0 else [])
            seq, samples = seq + 1, []
    end = wire.JobRecord(job_id=job_id, end_time=last, state="COMPLETED")
    yield _batch(agent, seq, samples, [start_record, end] if seq == 0 else [end], topology if seq == 0 else [])


def _batch(agent: wire.AgentInfo, seq: int, samples: list[wire.GpuSample], jobs: list[wire.JobRecord],
           topology: list[wire.TopologyGpu]) -> wire.Batch:
    created = max((s.ts for s in samples), default=agent.started_at)
    return wire.Batch(version=1, agent=agent, seq=seq, created_at=created, gpu_samples=samples, jobs=jobs,
                      topology=topology)


def judge(dsn: str, done: Imported, thresholds: Thresholds) -> list[backtest.ReplayedFlag]:
    """Replay the live rules over the imported job, cycle by cycle, and keep their flags as its
    history (closed at its end), so `report` and the dashboards show them."""
    end = done.end + thresholds.flag_hold
    with connect(dsn) as conn:
        replayed = backtest.replay(conn, thresholds, done.start, end, timedelta(seconds=30), done.cluster,
                                   done.job_id)
        flags.write_history(conn, done.cluster, done.job_id, [
            (f.rule_id, f.severity, f.category, f.scope, f.scope_key, f.started_at, f.raised_at, f.last_hit,
             min(f.closed_at or done.end, done.end), f.evidence, f.advice) for f in replayed])
    return replayed


def import_recording(dsn: str, path: Path, opts: Options, now: datetime | None = None) -> Imported:
    """Survey, place and store a recording; raises `RecordingError` (nothing stored) for a bad file,
    `Rejected`/`Unavailable` from the collector's own checks and storage."""
    now = now or datetime.now(UTC)
    found = survey(path, opts)
    shift = placement(found, opts, now)
    limits = Limits(oldest_day=partitions.horizon(opts.retention_days, now.date()), max_skew=opts.max_skew)
    held = sorted(opts.gpus if opts.gpus is not None else found.gpus)
    stats = asyncio.run(_store(dsn, batches(path, found, opts, shift), limits, now))
    assert found.first is not None and found.last is not None
    return Imported(opts.cluster, opts.node or _node_name(path), opts.job_id or _job_id(found.digest), found.fmt,
                    held, sum(found.gpus[i].readings for i in held),
                    found.readings - sum(found.gpus[i].readings for i in held),
                    found.first + shift, found.last + shift, found.interval_s, found.lacks, found.stand_in, *stats)


async def _store(dsn: str, stream: Iterator[wire.Batch], limits: Limits, now: datetime) -> tuple[int, int]:
    """Store the batches a few per transaction; returns (batches, of them stored before)."""
    storage = Storage(dsn, pool_min=1, pool_max=1, wait_s=30)
    await storage.open()
    total = duplicates = 0
    try:
        group: list[ValidBatch] = []
        for batch in stream:
            group.append(validate(wire.encode(batch), limits, now))
            if len(group) >= BATCHES_PER_COMMIT:
                duplicates += await _commit(storage, group)
                total, group = total + len(group), []
        if group:
            duplicates += await _commit(storage, group)
            total += len(group)
    finally:
        await storage.close()
    await asyncio.to_thread(fold.catch_up, dsn)  # its samples in their roll-ups now
    return total, duplicates


async def _commit(storage: Storage, group: list[ValidBatch]) -> int:
    results = await storage.store(group)
    if any(r.claimed for r in results):
        a = group[0].batch.agent
        raise Rejected(409, f"this recording was imported before under another cluster or node than {a.cluster}/"
                            f"{a.node}: import it with the same --cluster and --node, or not again")
    return sum(r.duplicate for r in results)

