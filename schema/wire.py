"""Wire format between agent and collector, version 1.

One ``Batch`` is what one agent sends per flush interval: its identity, a sequence number,
and every record it gathered since the last batch. The field names of the record structs
are the column names of the matching PostgreSQL tables, in column order, so the collector
can COPY them without a mapping table. Each field documents its unit; the limits (``ge``,
``le``, ``max_length``) mirror the column types so that a batch that validates can be stored.

Compatibility: within version 1 a newer agent may add fields (an older collector ignores
them); anything else is a new version. The collector answers an unknown version with 422.
"""

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

WIRE_VERSION = 1
SUPPORTED_VERSIONS = (1,)

INT16_MAX = 2**15 - 1
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _d(description: str, **limits: Any) -> Meta:
    return Meta(description=description, **limits)


def pct(description: str) -> Any:
    """An integer percent (as NVML reports utilization)."""
    return Annotated[int, _d(f"{description}, percent 0-100", ge=0, le=100)]


def pctf(description: str) -> Any:
    """A fractional percent (as GPM reports activity)."""
    return Annotated[float, _d(f"{description}, percent 0-100", ge=0.0, le=100.0)]


def num(description: str, lo: int = 0, hi: int = 2**63 - 1) -> Any:
    """An integer whose bounds match its column type (smallint, integer or bigint)."""
    return Annotated[int, _d(description, ge=lo, le=hi)]


def real(description: str, hi: float = 1e6) -> Any:
    """A non-negative float; the bound also keeps infinities out of the database."""
    return Annotated[float, _d(description, ge=0.0, le=hi)]


def text(description: str, max_length: int) -> Any:
    return Annotated[str, _d(description, max_length=max_length)]


# Shared field types. ``tz=True``: a timestamp without a UTC offset is rejected, never guessed.
Timestamp = Annotated[datetime, Meta(tz=True, description="RFC 3339 time with offset (UTC preferred), the agent's clock")]
Name = Annotated[str, _d("name without spaces: node, cluster", min_length=1, max_length=255, pattern=r"^[^\s\x00]+$")]
JobId = Annotated[
    str,
    _d("Slurm job id: `123`, array task `123_4`, het component `123+1`", max_length=64,
       pattern=r"^[0-9]+(_[0-9]+)?(\+[0-9]+)?$"),
]
StepId = Annotated[
    str, _d("Slurm step: `0`, `1`, `batch`, `extern`, `interactive`", max_length=32, pattern=r"^[A-Za-z0-9_.+-]+$")
]
GpuUuid = Annotated[str, _d("NVML UUID (`GPU-...` or `MIG-...`)", min_length=1, max_length=96, pattern=r"^[A-Za-z0-9_.:/-]+$")]
Kind = Annotated[str, _d("lower-case kind name", max_length=32, pattern=r"^[a-z][a-z0-9_]*$")]
Attrs = Annotated[dict[str, Any], _d("free-form JSON attributes")]


