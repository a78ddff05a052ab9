"""Sample: every GPU as `nvidia-smi dmon -s pucvmet` sees it, plus NVLink rates and GPM.

Every field NVML offers as a field value (the table's ``nvml_field``: power, energy, ECC,
remapped rows, PCIe replays, NVLink counters, ...) arrives in one `nvmlDeviceGetFieldValues` call
per GPU and sample; the rest through their own calls. Limits (enforced power limit, max clocks,
max PCIe link) are read at the first sample and again once a minute (``STATIC_REFRESH_S``), so a
changed limit shows within a minute without a read per sample. Counters NVML keeps as totals
(NVLink KiB) become rates between two samples; GPM metrics come from two GPM samples one interval
apart. The job holding a GPU is the registration's.
A MIG instance gets its own row: its memory and GPM (through its parent) are its own; the fields
the table marks ``per_parent`` (power, clocks, temperature, PCIe, NVLink, ECC) are its parent's,
read once per tick on the parent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobpulse.agent.nvml import NVLINK_RX, NVLINK_TX, Gpu, Nvml, constant, mib
from jobpulse.agent.sources.shares import ShareSampler
from jobpulse.schema import wire
from jobpulse.schema.fields import GPU_FIELDS, PER_PARENT


@dataclass(frozen=True)
class _FieldRead:
    """A table field read as a field value: its ids (the first one the GPU answers wins), and the
    one conversion from NVML's unit and type to the wire's."""

    name: str
    ids: tuple[int, ...]
    per_unit: int
    kind: type

    def value(self, values: dict[int, int | float]) -> Any:
        for i in self.ids:
            if i in values:
                return values[i] / self.per_unit if self.per_unit != 1 else self.kind(values[i])
        return None


# Fields NVML gives as field values, read in one call (a binding too old to name an id skips it) ...
_FIELD_READS = tuple(r for r in (
    _FieldRead(f.name, tuple(i for i in map(constant, (f.nvml_field, f.nvml_field_else)) if i is not None),
               f.nvml_per_unit, f.python) for f in GPU_FIELDS if f.nvml_field) if r.ids)
_FIELD_IDS = tuple((fid, 0) for fid in dict.fromkeys([i for r in _FIELD_READS for i in r.ids] + [NVLINK_TX, NVLINK_RX]))
"""(field id, scope id) pairs: scope 0 is the GPU's own reading (power fields also have a module scope)."""
# ... and GPM metrics, computed from two GPM samples
_GPM = tuple((f, mid) for f in GPU_FIELDS if (mid := constant(f.nvml_gpm)) is not None)
_GPM_IDS = tuple(mid for _, mid in _GPM)
# Wire fields read each sample through one of `nvml.READS` (by its name there) ...
_SAMPLE_READS = (("enc_util", "enc_util"), ("dec_util", "dec_util"), ("jpg_util", "jpg_util"), ("ofa_util", "ofa_util"),
                 ("gpu_temp_c", "temperature"), ("sm_clock_mhz", "sm_clock"), ("mem_clock_mhz", "mem_clock"),
                 ("pcie_rx_kbs", "pcie_rx"), ("pcie_tx_kbs", "pcie_tx"), ("pcie_gen", "pcie_gen"),
                 ("pcie_width", "pcie_width"), ("clock_event_reasons", "clock_event_reasons"))
# ... and the limits, once a minute
_LIMIT_READS = (("sm_clock_max_mhz", "sm_clock_max"), ("mem_clock_max_mhz", "mem_clock_max"),
                ("pcie_gen_max", "pcie_gen_max"), ("pcie_width_max", "pcie_width_max"))
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
        self._gpm_spare: dict[str, Any] = {}  # uuid -> the sample before the last: the next one's buffer
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
            fb_used_mib=mib(mem[0]) if mem else None, fb_total_mib=mib(mem[1]) if mem else None,
            fb_reserved_mib=mib(mem[2]) if mem and mem[2] is not None else None,
            **inherited, **self._gpm_metrics(g))

    def _one(self, g: Gpu, ts: datetime) -> wire.GpuSample:
        n = self.nvml
        util = n.utilization(g)
        mem = n.memory(g)
        static = self._limits(g, ts)
        values = n.field_values(g, _FIELD_IDS)
        nvl_tx, nvl_rx = self._nvlink_rates(g, ts, values)
        reads = {r.name: r.value(values) for r in _FIELD_READS}
        if reads.get("power_w") is None and "power_mw" not in g.failed:
            # A driver that predates the power field ids still answers the plain call (once it
            # fails for this GPU, `failed` stops asking).
            mw = n.read(g, "power_mw")
            reads["power_w"] = None if mw is None else mw / 1000.0
        return wire.GpuSample(
            ts=ts, gpu_uuid=g.uuid, gpu_index=g.index, job_id=self.job_of_gpu(g.uuid),
            sm_util=util[0] if util else None, mem_util=util[1] if util else None,
            fb_used_mib=mib(mem[0]) if mem else None, fb_total_mib=mib(mem[1]) if mem else None,
            fb_reserved_mib=mib(mem[2]) if mem and mem[2] is not None else None,
            nvlink_rx_kbs=nvl_rx, nvlink_tx_kbs=nvl_tx, **{name: n.read(g, read) for name, read in _SAMPLE_READS},
            **static, **reads, **self._gpm_metrics(g),
        )

    def _limits(self, g: Gpu, ts: datetime) -> dict[str, Any]:
        """The GPU's limits, read at most once a minute: they change only when an admin sets them."""
        cached = self._static.get(g.uuid)
        if cached and ts.timestamp() - cached[0] < STATIC_REFRESH_S:
            return cached[1]
        n = self.nvml
        limit = n.read(g, "power_limit_mw")
        values = {"power_limit_w": None if limit is None else limit / 1000.0,
                  **{name: n.read(g, read) for name, read in _LIMIT_READS}}
        self._static[g.uuid] = (ts.timestamp(), values)
        return values

    def nvlink_kib(self) -> dict[str, int]:
        """NVLink data sent + received since driver load (KiB, all links) per GPU, as last read."""
        return {uuid: tx + rx for uuid, (_, tx, rx) in self._nvlink.items()}

    def _nvlink_rates(self, g: Gpu, ts: datetime, fields: dict[int, Any]) -> tuple[int | None, int | None]:
        if NVLINK_TX not in fields or NVLINK_RX not in fields:
            return None, None
        t, tx, rx = ts.timestamp(), int(fields[NVLINK_TX]), int(fields[NVLINK_RX])
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
        sample = self.nvml.gpm_sample(g, self._gpm_spare.pop(g.uuid, None))
        prev, self._gpm_prev[g.uuid] = self._gpm_prev.get(g.uuid), sample
        if prev is None:
            return {}
        if sample is None:
            self.nvml.gpm_free(prev)
            return {}
        got = self.nvml.gpm_metrics(g, prev, sample, _GPM_IDS)
        self._gpm_spare[g.uuid] = prev
        return {f.name: f.quantize(_pct(got.get(mid))) for f, mid in _GPM}
