"""Sample: every GPU as `nvidia-smi dmon -s pucvmet` sees it, plus NVLink rates and GPM.

Counters NVML keeps as totals (NVLink KiB) become rates between two samples; GPM metrics
come from two GPM samples one interval apart. The job holding a GPU is the registration's.
A MIG instance gets its own row: its memory and GPM (through its parent) are its own; the fields
the table marks ``per_parent`` (power, clocks, temperature, PCIe, NVLink, ECC) are its parent's,
read once per tick on the parent.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pynvml

from jobpulse.agent.nvml import Gpu, Nvml
from jobpulse.agent.sources.shares import ShareSampler
from jobpulse.schema import wire
from jobpulse.schema.fields import GPU_BY_NAME, GPU_FIELDS, PER_PARENT

_NVLINK_TX, _NVLINK_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
# Fields NVML gives as field values, read in one call (a binding too old to name one skips it) ...
_FIELD_IDS = {f.name: getattr(pynvml, f.nvml_field) for f in GPU_FIELDS
              if f.nvml_field and hasattr(pynvml, f.nvml_field)}
# ... and GPM metrics, computed from two GPM samples
_GPM = {f.name: getattr(pynvml, f.nvml_gpm) for f in GPU_FIELDS if f.nvml_gpm and hasattr(pynvml, f.nvml_gpm)}
MIB = 1024 * 1024
STATIC_REFRESH_S = 60.0  # limits (max clocks, max PCIe link, power limit) change rarely: read once a minute


def _pct(v: float | None) -> float | None:
    return None if v is None else min(100.0, max(0.0, v))


class GpuSampler:
    def __init__(self, nvml: Nvml, job_of_gpu: Callable[[str], str | None], shares: ShareSampler | None = None) -> None:
        self.nvml = nvml
        self.job_of_gpu = job_of_gpu
        self.shares = shares
        self._nvlink: dict[str, tuple[float, int, int]] = {}  # uuid -> (time, tx KiB, rx KiB)
        self._gpm_prev: dict[str, Any] = {}
        self._gpm = {g.uuid: nvml.gpm_supported(g) for g in nvml.gpus}
        self._static: dict[str, tuple[float, dict[str, Any]]] = {}
        self.latest: dict[str, wire.GpuSample] = {}

    def sample(self, ts: datetime, due: Callable[[Gpu], bool] = lambda g: True) -> list[wire.GpuSample]:
        """One sample of every GPU that is ``due`` (jobs may sample their GPUs faster than others)."""
        out: list[wire.GpuSample] = []
        taken: dict[str, wire.GpuSample] = {}
        for g in self.nvml.gpus:
            # A GPU in MIG mode is read whenever one of its instances is: they take its per-parent fields.
            if g.lost or not (due(g) or any(due(i) for i in self.nvml.gpus if i.parent is g)):
                continue
            s = self._instance(g, ts, taken.get(g.parent.uuid)) if g.parent else self._one(g, ts)
            if not g.lost:
                self.latest[g.uuid] = taken[g.uuid] = s
                out += [s, *(self.shares.rows(g, s) if self.shares and not g.mig else ())]
        return out

    def _instance(self, g: Gpu, ts: datetime, parent: wire.GpuSample | None) -> wire.GpuSample:
        """A MIG instance: NVML gives its memory (and GPM through the parent); the rest is the parent's."""
        mem = self.nvml.memory(g)
        inherited = {name: getattr(parent, name) for name in PER_PARENT} if parent else {}
        return wire.GpuSample(
            ts=ts, gpu_uuid=g.uuid, gpu_index=g.index, job_id=self.job_of_gpu(g.uuid),
            fb_used_mib=mem[0] // MIB if mem else None, fb_total_mib=mem[1] // MIB if mem else None,
            fb_reserved_mib=mem[2] // MIB if mem and mem[2] is not None else None,
            **inherited, **self._gpm_metrics(g))

    def _one(self, g: Gpu, ts: datetime) -> wire.GpuSample:
        n = self.nvml
        util = n.utilization(g)
        mem = n.memory(g)
        power = n.scalar(g, "power_mw")
        static = self._limits(g, ts)
        remap = n.remapped_rows(g)
        values = n.field_values(g, [*_FIELD_IDS.values(), _NVLINK_TX, _NVLINK_RX])
        nvl_tx, nvl_rx = self._nvlink_rates(g, ts, values)
        return wire.GpuSample(
            ts=ts, gpu_uuid=g.uuid, gpu_index=g.index, job_id=self.job_of_gpu(g.uuid),
            sm_util=util[0] if util else None, mem_util=util[1] if util else None,
            enc_util=n.engine(g, "enc"), dec_util=n.engine(g, "dec"), jpg_util=n.engine(g, "jpg"),
            ofa_util=n.engine(g, "ofa"),
            power_w=None if power is None else power / 1000.0,
            energy_mj=n.scalar(g, "energy_mj"), gpu_temp_c=n.temperature(g),
            sm_clock_mhz=n.clock(g, "sm"), mem_clock_mhz=n.clock(g, "mem"),
            fb_used_mib=mem[0] // MIB if mem else None, fb_total_mib=mem[1] // MIB if mem else None,
            fb_reserved_mib=mem[2] // MIB if mem and mem[2] is not None else None,
            pcie_rx_kbs=n.pcie_kbs(g, "rx"), pcie_tx_kbs=n.pcie_kbs(g, "tx"),
            pcie_gen=n.scalar(g, "pcie_gen"), pcie_width=n.scalar(g, "pcie_width"),
            pcie_replay=n.scalar(g, "pcie_replay"), nvlink_rx_kbs=nvl_rx, nvlink_tx_kbs=nvl_tx,
            clock_event_reasons=n.scalar(g, "clock_event_reasons"),
            ecc_sbe_total=n.ecc_total(g, uncorrected=False), ecc_dbe_total=n.ecc_total(g, uncorrected=True),
            remapped_correctable=remap[0] if remap else None, remapped_uncorrectable=remap[1] if remap else None,
            remap_pending=remap[2] if remap else None, remap_failure=remap[3] if remap else None,
            **static, **{name: values.get(fid) for name, fid in _FIELD_IDS.items()}, **self._gpm_metrics(g),
        )

    def _limits(self, g: Gpu, ts: datetime) -> dict[str, Any]:
        cached = self._static.get(g.uuid)
        if cached and ts.timestamp() - cached[0] < STATIC_REFRESH_S:
            return cached[1]
        n = self.nvml
        limit = n.scalar(g, "power_limit_mw")
        _, _, gen_max, width_max = n.pcie_link(g)
        values = {"power_limit_w": None if limit is None else limit / 1000.0,
                  "sm_clock_max_mhz": n.clock(g, "sm", maximum=True), "mem_clock_max_mhz": n.clock(g, "mem", maximum=True),
                  "pcie_gen_max": gen_max, "pcie_width_max": width_max}
        self._static[g.uuid] = (ts.timestamp(), values)
        return values

    def nvlink_kib(self) -> dict[str, int]:
        """NVLink data sent + received since driver load (KiB, all links) per GPU, as last read."""
        return {uuid: tx + rx for uuid, (_, tx, rx) in self._nvlink.items()}

    def _nvlink_rates(self, g: Gpu, ts: datetime, fields: dict[int, Any]) -> tuple[int | None, int | None]:
        if _NVLINK_TX not in fields or _NVLINK_RX not in fields:
            return None, None
        t, tx, rx = ts.timestamp(), int(fields[_NVLINK_TX]), int(fields[_NVLINK_RX])
        prev = self._nvlink.get(g.uuid)
        self._nvlink[g.uuid] = (t, tx, rx)
        if prev is None or t <= prev[0] or tx < prev[1] or rx < prev[2]:
            return None, None  # first sample, or the counter was reset
        dt = t - prev[0]
        # KiB per second -> KB/s (the unit of the PCIe fields)
        return round((tx - prev[1]) * 1.024 / dt), round((rx - prev[2]) * 1.024 / dt)

    def _gpm_metrics(self, g: Gpu) -> dict[str, float | None]:
        if not self._gpm.get(g.uuid):
            return {}
        sample = self.nvml.gpm_sample(g)
        prev, self._gpm_prev[g.uuid] = self._gpm_prev.get(g.uuid), sample
        if prev is None or sample is None:
            return {}
        got = self.nvml.gpm_metrics(g, prev, sample, list(_GPM.values()))
        self.nvml.gpm_free(prev)
        return {name: GPU_BY_NAME[name].quantize(_pct(got.get(mid))) for name, mid in _GPM.items()}