class AgentInfo(Struct, frozen=True, forbid_unknown_fields=False):
    """Who sent the batch. ``instance`` + the batch's ``seq`` identify a batch for deduplication."""

    instance: Annotated[str, _d("unique per agent process start (e.g. a UUID); a restarted agent gets a new one",
                                min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    node: Name  # short hostname
    cluster: Name  # Slurm cluster name
    version: text("agent software version", 64)
    started_at: Timestamp


class GpuSample(Struct, frozen=True):
    """One GPU at one time, as `nvidia-smi dmon -s pucvmet` shows it, plus GPM. NULL = not supported."""

    ts: Timestamp
    gpu_uuid: GpuUuid
    gpu_index: Annotated[int, _d("NVML index on the node (an attribute, never a key)", ge=0, le=INT16_MAX)]
    job_id: JobId | None = None
    sm_util: pct("GPU utilization (duty cycle: a kernel ran)") | None = None
    mem_util: pct("memory controller utilization") | None = None
    enc_util: pct("video encoder utilization") | None = None
    dec_util: pct("video decoder utilization") | None = None
    jpg_util: pct("JPEG decoder utilization") | None = None
    ofa_util: pct("optical flow accelerator utilization") | None = None
    power_w: real("power draw, watts", 1e6) | None = None
    power_limit_w: real("enforced power limit, watts", 1e6) | None = None
    energy_mj: num("total energy since driver load, millijoules", 0, INT64_MAX) | None = None
    gpu_temp_c: num("GPU temperature, degrees Celsius", -273, 1000) | None = None
    mem_temp_c: num("memory (HBM) temperature, degrees Celsius", -273, 1000) | None = None
    sm_clock_mhz: num("SM clock, MHz", 0, INT16_MAX) | None = None
    mem_clock_mhz: num("memory clock, MHz", 0, INT16_MAX) | None = None
    sm_clock_max_mhz: num("max SM clock, MHz", 0, INT16_MAX) | None = None
    mem_clock_max_mhz: num("max memory clock, MHz", 0, INT16_MAX) | None = None
    fb_used_mib: num("framebuffer used, MiB", 0, INT32_MAX) | None = None
    fb_total_mib: num("framebuffer total, MiB", 0, INT32_MAX) | None = None
    pcie_rx_kbs: num("PCIe receive throughput, KB/s", 0, INT32_MAX) | None = None
    pcie_tx_kbs: num("PCIe transmit throughput, KB/s", 0, INT32_MAX) | None = None
    pcie_gen: num("current PCIe link generation", 0, INT16_MAX) | None = None
    pcie_width: num("current PCIe link width, lanes", 0, INT16_MAX) | None = None
    pcie_gen_max: num("max PCIe link generation", 0, INT16_MAX) | None = None
    pcie_width_max: num("max PCIe link width, lanes", 0, INT16_MAX) | None = None
    pcie_replay: num("PCIe replay counter", 0, INT64_MAX) | None = None
    nvlink_rx_kbs: num("NVLink receive throughput, all links, KB/s", 0, INT64_MAX) | None = None
    nvlink_tx_kbs: num("NVLink transmit throughput, all links, KB/s", 0, INT64_MAX) | None = None
    clock_event_reasons: num("NVML clock event (throttle) reason bitmask", 0, INT64_MAX) | None = None
    ecc_sbe_total: num("corrected (single-bit) ECC errors, volatile", 0, INT64_MAX) | None = None
    ecc_dbe_total: num("uncorrected (double-bit) ECC errors, volatile", 0, INT64_MAX) | None = None
    remapped_correctable: num("rows remapped for correctable errors", 0, INT32_MAX) | None = None
    remapped_uncorrectable: num("rows remapped for uncorrectable errors", 0, INT32_MAX) | None = None
    remap_pending: Annotated[bool | None, _d("a row remap waits for a GPU reset")] = None
    remap_failure: Annotated[bool | None, _d("a row remap failed")] = None
    gpm_sm_active: pctf("GPM SM activity") | None = None
    gpm_sm_occupancy: pctf("GPM SM occupancy") | None = None
    gpm_tensor_active: pctf("GPM any tensor pipe activity") | None = None
    gpm_dram_bw: pctf("GPM DRAM bandwidth utilization") | None = None
    gpm_fp16_active: pctf("GPM FP16 pipe activity") | None = None
    gpm_fp32_active: pctf("GPM FP32 pipe activity") | None = None
    gpm_fp64_active: pctf("GPM FP64 pipe activity") | None = None


class ProcessSample(Struct, frozen=True):
    """One process at one time, attributed by the agent from /proc (never from what it claims)."""

    ts: Timestamp
    pid: Annotated[int, _d("process id on the node", ge=1, le=INT32_MAX)]
    gpu_uuid: GpuUuid | None = None
    job_id: JobId | None = None
    step: StepId | None = None
    rank: num("SLURM_PROCID", 0, INT32_MAX) | None = None
    local_rank: num("SLURM_LOCALID", 0, INT32_MAX) | None = None
    gpu_mem_mib: num("GPU memory used by the process on gpu_uuid, MiB", 0, INT32_MAX) | None = None
    sm_util: pct("process's share of SM time on gpu_uuid") | None = None
    mem_util: pct("process's share of memory controller time") | None = None
    cpu_percent: real("CPU use, percent of one core (may exceed 100)", 1e6) | None = None
    rss_mib: num("resident set size, MiB", 0, INT32_MAX) | None = None
    command: text("process name (comm)", 256) | None = None
    cpu: num("CPU the process last ran on", 0, INT32_MAX) | None = None


class HealthEvent(Struct, frozen=True):
    """A hardware event: XID, ECC, throttle start, PCIe/NVLink change, GPU lost."""

    ts: Timestamp
    kind: Kind
    gpu_uuid: GpuUuid | None = None
    job_id: JobId | None = None
    code: num("XID number or other event code", -INT64_MAX, INT64_MAX) | None = None
    message: text("human-readable detail", 4096) | None = None
    attrs: Attrs = {}


class TopologyGpu(Struct, frozen=True):
    """One GPU of a node's topology snapshot (taken at agent start), as `nvidia-smi topo -m` shows it."""

    ts: Timestamp
    gpu_uuid: GpuUuid
    gpu_index: Annotated[int, _d("NVML index", ge=0, le=INT16_MAX)]
    pci_bus_id: text("PCI bus id, e.g. 00000000:17:00.0", 32) | None = None
    model: text("product name", 128) | None = None
    driver_version: text("NVIDIA driver version", 32) | None = None
    cuda_version: text("CUDA driver API version, e.g. 12.4", 32) | None = None
    numa_node: num("NUMA node of the GPU", -1, INT16_MAX) | None = None
    cpu_affinity: text("CPU list near the GPU, e.g. 0-15,32-47", 1024) | None = None
    pcie_gen_max: num("max PCIe generation", 0, INT16_MAX) | None = None
    pcie_width_max: num("max PCIe width, lanes", 0, INT16_MAX) | None = None
    nvlinks_up: num("NVLink links active", 0, INT16_MAX) | None = None
    mig_mode: Annotated[bool | None, _d("MIG mode enabled")] = None
    links: Annotated[dict[str, str], _d("peer GPU UUID -> link as `nvidia-smi topo -m` prints it: NV#, PIX, PXB, PHB, NODE, SYS")] = {}
    p2p: Annotated[dict[str, str], _d("peer GPU UUID -> P2P read status (OK, NS, ...)")] = {}


class JobGpu(Struct, frozen=True):
    """A GPU of this node allocated to the job, mapped from Slurm's index to NVML's UUID."""

    gpu_uuid: GpuUuid
    gpu_index: num("NVML index", 0, INT16_MAX) | None = None
    pci_bus_id: text("PCI bus id", 32) | None = None


class JobRecord(Struct, frozen=True):
    """What the agent knows of a job (from prolog, epilog, squeue). Missing fields keep stored values."""

    job_id: JobId
    user_name: text("job owner", 255) | None = None
    uid: num("job owner's uid", 0, INT32_MAX) | None = None
    account: text("Slurm account", 255) | None = None
    partition: text("Slurm partition", 255) | None = None
    job_name: text("job name", 1024) | None = None
    nodes: Annotated[list[Name], _d("all nodes of the job", max_length=100_000)] | None = None
    gpus_total: num("GPUs allocated over all nodes", 0, INT32_MAX) | None = None
    time_limit_s: num("time limit, seconds", 0, INT64_MAX) | None = None
    submit_time: Timestamp | None = None
    start_time: Timestamp | None = None
    end_time: Timestamp | None = None
    state: Annotated[str, _d("Slurm job state, e.g. RUNNING, COMPLETED", max_length=32, pattern=r"^[A-Z_]+$")] | None = None
    exit_code: num("exit code of the job", -INT32_MAX, INT32_MAX) | None = None
    tags: Annotated[dict[str, str], _d("researcher's tags from #SBATCH hooks")] = {}
    gpus: Annotated[list[JobGpu], _d("this node's GPUs of the job")] = []


class AppEvent(Struct, frozen=True):
    """An application event from inside a job; job/step/rank/pid come from the kernel's view of the sender."""

    ts: Timestamp
    pid: Annotated[int, _d("sender's pid (SO_PEERCRED)", ge=1, le=INT32_MAX)]
    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    kind: Kind = "log"  # log, phase_start, phase_end, step, ...
    uid: num("sender's uid (SO_PEERCRED)", 0, INT32_MAX) | None = None
    job_id: JobId | None = None  # NULL = node-level: the sender is in no job
    step: StepId | None = None
    rank: num("SLURM_PROCID of the sender", 0, INT32_MAX) | None = None
    local_rank: num("SLURM_LOCALID of the sender", 0, INT32_MAX) | None = None
    name: text("phase name or metric name", 255) | None = None
    message: Annotated[str, _d("event text", max_length=8192)] = ""
    attrs: Attrs = {}


class NodeValidation(Struct, frozen=True):
    """One check of `jobpulse-agent validate` on this node (per GPU where gpu_uuid is set)."""

    ts: Timestamp
    check: Annotated[str, _d("check name, e.g. pcie_link, ecc_mode, driver_version", min_length=1, max_length=64,
                             pattern=r"^[a-z][a-z0-9_]*$")]
    status: Literal["pass", "warn", "fail"]
    observed: text("what the node shows", 4096)
    expected: text("what it should show", 4096)
    message: text("why it matters / what to do", 4096) = ""
    gpu_uuid: GpuUuid | None = None


class Dropped(Struct, frozen=True):
    """What the agent had to drop since its previous batch (spool full, rate limits): never silent."""

    gpu_samples: num("GPU samples dropped", 0, INT32_MAX) = 0
    process_samples: num("process samples dropped", 0, INT32_MAX) = 0
    events: num("application events dropped", 0, INT32_MAX) = 0
    batches: num("whole batches dropped from a full spool", 0, INT32_MAX) = 0


class Batch(Struct, frozen=True, kw_only=True):
    """Everything one agent sends in one flush. ``(agent.instance, seq)`` is unique per batch."""

    version: Annotated[int, _d("wire format version; this document describes 1")]
    agent: AgentInfo
    seq: Annotated[int, _d("batch sequence number of this agent instance, from 0", ge=0, le=INT64_MAX)]
    created_at: Annotated[datetime, Meta(tz=True, description="when the agent built the batch (kept on replay)")]
    gpu_samples: list[GpuSample] = []
    process_samples: list[ProcessSample] = []
    health_events: list[HealthEvent] = []
    topology: list[TopologyGpu] = []
    jobs: list[JobRecord] = []
    events: list[AppEvent] = []
    validations: list[NodeValidation] = []
    dropped: Dropped = Dropped()


TIME_SERIES = ("gpu_samples", "process_samples", "health_events", "events", "validations")
"""Batch fields that carry timestamped rows (each record has ``ts``)."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Batch)


def encode(batch: Batch) -> bytes:
    """Serialize a batch to JSON bytes (what the agent sends)."""
    return _encoder.encode(batch)


def decode(body: bytes) -> Batch:
    """Parse and type-check a batch; raises ``msgspec.DecodeError`` or ``msgspec.ValidationError``."""
    return _decoder.decode(body)
