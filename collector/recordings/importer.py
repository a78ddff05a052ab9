"""Import a recording (`formats`) as a job, stored like live samples, so `rules backtest`,
`report` and the dashboards judge it as they judge a job the agents watched.

Two passes over each file, both streamed: the first reads them all (`survey`: every line
checked, what it measures, its GPUs and time range, the lines it skips), so a bad file is refused
before anything is written; the second builds agent batches and stores them through the collector's
own validation and storage. Several files are one job, a node each; a file with a node column is
its nodes. The batches are named by the file's content (agent instance = its SHA-256, and the node's
name where the file names nodes), so importing the same file again stores nothing new.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version as dist_version
from pathlib import Path
from zoneinfo import ZoneInfo

from jobpulse.collector.errors import Rejected
from jobpulse.collector.ingest.validate import Limits, validate
from jobpulse.collector.recordings.faults import Refused
from jobpulse.collector.recordings.formats import UNKNOWN_START, ReadOptions, readings
from jobpulse.collector.recordings.intake import Limits as InputLimits
from jobpulse.collector.recordings.intake import Source, source
from jobpulse.collector.recordings.survey import STAND_IN, Gpu, Survey, aware, describe, read_options, spread, survey
from jobpulse.collector.recordings.values import Reading
from jobpulse.collector.rules import backtest
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.connect import connect
from jobpulse.collector.store.database import Storage, ValidBatch
from jobpulse.collector.store.state import flags
from jobpulse.collector.store.tiers import fold, partitions
from jobpulse.schema import wire

SAMPLES_PER_BATCH = 2000
BATCHES_PER_COMMIT = 8


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
    gpu_count: int | None = None  # a recording that names no GPUs cycles through this many (`--gpus N`)
    model: str | None = None
    tz: ZoneInfo | None = None  # of naive timestamps; None: UTC
    start: datetime | None = None  # aware: where the first sample goes (or when it was taken, without times)
    recent: bool = False  # place the recording so that it ends now
    interval: timedelta | None = None  # of a recording without times
    time_format: str | None = None  # the time column's strftime form (`--time-format`)
    retention_days: int = 30
    max_skew: timedelta = timedelta(minutes=5)
    input: InputLimits = InputLimits()

    def reading(self) -> ReadOptions:
        """How the file is read: from ``start``; with ``recent`` and no start, from any day (times of
        day, seconds from the start), since only how far apart they are is kept."""
        start = self.start or (UNKNOWN_START.replace(tzinfo=self.tz or UTC) if self.recent else None)
        return read_options(ReadOptions(self.columns, None, self.interval, self.gpu_count, self.time_format), self.tz,
                            start)


@dataclass(frozen=True)
class File:
    """One node of the job in a recording: its source, what the survey found, the node it is stored
    as, and the file's own name for it (``part``; "" where the file names no nodes)."""

    src: Source
    found: Survey
    node: str
    part: str = ""

    @property
    def gpus(self) -> dict[int, Gpu]:
        return self.found.nodes.get(self.part, {})

    def held(self, opts: Options) -> list[int]:
        """The GPUs of the job on this node: `--gpus` where the file names its GPUs, else all."""
        chosen = opts.gpus if opts.gpus is not None and (self.found.mapping.named or opts.gpu_count is None) else None
        return sorted(chosen if chosen is not None else self.gpus)

    @property
    def instance(self) -> str:
        """The agent instance its batches are named by: the file's content (and the node's name)."""
        own = f"-{hashlib.sha256(self.part.encode()).hexdigest()[:12]}" if self.part else ""
        return f"import-{self.found.digest[:40]}{own}"


@dataclass(frozen=True)
class Imported:
    cluster: str
    job_id: str
    files: list[tuple[str, str, Survey, list[int], dict[int, Gpu]]]  # name, node, survey, GPUs held, its GPUs
    start: datetime
    end: datetime
    batches: int
    duplicates: int  # batches stored before (the file was imported already)

    @property
    def node(self) -> str:
        return self.files[0][1]

    def text(self) -> str:
        lines = []
        for name, node, found, held, gpus in self.files:
            count = sum(gpus[i].readings for i in held)
            lines.append(f"imported {name} ({found.fmt}) as job {self.job_id} on {self.cluster}/{node}: "
                         f"{len(held)} GPU{'s' * (len(held) != 1)}, {count} readings, "
                         f"{_iso(self.start)} .. {_iso(self.end)}"
                         + (f", {found.interval_s:.3g} s apart" if found.interval_s else ""))
            if sum(g.readings for g in gpus.values()) > count:
                lines.append(f"  {sum(g.readings for g in gpus.values()) - count} readings of GPUs the job did not "
                             "hold were left out")
            if found.skipped:
                lines.append(f"  {found.skipped_text()}")
            if found.lacks:
                lines.append(f"  not measured: {', '.join(found.lacks)} (rules that need them do not judge this job)")
            if found.stand_in:
                lines.append(f"  utilization: {STAND_IN}")
        if self.duplicates == self.batches:
            lines.append("  already imported: nothing new stored")
        elif self.duplicates:
            lines.append(f"  {self.duplicates} of {self.batches} batches were stored before")
        lines.append(f"  report: jobpulse report {self.job_id} --cluster {self.cluster}")
        return "\n".join(lines)


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="seconds")


