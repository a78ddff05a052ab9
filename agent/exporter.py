"""Prometheus exposition of the latest samples under dcgm-exporter's metric names, with an
``hpc_job`` label, so dashboards built for dcgm-exporter work unchanged; plus the agent's
own health (per-source duration and failures, spool size, drops)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jobpulse.agent.nvml import Gpu
from jobpulse.schema import wire
from jobpulse.schema.fields import GPU_FIELDS


def _field_value(name: str, scale: float) -> Callable[[wire.GpuSample], Any]:
    def get(s: wire.GpuSample) -> Any:
        v = getattr(s, name)
        return None if v is None else v * scale
    return get


def _fb_free(s: wire.GpuSample) -> int | None:
    return None if s.fb_total_mib is None or s.fb_used_mib is None else s.fb_total_mib - s.fb_used_mib


# dcgm-exporter name -> (help, value from a GpuSample): every field the table names for dcgm-exporter,
# plus what dcgm-exporter derives from two of them. All exposed as gauges (the table keeps the type).
DCGM: dict[str, tuple[str, Callable[[wire.GpuSample], Any]]] = {
    **{f.dcgm.name: (f.dcgm.help, _field_value(f.name, f.dcgm.scale)) for f in GPU_FIELDS if f.dcgm},
    "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).", _fb_free),
}
LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hpc_job"]


class DcgmCompatible(Collector):
    def __init__(self, gpus: list[Gpu], hostname: str, latest: Callable[[], dict[str, wire.GpuSample]],
                 last_xid: Callable[[], dict[str, int]]) -> None:
        self.gpus = gpus
        self.hostname = hostname
        self.latest = latest
        self.last_xid = last_xid

    def collect(self) -> Iterator[GaugeMetricFamily]:
        samples = self.latest()
        xids = self.last_xid()
        families = {name: GaugeMetricFamily(name, help_, labels=LABELS) for name, (help_, _) in DCGM.items()}
        xid = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=LABELS)
        for g in self.gpus:
            s = samples.get(g.uuid)
            if s is None:
                continue
            labels = [str(g.index), g.uuid, g.pci_bus_id or "", f"nvidia{g.minor if g.minor is not None else g.index}",
                      g.name or "", self.hostname, s.job_id or ""]
            for name, (_, get) in DCGM.items():
                value = get(s)
                if value is not None:
                    families[name].add_metric(labels, float(value))
            xid.add_metric(labels, float(xids.get(g.uuid, 0)))
        yield from families.values()
        yield xid


class AgentMetrics:
    """The agent's own metrics, registered beside the GPU ones."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.source_seconds = Gauge("jobpulse_agent_source_duration_seconds", "Duration of the last run of a source",
                                    ["source"], registry=registry)
        self.source_failures = Counter("jobpulse_agent_source_failures", "Source runs that raised", ["source"],
                                       registry=registry)
        self.unsupported = Gauge("jobpulse_agent_unsupported_fields", "Fields NVML does not provide, per GPU",
                                 ["UUID"], registry=registry)
        self.spool_bytes = Gauge("jobpulse_agent_spool_bytes", "Bytes waiting in the spool", registry=registry)
        self.dropped = Counter("jobpulse_agent_dropped", "Records dropped (spool full, refused)", ["kind"],
                               registry=registry)
        self.samples = Counter("jobpulse_agent_samples", "Records sampled", ["kind"], registry=registry)
        self.batches_sent = Gauge("jobpulse_agent_batches_sent", "Batches acknowledged by the collector",
                                  registry=registry)
