"""Prometheus exposition of the latest samples as dcgm-exporter names them (metric names, types,
units, labels, and its counters-file format to choose them), with an ``hpc_job`` label, so its
dashboards work unchanged; plus the agent's own health (per-source duration and failures, spool
size, drops, batches delivered)."""

from __future__ import annotations

import csv
import errno
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from jobpulse.agent.nvml import Gpu
from jobpulse.schema import wire
from jobpulse.schema.fields import GPU_FIELDS

MetricType = Literal["gauge", "counter"]
HOSTNAME_LABELS = ("Hostname", "hostname", "none")  # dcgm-exporter before 3.3, since, or --no-hostname


@dataclass(frozen=True)
class GpuState:
    """What a metric is computed from: the GPU's latest sample and what the agent keeps beside it."""

    sample: wire.GpuSample
    last_xid: int
    nvlink_kib: int | None  # NVLink data sent + received since driver load, all links


@dataclass(frozen=True)
class Exposable:
    """A dcgm-exporter metric the agent can serve: its own type and help, and how to get its value."""

    type: MetricType
    help: str
    value: Callable[[GpuState], Any]


def _field(name: str, scale: float) -> Callable[[GpuState], Any]:
    def get(state: GpuState) -> Any:
        v = getattr(state.sample, name)
        return None if v is None else v * scale
    return get


def _fb_free(state: GpuState) -> int | None:
    s = state.sample
    if s.fb_total_mib is None or s.fb_used_mib is None:
        return None
    return s.fb_total_mib - s.fb_used_mib - (s.fb_reserved_mib or 0)


# Every field the table names for dcgm-exporter, plus what the agent derives for it.
EXPOSABLE: dict[str, Exposable] = {
    **{f.dcgm.name: Exposable(f.dcgm.type, f.dcgm.help, _field(f.name, f.dcgm.scale)) for f in GPU_FIELDS if f.dcgm},
    "DCGM_FI_DEV_FB_FREE": Exposable("gauge", "Framebuffer memory free (in MiB).", _fb_free),
    "DCGM_FI_DEV_XID_ERRORS": Exposable("gauge", "Value of the last XID error encountered.", lambda s: s.last_xid),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": Exposable(
        "counter", "NVLink data bytes sent and received, all links, since driver load.",
        lambda s: None if s.nvlink_kib is None else s.nvlink_kib * 1024),
}
# dcgm-exporter's `label` rows: a label on every metric, named as the field.
LABEL_FIELDS = ("DCGM_FI_DRIVER_VERSION",)


@dataclass(frozen=True)
class CounterRow:
    """One row of a dcgm-exporter counters file: ``DCGM_FI_NAME, gauge|counter|label, help``."""

    name: str
    type: str
    help: str