def _job_id(digests: list[str]) -> str:
    return str(int(hashlib.sha256("".join(digests).encode()).hexdigest()[:8], 16)) if len(digests) > 1 \
        else str(int(digests[0][:8], 16))


def _node_name(name: str) -> str:
    stem = name.split(".")[0]
    return re.sub(r"[^A-Za-z0-9_.-]", "-", stem)[:60] or "imported"


def placement(first: datetime, last: datetime, timed: bool, opts: Options, now: datetime) -> timedelta:
    """How far the recording moves: to ``start``, to end now (``recent``), or not at all; refused
    where the result lies outside what the collector keeps (retention) or ahead of now."""
    if opts.recent:
        shift = now - timedelta(seconds=1) - last
    elif opts.start:
        shift = opts.start - first
    elif not timed:
        raise Refused("the recording has no times: say when it began (--start TIME) or place it so that it "
                      "ends now (--recent)")
    else:
        shift = timedelta(0)
    try:
        placed_first, placed_last = first + shift, last + shift
    except OverflowError:
        raise Refused(f"the recording spans {first.year} to {last.year}: it cannot be placed there") from None
    horizon = datetime.combine(partitions.horizon(opts.retention_days, now.date()), datetime.min.time(), tzinfo=UTC)
    if placed_first < horizon:
        raise Refused(f"the recording begins {placed_first.isoformat()}, before the {opts.retention_days}-day "
                      "retention horizon: place it with --recent (it then ends now) or --start TIME")
    if placed_last > now + opts.max_skew:
        raise Refused(f"the recording ends {placed_last.isoformat()}, in the future: check --tz or --start")
    return shift


def surveyed(srcs: list[Source], opts: Options) -> list[File]:
    """Every file surveyed (refused whole before anything is stored), each on its node, or on the
    nodes its node column names."""
    if opts.node and len(srcs) > 1:
        raise Refused("--node names one node: several files are one node each (named from their file names)")
    files = [f for s in srcs for f in _nodes_of(s, survey(s, opts.fmt, opts.reading(), opts.tz), opts)]
    nodes = [f.node for f in files]
    if len(set(nodes)) != len(nodes):
        raise Refused(f"two files are node {max(nodes, key=nodes.count)}: one file per node (rename one)")
    for f in files:
        missing = sorted(set(f.held(opts)) - set(f.gpus))
        if missing:
            where = f" on node {f.node}" if f.part else ""
            raise Refused(f"{f.src.name}: --gpus names GPU {', '.join(map(str, missing))}, which the recording "
                          f"does not have{where} (it has {', '.join(map(str, sorted(f.gpus)))})")
    return files


def _nodes_of(src: Source, found: Survey, opts: Options) -> list[File]:
    """A file's nodes: those its node column names (`--node` renames one), else one named by `--node`
    or the file's name."""
    column = found.mapping.node_column
    if column is None:
        return [File(src, found, opts.node or _node_name(src.name))]
    if opts.node and len(found.nodes) > 1:
        raise Refused(f"--node names one node: {src.name} names {len(found.nodes)} in its {column} column "
                      f"({', '.join(sorted(found.nodes)[:5])}{', ...' if len(found.nodes) > 5 else ''})")
    return [File(src, found, opts.node or part, part) for part in sorted(found.nodes)]


class _Node:
    """One node's agent in the second pass: its GPUs' UUIDs and the batches it has sent."""

    def __init__(self, f: File, files: list[File], opts: Options, job_id: str, first: datetime) -> None:
        gpus, held = f.gpus, f.held(opts)
        own = f.instance.removeprefix(f"import-{f.found.digest[:40]}").lstrip("-")[:8]
        self.uuids = {i: gpus[i].uuid or "-".join(filter(None, ("GPU", f.found.digest[:12], own, str(i))))
                      for i in held}
        self.agent = wire.AgentInfo(instance=f.instance, node=f.node, cluster=opts.cluster,
                                    version=dist_version("jobpulse"), started_at=first)
        tags = {"imported_from": ", ".join(dict.fromkeys(x.src.name for x in files))[:200], "format": f.found.fmt}
        lacks = sorted({what for x in files for what in x.found.lacks})
        if lacks:
            tags["not_measured"] = ", ".join(lacks)
        if any(x.found.stand_in for x in files):
            tags["utilization"] = STAND_IN
        self.start = wire.JobRecord(
            job_id=job_id, user_name=opts.user, partition=opts.partition, job_name=files[0].src.name[:200],
            nodes=[x.node for x in files], gpus_total=sum(len(x.held(opts)) for x in files), start_time=first,
            state="RUNNING", tags=tags, gpus=[wire.JobGpu(self.uuids[i], i, gpus[i].pci_bus_id) for i in held])
        self.topology = [wire.TopologyGpu(ts=first, gpu_uuid=self.uuids[i], gpu_index=i,
                                          pci_bus_id=gpus[i].pci_bus_id, model=opts.model or gpus[i].model)
                         for i in held]
        self.seq, self.samples = 0, list[wire.GpuSample]()

    def batch(self, end: wire.JobRecord | None = None) -> wire.Batch:
        jobs = [self.start] if self.seq == 0 else []
        out = _batch(self.agent, self.seq, self.samples, jobs + ([end] if end else []), self.topology if self.seq == 0
                     else [])
        self.seq, self.samples = self.seq + 1, []
        return out


