"""The agent: sample -> attribute -> batch -> ship (spool), one per node, serving every job on it.

The sampling loop runs on the main thread at a fixed cadence; shipping runs on its own thread
so a slow or absent collector never delays a sample; NVML events wait on a third; the control
socket serves registrations on a fourth. Each source is timed and its failures counted, and a
failing source never stops the others.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from jobpulse.agent import exporter
from jobpulse.agent.attribution import Attributor
from jobpulse.agent.capture.stacks import Capturer
from jobpulse.agent.capture.trace import Tracer
from jobpulse.agent.control import backlog
from jobpulse.agent.control.answer import JobControl
from jobpulse.agent.control.jobs import JobRegistry
from jobpulse.agent.control.listen import ControlServer, agent_lock
from jobpulse.agent.idle_exit import IdleExit
from jobpulse.agent.nvml import Nvml
from jobpulse.agent.procfs import ProcFs
from jobpulse.agent.schedule import Schedule
from jobpulse.agent.shipping.batch import Batcher
from jobpulse.agent.shipping.send import Shipper, compress
from jobpulse.agent.shipping.spool import Spool
from jobpulse.agent.sources.app_events import EventListener
from jobpulse.agent.sources.fabric import FabricSampler
from jobpulse.agent.sources.gpu import GpuSampler
from jobpulse.agent.sources.health import HealthWatcher, lost_event
from jobpulse.agent.sources.processes import ChangeOnly, ProcessSampler
from jobpulse.agent.sources.shares import ShareSampler
from jobpulse.agent.sources.topology import snapshot
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent")


@dataclass(frozen=True)
class AgentConfig:
    """What `jobpulse-agent run` runs with (its options)."""

    node: str
    cluster: str
    control_socket: Path
    spool_dir: Path
    collector_url: str | None = None
    token_file: Path | None = None
    interval_s: float = 1.0
    flush_s: float = 1.0
    spool_max_bytes: int = 256 * 1024 * 1024
    prometheus_listen: tuple[str, int] | None = None
    dcgm_counters: Path | None = None  # a dcgm-exporter counters CSV: what /metrics shows
    hostname_label: str = "Hostname"
    events_socket: Path | None = None
    event_rate: float = 200.0
    event_burst: float = 2000.0
    exit_when_idle: bool = False
    idle_linger_s: float = 3600.0  # how long an idle agent keeps trying to empty its spool
    capture: bool = True  # sample a flagged rank's stacks when the collector asks (agent/capture/stacks.py)
    sysfs_root: Path | None = Path("/sys")  # the RDMA ports' sysfs (agent/sources/fabric.py); None: not sampled


def utcnow() -> datetime:
    return datetime.now(UTC)


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.stopping = threading.Event()
        self._flush_due = threading.Event()  # set by the sampling loop when its tick should be shipped
        # Before anything slow: a stop asked for while the agent starts (systemd, an epilog) is a
        # clean stop, not a death by the default SIGTERM action with nothing spooled or logged.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        self.lock = agent_lock(cfg.control_socket)  # before the spool and the socket: one agent per node
        self.nvml = Nvml()
        cfg.spool_dir.mkdir(parents=True, exist_ok=True)
        self.jobs = JobRegistry(self.nvml.gpus, cfg.spool_dir / "jobs.json")
        self.proc = ProcFs()
        self.attributor = Attributor(self.proc, self.jobs.uid_of, cfg.node)
        self.gpu_sampler = GpuSampler(self.nvml, self.jobs.job_of_gpu,
                                      ShareSampler(self.nvml, self.jobs.jobs_of_gpu, self.attributor.job_of))
        self.process_sampler = ProcessSampler(self.nvml, self.proc, self.attributor, self.jobs.job_ids)
        self.process_changes = ChangeOnly()  # a node's processes sent when they change (held runs counted)
        self.batcher = Batcher(cfg.node, cfg.cluster, cfg.interval_s)
        self.registry = CollectorRegistry()
        self.metrics = exporter.AgentMetrics(self.registry)
        self._last_xid: dict[str, int] = {}
        self.schedule = Schedule(cfg.interval_s, self.jobs.interval_of_gpu, self.jobs.intervals)
        self.idle_exit = IdleExit(cfg.exit_when_idle, cfg.flush_s, cfg.idle_linger_s)
        self.produced = {"gpu_samples": 0, "process_samples": 0, "fabric_samples": 0, "events": 0}
        # A node's fabric traffic is a job's when the job holds the node alone, else the node's.
        self.fabric = (FabricSampler(cfg.sysfs_root, self._sole_job, cfg.spool_dir / "fabric.json")
                       if cfg.sysfs_root else None)
        counters: tuple[exporter.CounterRow, ...] | list[exporter.CounterRow] = exporter.DEFAULT_COUNTERS
        if cfg.dcgm_counters:
            counters, skipped = exporter.read_counters(cfg.dcgm_counters)
            if skipped:
                log.warning("counters the agent does not serve", file=str(cfg.dcgm_counters), names=skipped)
        self.dcgm = exporter.DcgmCompatible(
            self.nvml.gpus, lambda: dict(self.gpu_sampler.latest), lambda: dict(self._last_xid),
            self.gpu_sampler.nvlink_kib, hostname=cfg.node, hostname_label=cfg.hostname_label,
            driver_version=self.nvml.driver_version(), counters=counters)
        self.registry.register(self.dcgm)
        self.spool: Spool | None = None
        self.shipper: Shipper | None = None
        self.tracer: Tracer | None = None
        if cfg.collector_url:
            if cfg.token_file is None:
                raise ValueError("--token-file is required with --collector")
            self.spool = Spool(cfg.spool_dir, cfg.spool_max_bytes, tally_elsewhere=cfg.control_socket.parent)
            if any(self.spool.lost_before.values()):
                log.warning("the previous run lost batches at its stop (disk full): reported as dropped",
                            **self.spool.lost_before)
                self.batcher.count_dropped(self.spool.lost_before)
            self.tracer = Tracer(cfg.node, self.attributor.job_of, self._send_to_client)
            self.capturer = Capturer(cfg.node, self.attributor.job_of, lambda answer: self.batcher.add("captures", [answer]),
                                     self._capture_refusal, tracer=self.tracer if cfg.events_socket else None)
            self.shipper = Shipper(cfg.collector_url, cfg.token_file, self.spool, self._dropped,
                                   on_captures=self.capturer.submit)
        self.health = HealthWatcher(self.nvml, self._health_event, self.jobs.jobs_of_gpu)
        self.job_control = JobControl(cfg.node, lambda: [g.uuid for g in self.nvml.gpus], self.jobs, self.attributor,
                                      self.batcher, self._spooled, self._registered)
        backlog.queue_dir(cfg.control_socket).mkdir(mode=0o700, exist_ok=True)  # ours, for the hooks to fill
        self.control = ControlServer(cfg.control_socket, self.job_control)
        self.events = (EventListener(cfg.events_socket, self.attributor, self._app_events, self._event_dropped,
                                     cfg.event_rate, cfg.event_burst,
                                     on_trace=self.tracer.on_message if self.tracer else None)
                       if cfg.events_socket else None)

    # -- sources ------------------------------------------------------------------------------
    def _source(self, name: str, fn: Callable[[], Any]) -> None:
        started = time.perf_counter()
        try:
            fn()
        except Exception:  # one broken source must not stop sampling
            self.metrics.count(self.metrics.source_failures, name)
            log.exception("source failed", source=name)
        self.metrics.source_seconds[name] = time.perf_counter() - started

    def _sole_job(self) -> str | None:
        ids = self.jobs.job_ids()
        return next(iter(ids)) if len(ids) == 1 else None

    def _send_to_client(self, address: Any, data: bytes) -> None:
        if self.events is None:
            raise OSError("no event socket")
        self.events.send_to(address, data)

    def _capture_refusal(self, job_id: str) -> str | None:
        """Why this node does not sample the job's stacks, whatever the collector asks; None: it may."""
        if not self.cfg.capture:
            return f"captures are off on node {self.cfg.node} (--no-capture)"
        if self.jobs.tags_of(job_id).get("capture") == "off":
            return f"job {job_id} opted out (capture=off)"
        return None

    def _health_event(self, event: wire.HealthEvent) -> None:
        if event.kind == "xid" and event.gpu_uuid and event.code is not None:
            self._last_xid[event.gpu_uuid] = event.code
        self.batcher.add("health_events", [event])

    def _emit(self, part: str, records: list[Any]) -> None:
        self.batcher.add(part, records)
        self.produced[part] += len(records)
        self.metrics.count(self.metrics.samples, part, len(records))

    def _registered(self) -> None:
        self.idle_exit.busy()
        if self.events:  # its first events may have come before its registration
            self.events.retry_unowned()

    def _app_events(self, events: list[tuple[wire.AppEvent, int]]) -> None:
        over = self.batcher.add_events(events)
        self.produced["events"] += len(events)
        self.metrics.count(self.metrics.samples, "events", len(events) - over)
        if over:
            self.metrics.count(self.metrics.dropped, "events_over_budget", over)

    def _event_dropped(self, reason: str, n: int) -> None:
        self.batcher.count_dropped({"events": n})
        self.metrics.count(self.metrics.dropped, f"events_{reason}", n)

    def _take_queued(self) -> None:
        for t in backlog.drain(self.cfg.control_socket, self.job_control):
            if t.op is None:
                log.error("a queued control request dropped", file=t.file, error=t.error)
            else:
                log.info("queued control request taken", job=t.job, op=t.op, ok=t.error is None, error=t.error)

    def sample_once(self) -> None:
        # Requests a hook could not hand over in time, before the samples: their jobs' processes count.
        self._source("queue", self._take_queued)
        ts, now = utcnow(), time.monotonic()
        due = self.schedule.gpu_due
        self._source("gpus", lambda: self._emit("gpu_samples", self.gpu_sampler.sample(ts, lambda g: due(g.uuid, now))))
        if self.fabric is not None:
            fabric = self.fabric
            self._source("fabric", lambda: self._emit("fabric_samples", fabric.sample(ts)))
        if self.schedule.processes_due(now):
            self._source("processes", lambda: self._emit("process_samples",
                                                              self.process_changes(self.process_sampler.sample(ts), ts)))
        for g in self.nvml.take_lost():
            jobs: Sequence[str | None] = self.jobs.jobs_of_gpu(g.uuid) or [None]
            self.batcher.add("health_events", [lost_event(g, job) for job in jobs])

    # -- shipping -------------------------------------------------------------------------------
    def _spooled(self) -> int:
        return len(self.spool) if self.spool else 0

    def _dropped(self, counts: dict[str, int]) -> None:
        self.batcher.count_dropped(counts)
        for kind, n in counts.items():
            if n:
                self.metrics.count(self.metrics.dropped, kind, n)

    def flush(self) -> None:
        ready = self.batcher.take()
        if ready is None or self.spool is None:
            return
        body, counts = compress(ready)
        dropped = self.spool.put(body, counts)
        if any(dropped.values()):
            log.warning("spool full: oldest batches dropped", **dropped)
            self._dropped(dropped)

    def _ship_loop(self) -> None:
        """Flush and ship when the sampling loop says a flush is due (right after its tick), or on its
        own when none came: after twice ``flush_s`` while ticks come at least that often (sampling is
        stuck, NVML hung), after ``flush_s`` when they come less often: events still go out."""
        next_try = 0.0
        while not self.stopping.is_set():
            self._flush_due.wait(self.cfg.flush_s * (2 if self.schedule.tick_s() <= self.cfg.flush_s else 1))
            self._flush_due.clear()
            if self.stopping.is_set():
                break
            self._source("flush", self.flush)
            if self.shipper and time.monotonic() >= next_try:
                self._source("ship", self.shipper.drain)
                next_try = time.monotonic() + self.shipper.backoff_s
                self.metrics.batches_sent = self.shipper.sent
            if self.spool:
                self.metrics.spool_bytes = self.spool.size()

    # -- lifecycle -------------------------------------------------------------------------------
    def run(self) -> None:
        if self.cfg.prometheus_listen:
            host, port = self.cfg.prometheus_listen
            exporter.serve(self.registry, host, port, self.dcgm.bare_counters)
        self.control.serve_in_thread()
        self.health.start()
        if self.events:
            self.events.start()
        self.batcher.add("topology", snapshot(self.nvml, utcnow()))
        for g in self.nvml.gpus:
            self.metrics.unsupported[g.uuid] = len(g.failed)
        shipper = threading.Thread(target=self._ship_loop, name="ship", daemon=True)
        shipper.start()
        log.info("agent started", node=self.cfg.node, gpus=len(self.nvml.gpus), instance=self.batcher.agent.instance,
                 collector=self.cfg.collector_url, interval_s=self.cfg.interval_s)
        next_flush = 0.0
        # Ticks on the wall clock's grid; one that NVML made late is skipped, never made up in a burst.
        while not self.stopping.wait(self.schedule.next_tick(time.time())):
            self.sample_once()
            if time.monotonic() >= next_flush:  # ship what this tick sampled now, not up to a second later
                next_flush = time.monotonic() + self.cfg.flush_s - self.schedule.tick_s() / 2
                self._flush_due.set()
            if self.idle_exit.done(len(self.jobs.job_ids()), self._spooled(), time.monotonic()):
                break
        self.stop(shipper)

    def stop(self, shipper: threading.Thread) -> None:
        """Spool what is left and try once to send it; the spool keeps the rest for the next start.
        The control socket closes first: a prolog must not register a job with an agent that is
        leaving (it waits for the lock to go and starts the next one)."""
        self.stopping.set()
        self._flush_due.set()  # the shipping thread stops waiting for the next tick
        self.control.close()
        self.health.stopping.set()
        if self.events:
            self.events.close()
        shipper.join(timeout=self.cfg.flush_s + 15)
        self._emit("process_samples", self.process_changes.flush())  # the held run: every tick is sent
        self.flush()
        if self.shipper:
            self.shipper.conn.timeout_s = 3.0
            self.shipper.drain()
        lost = self.spool.close() if self.spool else {}
        if any(lost.values()) and self.spool is not None and self.spool.tallied:
            log.error("batches the full disk could not take at stop: counted, reported by the next start", **lost)
        elif any(lost.values()):
            log.error("batches the full disk could not take at stop: lost, and the count could not be kept", **lost)
        if self.fabric is not None:
            self.fabric.close()
        self.nvml.shutdown()
        log.info("agent stopped", spooled=len(self.spool) if self.spool else 0, instance=self.batcher.agent.instance,
                 produced=self.produced, lost_at_stop=lost)