DEFAULT_COUNTERS: tuple[CounterRow, ...] = (
    *(CounterRow(name, m.type, m.help) for name, m in EXPOSABLE.items()),
    CounterRow("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
)


def read_counters(path: Path) -> tuple[list[CounterRow], list[str]]:
    """The rows of a counters file as dcgm-exporter reads it (``#`` comments, three fields,
    spaces trimmed), and the names in it the agent does not serve (DCGM-only fields, profiling
    metrics NVML lacks), which dcgm-exporter would serve and the agent skips.

    A malformed row is a ValueError naming the file, the line and what is wrong."""
    rows: list[CounterRow] = []
    skipped: list[str] = []
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"counters file {path}: {exc.strerror}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        record = [f.strip() for f in next(csv.reader([line]))]
        if len(record) != 3:
            raise ValueError(f"{path}:{number}: expected 'DCGM_FI_NAME, type, help', got {line.strip()!r}")
        name, typ, help_ = record
        if typ not in ("gauge", "counter", "label"):
            raise ValueError(f"{path}:{number}: type must be gauge, counter or label, got {typ!r}")
        if name in EXPOSABLE or name in LABEL_FIELDS:
            rows.append(CounterRow(name, typ, help_))
        else:
            skipped.append(name)
    return rows, skipped


class DcgmCompatible(Collector):
    """The GPU metrics, as dcgm-exporter would show them for the chosen counters."""

    def __init__(self, gpus: list[Gpu], latest: Callable[[], dict[str, wire.GpuSample]],
                 last_xid: Callable[[], dict[str, int]], nvlink_kib: Callable[[], dict[str, int]], *,
                 hostname: str, hostname_label: str = "Hostname", driver_version: str | None = None,
                 counters: tuple[CounterRow, ...] | list[CounterRow] = DEFAULT_COUNTERS) -> None:
        self.gpus = gpus
        self.latest = latest
        self.last_xid = last_xid
        self.nvlink_kib = nvlink_kib
        self.metrics = [c for c in counters if c.type != "label"]
        self.bare_counters = {c.name for c in self.metrics if c.type == "counter"}
        # Fixed labels, in dcgm-exporter's order: host, then the `label` rows.
        self.fixed: dict[str, str] = {}
        if hostname_label != "none":
            self.fixed[hostname_label] = hostname
        if any(c.name == "DCGM_FI_DRIVER_VERSION" for c in counters if c.type == "label") and driver_version:
            self.fixed["DCGM_FI_DRIVER_VERSION"] = driver_version

    def collect(self) -> Iterator[Metric]:
        samples, xids, nvlink = self.latest(), self.last_xid(), self.nvlink_kib()
        families = {c.name: Metric(c.name, c.help, c.type) for c in self.metrics}
        for g in self.gpus:
            s = samples.get(g.uuid)
            if s is None:
                continue
            state = GpuState(s, xids.get(g.uuid, 0), nvlink.get(g.uuid))
            # A MIG instance as dcgm-exporter labels it: its parent's identity plus GPU_I_PROFILE and GPU_I_ID.
            d = g.parent or g
            labels = {"gpu": str(d.index), "UUID": d.uuid, "pci_bus_id": d.pci_bus_id or "",
                      "device": f"nvidia{d.minor if d.minor is not None else d.index}", "modelName": d.name or "",
                      **({"GPU_I_PROFILE": g.profile or "", "GPU_I_ID": str(g.gi if g.gi is not None else "")}
                         if g.parent else {}),
                      **self.fixed, "hpc_job": s.job_id or ""}
            for c in self.metrics:
                value = EXPOSABLE[c.name].value(state)
                if value is not None:
                    # The bare name for counters too (no `_total`): dcgm-exporter's dashboards query it so.
                    families[c.name].add_sample(c.name, labels, float(value))
        yield from families.values()


class AgentMetrics:
    """The agent's own metrics, registered beside the GPU ones. The loops update plain numbers
    (under one uncontended lock: no label look-up and per-child lock per update, several times a
    tick); they become Prometheus families only when scraped, and an agent nobody scrapes never
    builds them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._lock = threading.Lock()
        self.source_seconds: dict[str, float] = {}  # the duration of each source's last run
        self.source_failures: dict[str, int] = {}
        self.unsupported: dict[str, int] = {}  # GPU UUID -> fields NVML does not provide
        self.spool_bytes = 0
        self.dropped: dict[str, int] = {}
        self.samples: dict[str, int] = {}
        self.batches_sent = 0
        registry.register(self)

    def count(self, counter: dict[str, int], label: str, n: int = 1) -> None:
        """Add ``n`` to one of the labelled counters above (from any thread)."""
        with self._lock:
            counter[label] = counter.get(label, 0) + n

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            labelled: list[tuple[type[GaugeMetricFamily | CounterMetricFamily], str, str, str, dict[str, Any]]] = [
                (GaugeMetricFamily, "jobpulse_agent_source_duration_seconds", "Duration of the last run of a source",
                 "source", dict(self.source_seconds)),
                (CounterMetricFamily, "jobpulse_agent_source_failures", "Source runs that raised", "source",
                 dict(self.source_failures)),
                (GaugeMetricFamily, "jobpulse_agent_unsupported_fields", "Fields NVML does not provide, per GPU",
                 "UUID", dict(self.unsupported)),
                (CounterMetricFamily, "jobpulse_agent_dropped", "Records dropped (spool full, refused)", "kind",
                 dict(self.dropped)),
                (CounterMetricFamily, "jobpulse_agent_samples", "Records sampled", "kind", dict(self.samples))]
            spool_bytes, sent = self.spool_bytes, self.batches_sent
        for family, name, help_text, label, values in labelled:
            metric = family(name, help_text, labels=[label])
            for value_label, value in values.items():
                metric.add_metric([value_label], value)
            yield metric
        yield GaugeMetricFamily("jobpulse_agent_spool_bytes", "Bytes waiting in the spool", value=spool_bytes)
        yield CounterMetricFamily("jobpulse_agent_batches_sent", "Batches acknowledged by the collector", value=sent)


def exposition(registry: CollectorRegistry, bare_counters: set[str]) -> bytes:
    """The text format as prometheus_client writes it, except for dcgm-exporter's counters: their
    samples carry the bare name (no ``_total``), and so must their HELP and TYPE lines, or
    Prometheus would not know them for counters."""
    text = generate_latest(registry).decode()
    for name in bare_counters:
        text = text.replace(f"# HELP {name}_total ", f"# HELP {name} ", 1)
        text = text.replace(f"# TYPE {name}_total counter\n", f"# TYPE {name} counter\n", 1)
    return text.encode()


def serve(registry: CollectorRegistry, host: str, port: int, bare_counters: set[str]) -> ThreadingHTTPServer:
    """/metrics on HOST:PORT in a daemon thread; a port already taken (dcgm-exporter keeps 9400)
    is an error naming it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exposition(registry, bare_counters)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            """Scrapes are not news."""

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise OSError(f"--prometheus-listen {host}:{port}: the port is taken by another program "
                          f"(dcgm-exporter uses 9400); choose another port") from None
        raise
    server.daemon_threads = True
    # No poll timeout: the server lives as long as the agent, so nothing needs the thread to wake.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": None}, name="metrics", daemon=True).start()
    return server
