"""The field table: every sampled GPU and process field, declared once.

Each row says what a field is (unit, description), how NVML gives it, its column type and wire
bounds (and, for a real, the resolution the agent sends it at), which roll-up columns keep it, what `gpu_series` returns for it, its dcgm-exporter name and
metric type, and the dashboard panel that draws it. Derived from it: the wire structs
(`wire.GpuSample`, `wire.ProcessSample`) and so the COPY column lists, the roll-up folds,
`gpu_series`, the agent's Prometheus exposition and per-field Grafana panels; tests check the
migrations' columns and the agent's sampler against it.

Adding a GPU field: one row here; `jobpulse db upgrade` adds its sample and roll-up columns
(`collector/store/migrate/field_columns.py`) and everything the other tables derive. A field
NVML gives through `nvmlDeviceGetFieldValues` (``nvml_field``) is read by the sampler with no
further code, in the one field-value call per GPU and sample; any other needs one reader in
`agent/sources/gpu.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

SqlType = Literal["smallint", "integer", "bigint", "real", "boolean", "text"]
Aggregate = Literal["sum", "max", "min", "count", "any", "or", "true"]
"""Roll-up aggregates: ``sum`` (a mean with the bucket's sample count), ``max``, ``min``, ``count``
(non-NULL samples), ``any`` (an attribute: the newest non-NULL value), ``or`` (a flag seen in any sample),
``true`` (samples in which a flag held)."""

INT16_MAX = 2**15 - 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
HELD_MAX = 9
"""The most ticks a process row may stand for beyond itself: a held run stays within its ten-second
bin and the agent sends it once it holds ten ticks, so a forged ``held`` cannot make one row outweigh
a process's ten seconds (the store weighs a row by 1 + held)."""
HOLD_BIN_S = 10
"""A held run never crosses a ten-second bin of wall time (the finest bins the store keeps of
processes: `rank_bins_compact`, and every roll-up width is a multiple), so every bin's counts are
whole; a node whose processes do not change sends one row a process per bin. The collector holds a
row to it: its ticks fit between the bin's start (or the process's previous row) and its time."""

_UPPER: dict[str, float] = {"smallint": INT16_MAX, "integer": INT32_MAX, "bigint": INT64_MAX, "real": 1e6}


@dataclass(frozen=True)
class Dcgm:
    """How dcgm-exporter names the field, so its dashboards work on the agent's /metrics."""

    name: str
    help: str
    type: Literal["gauge", "counter"] = "gauge"
    scale: float = 1.0  # dcgm-exporter's unit / ours (ratios 0-1 where we keep percent: 0.01)


@dataclass(frozen=True)
class Field:
    """One sampled field: a column of `gpu_samples` (or `process_samples`) and a wire attribute."""

    name: str
    sql: SqlType
    unit: str
    description: str
    nvml: str  # how NVML gives it (the call and member, or the field-value id's name)
    lo: float = 0
    hi: float | None = None  # None: the column type's maximum
    nvml_field: str | None = None  # an NVML_FI_* name: read through nvmlDeviceGetFieldValues
    nvml_field_else: str | None = None  # the NVML_FI_* name read where the GPU does not support nvml_field
    nvml_per_unit: int = 1  # NVML's units per wire unit (mW per W: 1000); the field value is divided by it
    per_parent: bool = False  # a MIG instance has no value of its own: the parent GPU's
    nvml_gpm: str | None = None  # an NVML_GPM_METRIC_* name: a GPM metric (means divide by GPM samples)
    rollup: dict[str, Aggregate] = field(default_factory=dict)  # roll-up column -> aggregate
    series: str | None = None  # gpu_series column (the mean over a step; a limit: the max)
    dcgm: Dcgm | None = None
    panel: str | None = None  # node-health panel title; fields sharing a title share a panel
    label: str | None = None  # the series label in that panel
    resolution: float | None = None  # reals: the step the source reports (see `quantize`)

    def __post_init__(self) -> None:
        if self.resolution is not None and (self.sql != "real" or self.scale * self.resolution != 1):
            raise ValueError(f"{self.name}: a resolution is for reals and must be 1/n, got {self.resolution}")

    @property
    def gpm(self) -> bool:
        return self.nvml_gpm is not None

    @property
    def upper(self) -> float:
        return _UPPER[self.sql] if self.hi is None else self.hi

    @cached_property
    def scale(self) -> int:
        """Values of a declared resolution are whole multiples of 1/scale (the compact tier stores
        them as those integers). Computed once: the agent quantizes each GPM value of each sample."""
        return round(1 / self.resolution) if self.resolution else 0

    def quantize(self, v: float | None) -> float | None:
        """``v`` at the field's declared resolution, applied where the value is measured (the
        agent): finer digits of a ratio of NVML counters carry no information, and would cost
        the compact tier whole bytes of noise per sample."""
        return v if v is None or not self.scale else round(v * self.scale) / self.scale

    @property
    def python(self) -> type:
        return {"boolean": bool, "text": str, "real": float}.get(self.sql, int)


def _pct(name: str, description: str, nvml: str, **kw: object) -> Field:
    return Field(name, "smallint", "percent", description, nvml, hi=100, **kw)  # type: ignore[arg-type]


GPM_RESOLUTION = 0.01
"""GPM metrics in percent at 0.01 percentage points: NVML computes them (as doubles) from counters
over the sample interval; finer digits are the interval's jitter, not the GPU's activity."""


def _gpm(name: str, description: str, metric: str, stem: str | None = None, **kw: object) -> Field:
    rollup = {f"sum_{stem}": "sum", **kw.pop("rollup", {})} if stem else {}  # type: ignore[dict-item]
    return Field(name, "real", "percent", description, f"nvmlGpmMetricsGet: {metric}", hi=100, nvml_gpm=metric,
                 rollup=rollup, resolution=GPM_RESOLUTION, **kw)  # type: ignore[arg-type]


def _rx_tx(link: str, sql: SqlType, description: str, nvml: str, dcgm: str | None = None) -> tuple[Field, Field]:
    """A link's receive and transmit rates (KB/s), kept as means and drawn by gpu_series; ``dcgm``
    names dcgm-exporter's bytes-per-second gauge ({} for RX/TX)."""
    return tuple(Field(f"{link}_{d}_kbs", sql, "KB/s", description.format(word), nvml.format(d.upper()),
                       per_parent=True, rollup={f"sum_{link}_{d}_kbs": "sum"}, series=f"{link}_{d}_kbs",
                       dcgm=Dcgm(dcgm.format(d.upper()), f"{description.format(word)} (in B/s).", scale=1024)
                       if dcgm else None)
                 for d, word in (("rx", "receive"), ("tx", "transmit")))  # type: ignore[return-value]


def _nvlink_errors(name: str, what: str, nvml_field: str, dcgm: str) -> Field:
    return Field(name, "bigint", "count", f"NVLink {what} errors, all links, since driver load",
                 f"field value {nvml_field}", nvml_field=nvml_field,
                 rollup={f"min_{name}": "min", f"max_{name}": "max"},
                 dcgm=Dcgm(dcgm, f"Total number of NVLink {what} errors.", "counter"),
                 panel="NVLink errors (increase)", label=what)


GPU_FIELDS: tuple[Field, ...] = (
    _pct("sm_util", "GPU utilization (duty cycle: a kernel ran)", "nvmlDeviceGetUtilizationRates().gpu",
         rollup={"sum_sm_util": "sum", "max_sm_util": "max"}, series="sm_util",
         dcgm=Dcgm("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")),
    _pct("mem_util", "memory controller utilization", "nvmlDeviceGetUtilizationRates().memory",
         rollup={"sum_mem_util": "sum"}, series="mem_util",
         dcgm=Dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).")),
    _pct("enc_util", "video encoder utilization", "nvmlDeviceGetEncoderUtilization()[0]",
         dcgm=Dcgm("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).")),
    _pct("dec_util", "video decoder utilization", "nvmlDeviceGetDecoderUtilization()[0]",
         dcgm=Dcgm("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).")),
    _pct("jpg_util", "JPEG decoder utilization", "nvmlDeviceGetJpgUtilization()[0]"),
    _pct("ofa_util", "optical flow accelerator utilization", "nvmlDeviceGetOfaUtilization()[0]"),
    # nvmlDeviceGetPowerUsage's reading: the 1 s average where the GPU has it (Ampere and newer, not GA100),
    # else the instantaneous power.
    Field("power_w", "real", "watts", "power draw",
          "field value NVML_FI_DEV_POWER_AVERAGE (else NVML_FI_DEV_POWER_INSTANT) mW / 1000", per_parent=True,
          nvml_field="NVML_FI_DEV_POWER_AVERAGE", nvml_field_else="NVML_FI_DEV_POWER_INSTANT", nvml_per_unit=1000,
          resolution=0.001, rollup={"sum_power_w": "sum", "max_power_w": "max"}, series="power_w",
          dcgm=Dcgm("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")),
    Field("power_limit_w", "real", "watts", "enforced power limit", "nvmlDeviceGetEnforcedPowerLimit() mW / 1000",
          per_parent=True, resolution=0.001, rollup={"power_limit_w": "max"}, series="power_limit_w"),
    Field("energy_mj", "bigint", "millijoules", "total energy since driver load",
          "field value NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", per_parent=True,
          nvml_field="NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", dcgm=Dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                     "Total energy consumption since boot (in mJ).", "counter")),
    Field("gpu_temp_c", "smallint", "degrees Celsius", "GPU temperature", "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
          lo=-273, hi=1000, per_parent=True, rollup={"sum_gpu_temp_c": "sum", "max_gpu_temp_c": "max"},
          series="gpu_temp_c", dcgm=Dcgm("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")),
    Field("mem_temp_c", "smallint", "degrees Celsius", "memory (HBM) temperature", "field value NVML_FI_DEV_MEMORY_TEMP",
          lo=-273, hi=1000, per_parent=True, nvml_field="NVML_FI_DEV_MEMORY_TEMP",
          rollup={"max_mem_temp_c": "max"},
          dcgm=Dcgm("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).")),
    Field("sm_clock_mhz", "smallint", "MHz", "SM clock", "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", per_parent=True,
          rollup={"sum_sm_clock_mhz": "sum"}, series="sm_clock_mhz",
          dcgm=Dcgm("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).")),
    Field("mem_clock_mhz", "smallint", "MHz", "memory clock", "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)",
          per_parent=True, dcgm=Dcgm("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).")),
    Field("sm_clock_max_mhz", "smallint", "MHz", "max SM clock", "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM)",
          per_parent=True, rollup={"sm_clock_max_mhz": "max"}),
    Field("mem_clock_max_mhz", "smallint", "MHz", "max memory clock", "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)",
          per_parent=True),
    Field("fb_used_mib", "integer", "MiB", "framebuffer used", "nvmlDeviceGetMemoryInfo().used / 2^20",
          rollup={"sum_fb_used_mib": "sum", "max_fb_used_mib": "max"}, series="fb_used_mib",
          dcgm=Dcgm("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")),
    Field("fb_total_mib", "integer", "MiB", "framebuffer total", "nvmlDeviceGetMemoryInfo().total / 2^20",
          rollup={"fb_total_mib": "max"}, series="fb_total_mib"),
    Field("fb_reserved_mib", "integer", "MiB", "framebuffer the driver reserves (not in used or free)",
          "nvmlDeviceGetMemoryInfo_v2().reserved / 2^20",
          dcgm=Dcgm("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).")),
    *_rx_tx("pcie", "integer", "PCIe {} throughput", "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_{}_BYTES)",
            dcgm="DCGM_FI_PROF_PCIE_{}_BYTES"),
    Field("pcie_gen", "smallint", "", "current PCIe link generation", "nvmlDeviceGetCurrPcieLinkGeneration()",
          per_parent=True),
    Field("pcie_width", "smallint", "lanes", "current PCIe link width", "nvmlDeviceGetCurrPcieLinkWidth()",
          per_parent=True),
    Field("pcie_gen_max", "smallint", "", "max PCIe link generation", "nvmlDeviceGetMaxPcieLinkGeneration()",
          per_parent=True),
    Field("pcie_width_max", "smallint", "lanes", "max PCIe link width", "nvmlDeviceGetMaxPcieLinkWidth()",
          per_parent=True),
    Field("pcie_replay", "bigint", "count", "PCIe replay counter", "field value NVML_FI_DEV_PCIE_REPLAY_COUNTER",
          per_parent=True, nvml_field="NVML_FI_DEV_PCIE_REPLAY_COUNTER", dcgm=Dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "counter")),
    *_rx_tx("nvlink", "bigint", "NVLink {} throughput, all links",
            "field value NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{} (KiB counter) as a rate"),
    Field("clock_event_reasons", "bigint", "bitmask", "NVML clock event (throttle) reasons",
          "nvmlDeviceGetCurrentClocksEventReasons()", per_parent=True),
    Field("ecc_sbe_total", "bigint", "count", "corrected (single-bit) ECC errors, volatile",
          "field value NVML_FI_DEV_ECC_SBE_VOL_TOTAL", per_parent=True, nvml_field="NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
          rollup={"min_ecc_sbe_total": "min", "max_ecc_sbe_total": "max"}),
    Field("ecc_dbe_total", "bigint", "count", "uncorrected (double-bit) ECC errors, volatile",
          "field value NVML_FI_DEV_ECC_DBE_VOL_TOTAL", per_parent=True, nvml_field="NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
          rollup={"min_ecc_dbe_total": "min", "max_ecc_dbe_total": "max"}),
    Field("remapped_correctable", "integer", "rows", "rows remapped for correctable errors",
          "field value NVML_FI_DEV_REMAPPED_COR", per_parent=True, nvml_field="NVML_FI_DEV_REMAPPED_COR",
          dcgm=Dcgm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors.",
                    "counter")),
    Field("remapped_uncorrectable", "integer", "rows", "rows remapped for uncorrectable errors",
          "field value NVML_FI_DEV_REMAPPED_UNC", per_parent=True, nvml_field="NVML_FI_DEV_REMAPPED_UNC",
          dcgm=Dcgm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors.",
                    "counter")),
    Field("remap_pending", "boolean", "", "a row remap waits for a GPU reset",
          "field value NVML_FI_DEV_REMAPPED_PENDING (1/0)", per_parent=True, nvml_field="NVML_FI_DEV_REMAPPED_PENDING",
          rollup={"any_remap_pending": "or"}),
    Field("remap_failure", "boolean", "", "a row remap failed", "field value NVML_FI_DEV_REMAPPED_FAILURE (1/0)",
          per_parent=True, nvml_field="NVML_FI_DEV_REMAPPED_FAILURE", rollup={"any_remap_failure": "or"},
          dcgm=Dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed.")),
    _gpm("gpm_sm_active", "GPM SM activity", "NVML_GPM_METRIC_SM_UTIL", "sm_active", series="sm_active",
         dcgm=Dcgm("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least 1 warp assigned.", scale=0.01)),
    _gpm("gpm_sm_occupancy", "GPM SM occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy",
         dcgm=Dcgm("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of warps resident to the theoretical maximum.", scale=0.01)),
    _gpm("gpm_tensor_active", "GPM any tensor pipe activity", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active",
         rollup={"max_tensor_active": "max"}, series="tensor_active",
         dcgm=Dcgm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipe is active.", scale=0.01)),
    _gpm("gpm_dram_bw", "GPM DRAM bandwidth utilization", "NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_bw",
         dcgm=Dcgm("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the memory interface is active.", scale=0.01)),
    _gpm("gpm_fp16_active", "GPM FP16 pipe activity", "NVML_GPM_METRIC_FP16_UTIL"),
    _gpm("gpm_fp32_active", "GPM FP32 pipe activity", "NVML_GPM_METRIC_FP32_UTIL"),
    _gpm("gpm_fp64_active", "GPM FP64 pipe activity", "NVML_GPM_METRIC_FP64_UTIL"),
    _gpm("gpm_gr_active", "GPM graphics/compute engine activity (any app)", "NVML_GPM_METRIC_GRAPHICS_UTIL",
         dcgm=Dcgm("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", scale=0.01)),
    _nvlink_errors("nvlink_crc_flit_errors", "CRC flit", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                   "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    _nvlink_errors("nvlink_crc_data_errors", "CRC data", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                   "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    _nvlink_errors("nvlink_replay_errors", "replay", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                   "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    _nvlink_errors("nvlink_recovery_errors", "recovery", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                   "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    Field("power_cap_throttle_ns", "bigint", "nanoseconds",
          "time the clocks were held down to stay within the power limit, since driver load",
          "field value NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", per_parent=True,
          nvml_field="NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
          rollup={"min_power_cap_throttle_ns": "min", "max_power_cap_throttle_ns": "max"},
          dcgm=Dcgm("DCGM_FI_DEV_POWER_VIOLATION", "Throttling duration due to power constraints (in us).",
                    "counter", scale=0.001),
          panel="Clocks held by the power cap (increase, ns)", label="power cap"),
)

PROCESS_FIELDS: tuple[Field, ...] = (
    Field("gpu_uuid", "text", "", "GPU the process uses (NVML UUID)", "nvmlDeviceGetComputeRunningProcesses()",
          hi=96, rollup={"gpu_uuid": "any"}),
    Field("job_id", "text", "", "Slurm job of the process (from /proc, never from what it claims)",
          "-", hi=64),
    Field("step", "text", "", "Slurm step of the process", "-", hi=32),
    Field("rank", "integer", "", "SLURM_PROCID", "-", rollup={"rank": "any"}),
    Field("local_rank", "integer", "", "SLURM_LOCALID", "-", rollup={"local_rank": "any"}),
    Field("gpu_mem_mib", "integer", "MiB", "GPU memory used by the process on gpu_uuid",
          "nvmlDeviceGetComputeRunningProcesses().usedGpuMemory / 2^20", rollup={"max_gpu_mem_mib": "max"}),
    _pct("sm_util", "process's share of SM time on gpu_uuid", "nvmlDeviceGetProcessUtilization().smUtil",
         rollup={"n_sm": "count", "sum_sm_util": "sum"}),
    _pct("mem_util", "process's share of memory controller time", "nvmlDeviceGetProcessUtilization().memUtil"),
    Field("cpu_percent", "real", "percent", "CPU use, percent of one core (may exceed 100)", "/proc/PID/stat",
          rollup={"n_cpu": "count", "sum_cpu_percent": "sum", "max_cpu_percent": "max"}),
    Field("rss_mib", "integer", "MiB", "resident set size", "/proc/PID/statm", rollup={"max_rss_mib": "max"}),
    Field("command", "text", "", "process name (comm)", "/proc/PID/comm", hi=256, rollup={"command": "any"}),
    Field("cpu", "integer", "", "CPU the process last ran on", "/proc/PID/stat field 39"),
    Field("runnable", "boolean", "", "running or waiting for a CPU when sampled (state R): the CPU the process "
          "wants, even where other processes on its CPUs keep cpu_percent down", "/proc/PID/stat field 3",
          rollup={"n_runnable": "true"}),
    Field("cpus_allowed", "smallint", "CPUs", "CPUs the process may run on (its affinity: the cores Slurm gave "
          "its task): a multi-threaded input pipeline that keeps all of them busy is saturated",
          "sched_getaffinity(PID)", rollup={"max_cpus_allowed": "max"}),
    Field("held", "smallint", "ticks", "ticks before this one that the agent held back because the node's "
          "processes had not changed (`agent.sources.processes.ChangeOnly`): the row stands for 1 + held ticks, "
          "and every count and sum of process samples weighs it so; at most `HELD_MAX`", "-", hi=HELD_MAX),
    Field("state", "text", "", "the kernel's state letter when sampled (R running, S sleeping, D in "
          "uninterruptible I/O wait, T stopped by a signal, t traced, Z zombie, ...: proc(5)); T is a suspended "
          "job's process (Slurm stops its tasks with SIGSTOP)", "/proc/PID/stat field 3", hi=1),
    Field("io_read_bps", "bigint", "B/s", "bytes the process read through read-like system calls per second "
          "since its previous sample (page cache and network file systems included)", "/proc/PID/io rchar",
          rollup={"max_io_read_bps": "max"}),
    Field("io_write_bps", "bigint", "B/s", "bytes the process wrote through write-like system calls per second "
          "since its previous sample: a rank writing a checkpoint, to a network file system too",
          "/proc/PID/io wchar", rollup={"max_io_write_bps": "max"}),
)

GPU_BY_NAME = {f.name: f for f in GPU_FIELDS}
PER_PARENT = tuple(f.name for f in GPU_FIELDS if f.per_parent)
"""Fields of the GPU itself: a MIG instance's, or one job's part of a shared GPU, are the GPU's."""
PANELS: dict[str, list[Field]] = {}
for _f in GPU_FIELDS:
    if _f.panel:
        PANELS.setdefault(_f.panel, []).append(_f)


@dataclass(frozen=True)
class FabricField(Field):
    """A field of one RDMA port (InfiniBand or RoCE) at one time: a column of `fabric_samples`, read
    from the port's sysfs folder (`/sys/class/infiniband/DEV/ports/N/`) or, for a RoCE port, from its
    Ethernet interface's `/sys/class/net/IF/statistics/`."""

    sysfs: str | None = None  # the file under the port's folder; "net:FILE": the netdev's statistics/FILE
    per_s: float | None = None  # a counter sent as a rate: wire units per counter unit; None: sent as read


def _port_counter(name: str, description: str, folder: str = "counters", sysfs: str | None = None) -> FabricField:
    """An error or event counter, sent as the kernel shows it (the rules take its increase)."""
    file = sysfs or name
    return FabricField(name, "bigint", "count", description, f"sysfs ports/N/{folder}/{file}",
                       sysfs=f"{folder}/{file}")


def _port_rate(name: str, description: str, sysfs: str, per_s: float, unit: str = "KB/s") -> FabricField:
    """A counter the agent turns into a rate between two samples (NULL on a port's first sample,
    after a reset, or while a 32-bit counter sits at its maximum)."""
    return FabricField(name, "bigint", unit, description, f"sysfs {sysfs} as a rate", sysfs=sysfs, per_s=per_s)


DATA_WORD_BYTES = 4
"""port_xmit_data and port_rcv_data count octets divided by 4 (Documentation/ABI/stable/sysfs-class-infiniband)."""

FABRIC_FIELDS: tuple[FabricField, ...] = (
    FabricField("link_layer", "text", "", "InfiniBand or Ethernet (RoCE)", "sysfs ports/N/link_layer", hi=16),
    FabricField("port_state", "smallint", "", "logical port state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER",
                "sysfs ports/N/state (the number before the colon)", hi=15),
    FabricField("phys_state", "smallint", "", "physical port state: 2 Polling, 3 Disabled, 5 LinkUp, "
                "6 LinkErrorRecovery, ...", "sysfs ports/N/phys_state (the number before the colon)", hi=15),
    FabricField("rate_gbps", "real", "Gb/s", "the link's current data rate", "sysfs ports/N/rate, e.g. "
                "'100 Gb/sec (4X EDR)'", hi=100_000),
    FabricField("width", "smallint", "lanes", "the link's current width (1X, 2X, 4X, 8X, 12X)",
                "sysfs ports/N/rate, the NX in parentheses", hi=64),
    FabricField("rate_max_gbps", "real", "Gb/s", "the highest rate this port, or a port of the same HCA type "
                "and link layer on the node, has shown since the agent first saw it (sysfs has no file "
                "for the rates a port supports)", "agent: the highest ports/N/rate seen", hi=100_000),
    FabricField("width_max", "smallint", "lanes", "the widest this port, or a port of the same HCA type and "
                "link layer on the node, has trained to since the agent first saw it",
                "agent: the widest ports/N/rate seen", hi=64),
    _port_rate("rx_kbs", "fabric receive throughput", "counters/port_rcv_data", DATA_WORD_BYTES / 1024),
    _port_rate("tx_kbs", "fabric transmit throughput", "counters/port_xmit_data", DATA_WORD_BYTES / 1024),
    _port_rate("xmit_wait_per_s", "ticks the port had data to send but no credit to send it (congestion "
               "downstream)", "counters/port_xmit_wait", 1.0, unit="ticks/s"),
    _port_counter("symbol_error", "minor link errors detected on a physical lane"),
    _port_counter("link_downed", "times the link error recovery failed and the link went down"),
    _port_counter("link_error_recovery", "times the link error recovery process completed"),
    _port_counter("port_rcv_errors", "packets received with an error"),
    _port_counter("port_rcv_remote_physical_errors", "packets received marked bad by an upstream link"),
    _port_counter("port_xmit_discards", "outbound packets discarded (port down or congested)"),
    _port_counter("local_link_integrity_errors", "times the local link's error rate passed its threshold"),
    _port_counter("excessive_buffer_overrun_errors", "times the receive buffers overran"),
    _port_counter("hw_out_of_sequence", "packets received out of sequence (the driver's hw_counters; mlx5)",
                  "hw_counters", "out_of_sequence"),
    _port_counter("hw_packet_seq_err", "NAKs for sequence errors (retransmissions; mlx5)", "hw_counters",
                  "packet_seq_err"),
    _port_counter("hw_local_ack_timeout_err", "ACK timeouts of the sender's queue pairs (retransmissions; mlx5)",
                  "hw_counters", "local_ack_timeout_err"),
    _port_counter("hw_np_ecn_marked_roce_packets", "RoCE packets received with an ECN congestion mark (mlx5)",
                  "hw_counters", "np_ecn_marked_roce_packets"),
    _port_rate("net_rx_kbs", "receive throughput of the RoCE port's Ethernet interface", "net:rx_bytes", 1 / 1024),
    _port_rate("net_tx_kbs", "transmit throughput of the RoCE port's Ethernet interface", "net:tx_bytes", 1 / 1024),
    FabricField("net_rx_dropped", "bigint", "count", "packets the RoCE port's Ethernet interface dropped on "
                "receive", "sysfs /sys/class/net/IF/statistics/rx_dropped", sysfs="net:rx_dropped"),
)
FABRIC_BY_NAME = {f.name: f for f in FABRIC_FIELDS}
FABRIC_LINK_ERRORS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
                      "port_rcv_remote_physical_errors", "local_link_integrity_errors",
                      "excessive_buffer_overrun_errors")
"""Counters of a link's faults, not of congestion: any count is worth a look, a rising one is a bad
cable or port (node validation, the fabric_degraded rule)."""