def batches(parts: list[File], files: list[File], opts: Options, job_id: str, shift: timedelta,
            span: tuple[datetime, datetime]) -> Iterator[wire.Batch]:
    """The second pass over one file (one read, whatever nodes it names): its readings as each of
    its nodes' agent batches, in file order."""
    first, last = span[0] + shift, span[1] + shift
    nodes = {f.part: _Node(f, files, opts, job_id, first) for f in parts}
    f = parts[0]
    for r in readings(f.src, f.found.fmt, f.found.opts):
        if not isinstance(r, Reading) or (node := nodes.get(r.node)) is None or r.gpu not in node.uuids:
            continue
        node.samples.append(wire.GpuSample(ts=aware(r.ts, opts.tz) + shift,  # type: ignore[arg-type]
                                           gpu_uuid=node.uuids[r.gpu], gpu_index=r.gpu, job_id=job_id, **r.values))
        if len(node.samples) >= SAMPLES_PER_BATCH:
            yield node.batch()
    for node in nodes.values():
        yield node.batch(wire.JobRecord(job_id=job_id, end_time=last, state="COMPLETED"))


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


def dry_run(paths: list[Path], opts: Options, now: datetime | None = None) -> str:
    """What an import would store, and what it could not read, with nothing stored."""
    now = now or datetime.now(UTC)
    with contextlib.ExitStack() as stack:
        files = surveyed([stack.enter_context(source(p, opts.input)) for p in paths], opts)
        first, last = spread([f.found for f in files])
        timed = all(f.found.timed for f in files)
        try:
            shift = placement(first, last, timed, opts, now)
        except Refused as exc:  # still say what was read: the whole file may have taken minutes
            if not timed:
                raise
            read = [line for f in _once(files) for line in describe(f.found, f.node, *_placed(f.found, timedelta(0)))]
            raise Refused("\n".join([str(exc), "what it read (nothing stored):", *read])) from None
        lines = [line for f in _once(files) for line in describe(f.found, f.node, *_placed(f.found, shift))]
    job = opts.job_id or _job_id([f.found.digest for f in files])
    where = " (moved to end now)" if opts.recent else f" (moved by {shift})" if shift else ""
    return "\n".join([*lines, f"would be job {job} on cluster {opts.cluster}{where}: nothing stored (--dry-run)"])


def _once(files: list[File]) -> list[File]:
    """One File of each recording (a file that names its nodes is several)."""
    return list({id(f.src): f for f in reversed(files)}.values())[::-1]


def _placed(found: Survey, shift: timedelta) -> tuple[datetime, datetime]:
    assert found.first is not None and found.last is not None
    return found.first + shift, found.last + shift


def import_recordings(dsn: str, paths: list[Path], opts: Options, now: datetime | None = None) -> Imported:
    """Survey every file, place them together, and store them as one job (one node per file);
    raises `RecordingError` (nothing stored) for a bad file, `Rejected`/`Unavailable` from the
    collector's own checks and storage."""
    now = now or datetime.now(UTC)
    with contextlib.ExitStack() as stack:
        files = surveyed([stack.enter_context(source(p, opts.input)) for p in paths], opts)
        span = spread([f.found for f in files])
        shift = placement(*span, all(f.found.timed for f in files), opts, now)
        job_id = opts.job_id or _job_id([f.found.digest for f in files])
        limits = Limits(oldest_day=partitions.horizon(opts.retention_days, now.date()), max_skew=opts.max_skew)
        by_file: dict[int, list[File]] = {}
        for f in files:
            by_file.setdefault(id(f.src), []).append(f)
        stored = [asyncio.run(_store(dsn, batches(parts, files, opts, job_id, shift, span), limits, now))
                  for parts in by_file.values()]
    return Imported(opts.cluster, job_id, [(f.src.name, f.node, f.found, f.held(opts), f.gpus) for f in files],
                    span[0] + shift, span[1] + shift, sum(n for n, _ in stored), sum(d for _, d in stored))


def import_recording(dsn: str, path: Path, opts: Options, now: datetime | None = None) -> Imported:
    """One recording as a job (`import_recordings` of one file)."""
    return import_recordings(dsn, [path], opts, now)


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

