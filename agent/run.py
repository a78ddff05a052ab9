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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec
import structlog
from prometheus_client import CollectorRegistry, start_http_server

from jobpulse.agent.attribution import Attributor
from jobpulse.agent.batch import Batcher
from jobpulse.agent.control import ControlServer
from jobpulse.agent.exporter import AgentMetrics, DcgmCompatible
from jobpulse.agent.jobs import JobRegistry, RegistrationError
from jobpulse.agent.nvml import Nvml
from jobpulse.agent.procfs import ProcFs
from jobpulse.agent.ship import Shipper, compress
from jobpulse.agent.slurm_meta import job_metadata
from jobpulse.agent.sources.app_events import EventListener
from jobpulse.agent.sources.gpu import GpuSampler
from jobpulse.agent.sources.health import HealthWatcher, lost_event
from jobpulse.agent.sources.processes import ProcessSampler
from jobpulse.agent.sources.topology import snapshot
from jobpulse.agent.spool import Spool
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent")


@dataclass(frozen=True)
class AgentConfig:
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
    events_socket: Path | None = None
    event_rate: float = 200.0
    event_burst: float = 2000.0
    exit_when_idle: bool = False
    idle_linger_s: float = 3600.0  # how long an idle agent keeps trying to empty its spool


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Agent:
    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.stopping = threading.Event()
        self.nvml = Nvml()
        cfg.spool_dir.mkdir(parents=True, exist_ok=True)
        self.jobs = JobRegistry(self.nvml.gpus, cfg.spool_dir / "jobs.json")
        self.proc = ProcFs()
        self.attributor = Attributor(self.proc, self.jobs.uid_of, cfg.node)
        self.gpu_sampler = GpuSampler(self.nvml, self.jobs.job_of_gpu)
        self.process_sampler = ProcessSampler(self.nvml, self.proc, self.attributor, self.jobs.job_ids)
        self.batcher = Batcher(cfg.node, cfg.cluster)
        self.registry = CollectorRegistry()
        self.metrics = AgentMetrics(self.registry)
        self._last_xid: dict[str, int] = {}
        self._next_due: dict[str, float] = {}
        self._next_processes = 0.0
        self._idle_since: float | None = None
        self.produced = {"gpu_samples": 0, "process_samples": 0, "events": 0}
        self.registry.register(DcgmCompatible(self.nvml.gpus, cfg.node, lambda: dict(self.gpu_sampler.latest),
                                              lambda: dict(self._last_xid)))
        self.spool: Spool | None = None
        self.shipper: Shipper | None = None
        if cfg.collector_url:
            if cfg.token_file is None:
                raise ValueError("--token-file is required with --collector")
            self.spool = Spool(cfg.spool_dir, cfg.spool_max_bytes)
            self.shipper = Shipper(cfg.collector_url, cfg.token_file, self.spool, self._dropped)
        self.health = HealthWatcher(self.nvml, self._health_event, self.jobs.job_of_gpu)
        self.control = ControlServer(cfg.control_socket, self._control)
        self.events = (EventListener(cfg.events_socket, self.attributor, self._app_events, self._event_dropped,
                                     cfg.event_rate, cfg.event_burst) if cfg.events_socket else None)

    # -- sources ------------------------------------------------------------------------------
    def _source(self, name: str, fn: Callable[[], Any]) -> None:
        started = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001 - one broken source must not stop sampling
            self.metrics.source_failures.labels(name).inc()
            log.exception("source failed", source=name)
        self.metrics.source_seconds.labels(name).set(time.perf_counter() - started)

    def _health_event(self, event: wire.HealthEvent) -> None:
        if event.kind == "xid" and event.gpu_uuid and event.code is not None:
            self._last_xid[event.gpu_uuid] = event.code
        self.batcher.add("health_events", [event])

    def _emit(self, part: str, records: list[Any]) -> None:
        self.batcher.add(part, records)
        self.produced[part] += len(records)
        self.metrics.samples.labels(part).inc(len(records))

    def _app_events(self, events: list[wire.AppEvent]) -> None:
        self._emit("events", events)

    def _event_dropped(self, reason: str, n: int) -> None:
        self.batcher.count_dropped({"events": n})
        self.metrics.dropped.labels(f"events_{reason}").inc(n)

    def tick_interval(self) -> float:
        """The main loop's period: the default, or faster when a job asked for it."""
        return min([self.cfg.interval_s, *self.jobs.intervals()])

    def _due(self, g: Any, now: float) -> bool:
        if now + 0.01 < self._next_due.get(g.uuid, 0.0):
            return False
        interval = self.jobs.interval_of_gpu(g.uuid) or self.cfg.interval_s
        self._next_due[g.uuid] = max(self._next_due.get(g.uuid, now) + interval, now)
        return True

    def sample_once(self) -> None:
        ts, now = utcnow(), time.monotonic()
        self._source("gpus", lambda: self._emit("gpu_samples", self.gpu_sampler.sample(ts, lambda g: self._due(g, now))))
        if now + 0.01 >= self._next_processes:
            self._next_processes = max(self._next_processes + self.cfg.interval_s, now)
            self._source("processes", lambda: self._emit("process_samples", self.process_sampler.sample(ts)))
        for g in self.nvml.take_lost():
            self.batcher.add("health_events", [lost_event(g, self.jobs.job_of_gpu(g.uuid))])

    # -- control ------------------------------------------------------------------------------
    def _control(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        try:
            if op == "register":
                record = self.jobs.register(dict(msg["job"]))
                self.attributor.retry_unowned()
                self.batcher.add("jobs", [record])
                self._idle_since = None
                threading.Thread(target=self._enrich, args=(record.job_id,), daemon=True).start()
                log.info("job registered", job=record.job_id, gpus=[g.gpu_uuid for g in record.gpus])
                return {"ok": True, "job_id": record.job_id, "gpus": [g.gpu_uuid for g in record.gpus]}
            if op == "unregister":
                record = self.jobs.unregister(str(msg["job_id"]), msg.get("state"), msg.get("exit_code"))
                self.batcher.add("jobs", [record])
                log.info("job unregistered", job=record.job_id, state=record.state)
                return {"ok": True, "job_id": record.job_id}
            if op == "status":
                return {"ok": True, "node": self.cfg.node, "instance": self.batcher.agent.instance,
                        "jobs": sorted(self.jobs.job_ids()), "gpus": [g.uuid for g in self.nvml.gpus],
                        "spooled": len(self.spool) if self.spool else 0}
        except RegistrationError as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": False, "error": f"unknown op {op!r}"}

    def _enrich(self, job_id: str) -> None:
        """Add what only slurmctld knows (account, name, limits) without holding up the prolog."""
        meta = job_metadata(job_id)
        if meta:
            try:
                self.batcher.add("jobs", [msgspec.convert(meta, wire.JobRecord)])
            except msgspec.ValidationError as exc:
                log.info("squeue metadata unusable", job=job_id, error=str(exc))

    def _idle_done(self) -> bool:
        """With --exit-when-idle: no job left for a moment and nothing left to send (or given up)."""
        if not self.cfg.exit_when_idle or self.jobs.job_ids():
            self._idle_since = None
            return False
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < 2 * self.cfg.flush_s + 1:
            return False  # let the last samples and the unregistration go out first
        empty = self.spool is None or len(self.spool) == 0
        if not empty and now - self._idle_since < self.cfg.idle_linger_s:
            return False
        log.info("no job left: exiting", spooled=len(self.spool) if self.spool else 0)
        return True

    # -- shipping -------------------------------------------------------------------------------
    def _dropped(self, counts: dict[str, int]) -> None:
        self.batcher.count_dropped(counts)
        for kind, n in counts.items():
            if n:
                self.metrics.dropped.labels(kind).inc(n)

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
        next_try = 0.0
        while not self.stopping.wait(self.cfg.flush_s):
            self._source("flush", self.flush)
            if self.shipper and time.monotonic() >= next_try:
                self._source("ship", self.shipper.drain)
                next_try = time.monotonic() + self.shipper.backoff_s
                self.metrics.batches_sent.set(self.shipper.sent)
            if self.spool:
                self.metrics.spool_bytes.set(self.spool.size())

    # -- lifecycle -------------------------------------------------------------------------------
    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        if self.cfg.prometheus_listen:
            host, port = self.cfg.prometheus_listen
            start_http_server(port, addr=host, registry=self.registry)
        self.control.serve_in_thread()
        self.health.start()
        if self.events:
            self.events.start()
        self.batcher.add("topology", snapshot(self.nvml, utcnow()))
        for g in self.nvml.gpus:
            self.metrics.unsupported.labels(g.uuid).set(len(g.failed))
        shipper = threading.Thread(target=self._ship_loop, name="ship", daemon=True)
        shipper.start()
        log.info("agent started", node=self.cfg.node, gpus=len(self.nvml.gpus), instance=self.batcher.agent.instance,
                 collector=self.cfg.collector_url, interval_s=self.cfg.interval_s)
        next_tick = time.monotonic()
        while not self.stopping.is_set():
            self.sample_once()
            if self._idle_done():
                break
            next_tick += self.tick_interval()
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind (slow NVML): skip the missed ticks rather than burst
                next_tick = time.monotonic()
                delay = 0
            self.stopping.wait(delay)
        self.stop(shipper)

    def stop(self, shipper: threading.Thread) -> None:
        """Spool what is left and try once to send it; the spool keeps the rest for the next start."""
        self.stopping.set()
        self.health.stopping.set()
        if self.events:
            self.events.close()
        shipper.join(timeout=self.cfg.flush_s + 15)
        self.flush()
        if self.shipper:
            self.shipper.timeout_s = 3.0
            self.shipper.drain()
        self.control.close()
        self.nvml.shutdown()
        log.info("agent stopped", spooled=len(self.spool) if self.spool else 0, instance=self.batcher.agent.instance,
                 produced=self.produced)
