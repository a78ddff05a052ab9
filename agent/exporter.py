"""Prometheus exposition of the latest samples under dcgm-exporter's metric names, with an
``hpc_job`` label, so dashboards built for dcgm-exporter work unchanged; plus the agent's
own health (per-source duration and failures, spool size, drops)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from jobpulse.agent.nvml import Gpu
from jobpulse.schema import wire
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# dcgm-exporter name -> (help, value from a GpuSample)
DCGM: dict[str, tuple[str, Callable[[wire.GpuSample], Any]]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", lambda s: s.sm_util),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("Memory utilization (in %).", lambda s: s.mem_util),
    "DCGM_FI_DEV_ENC_UTIL": ("Encoder utilization (in %).", lambda s: s.enc_util),
    "DCGM_FI_DEV_DEC_UTIL": ("Decoder utilization (in %).", lambda s: s.dec_util),
    "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", lambda s: s.fb_used_mib),
    "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).",
                            lambda s: None if s.fb_total_mib is None or s.fb_used_mib is None
                            else s.fb_total_mib - s.fb_used_mib),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", lambda s: s.power_w),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("Total energy consumption since boot (in mJ).", lambda s: s.energy_mj),
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", lambda s: s.gpu_temp_c),
    "DCGM_FI_DEV_MEMORY_TEMP": ("Memory temperature (in C).", lambda s: s.mem_temp_c),
    "DCGM_FI_DEV_SM_CLOCK": ("SM clock frequency (in MHz).", lambda s: s.sm_clock_mhz),
    "DCGM_FI_DEV_MEM_CLOCK": ("Memory clock frequency (in MHz).", lambda s: s.mem_clock_mhz),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("Total number of PCIe retries.", lambda s: s.pcie_replay),
    "DCGM_FI_PROF_SM_ACTIVE": ("Ratio of cycles an SM has at least 1 warp assigned.",
                               lambda s: None if s.gpm_sm_active is None else s.gpm_sm_active / 100),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("Ratio of warps resident to the theoretical maximum.",
                                  lambda s: None if s.gpm_sm_occupancy is None else s.gpm_sm_occupancy / 100),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("Ratio of cycles the tensor pipe is active.",
                                        lambda s: None if s.gpm_tensor_active is None else s.gpm_tensor_active / 100),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("Ratio of cycles the memory interface is active.",
                                 lambda s: None if s.gpm_dram_bw is None else s.gpm_dram_bw / 100),
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
