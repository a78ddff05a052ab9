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
import msgspec.inspect as mi
from msgspec import Meta, Struct

from jobpulse.schema import fields
from jobpulse.schema.fields import INT16_MAX, INT32_MAX, INT64_MAX

WIRE_VERSION = 1
SUPPORTED_VERSIONS = (1,)


def _d(description: str, **limits: Any) -> Meta:
    return Meta(description=description, **limits)


def num(description: str, lo: int = 0, hi: int = 2**63 - 1) -> Any:
    """An integer whose bounds match its column type (smallint, integer or bigint)."""
    return Annotated[int, _d(description, ge=lo, le=hi)]


def text(description: str, max_length: int) -> Any:
    return Annotated[str, _d(description, max_length=max_length)]


# Shared field types. ``tz=True``: a timestamp without a UTC offset is rejected, never guessed.
Timestamp = Annotated[datetime, Meta(tz=True, description="RFC 3339 time with offset (UTC preferred), the agent's clock")]
Name = Annotated[str, _d("name without spaces: node, cluster", min_length=1, max_length=255, pattern=r"^[^\s\x00]+$")]
JOB_ID_PATTERN = r"^[0-9]+(_[0-9]+)?(\+[0-9]+)?$"
JobId = Annotated[
    str,
    _d("Slurm job id: `123`, array task `123_4`, het component `123+1`", max_length=64, pattern=JOB_ID_PATTERN),
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
    process_interval_s: Annotated[float, _d("seconds between the agent's process samples (its sampling interval);"
                                            " a held row's ticks fit in the time it stands for", ge=0.1, le=3600)] = 1.0


def _wire_type(f: fields.Field) -> Any:
    """The wire type of a table field: identities keep their own types, numbers their bounds."""
    if f.name in _IDENTITIES:
        return _IDENTITIES[f.name]
    unit = f" ({f.unit})" if f.unit else ""
    if f.sql == "text":
        return text(f.description, int(f.upper))
    if f.sql == "boolean":
        return Annotated[bool, _d(f.description)]
    cast = f.python
    return Annotated[cast, _d(f"{f.description}{unit}", ge=cast(f.lo), le=cast(f.upper))]


def _record(name: str, doc: str, head: list[tuple[str, Any] | tuple[str, Any, Any]],
            table: tuple[fields.Field, ...]) -> Any:
    """A record struct: the fixed identity fields, then one optional field per table row (NULL =
    not supported / not known), in column order."""
    cls = msgspec.defstruct(name, [*head, *((f.name, _wire_type(f) | None, None) for f in table)],
                            frozen=True, module=__name__)
    cls.__doc__ = doc
    return cls


ProcState = Annotated[str, _d("the kernel's state letter of the process (proc(5): R, S, D, T, t, Z, ...)",
                              min_length=1, max_length=1, pattern=r"^[A-Za-z]$")]
_IDENTITIES: dict[str, Any] = {"gpu_uuid": GpuUuid, "job_id": JobId, "step": StepId, "state": ProcState}

GpuSample = _record(
    "GpuSample", "One GPU at one time, as `nvidia-smi dmon -s pucvmet` shows it, plus GPM. NULL = not supported.",
    [("ts", Timestamp), ("gpu_uuid", GpuUuid),
     ("gpu_index", Annotated[int, _d("NVML index on the node (an attribute, never a key)", ge=0, le=INT16_MAX)]),
     ("job_id", JobId | None, None)],
    fields.GPU_FIELDS)

ProcessSample = _record(
    "ProcessSample", "One process at one time, attributed by the agent from /proc (never from what it claims).",
    [("ts", Timestamp), ("pid", Annotated[int, _d("process id on the node", ge=1, le=INT32_MAX)])],
    fields.PROCESS_FIELDS)

FabricSample = _record(
    "FabricSample", "One RDMA port (InfiniBand, or RoCE with its Ethernet interface) at one time, from sysfs. "
    "``job_id`` is set when one job holds the node alone (its traffic is the job's); NULL on a shared or idle "
    "node (the node's traffic).",
    [("ts", Timestamp),
     ("device", Annotated[str, _d("RDMA device, e.g. mlx5_0", min_length=1, max_length=64,
                                  pattern=r"^[A-Za-z0-9_.:-]+$")]),
     ("port", Annotated[int, _d("port number on the device, from 1", ge=0, le=INT16_MAX)]),
     ("job_id", JobId | None, None),
     ("netdev", Annotated[str, _d("the RoCE port's Ethernet interface", min_length=1, max_length=64,
                                  pattern=r"^[A-Za-z0-9_.:@-]+$")] | None, None)],
    fields.FABRIC_FIELDS)


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
    numa_node: num("the CPU NUMA node nearest the GPU (nvidia-smi topo -m: NUMA Affinity)", -1, INT16_MAX) | None = None
    cpu_affinity: text("CPU list near the GPU, e.g. 0-15,32-47", 1024) | None = None
    pcie_gen_max: num("max PCIe generation", 0, INT16_MAX) | None = None
    pcie_width_max: num("max PCIe width, lanes", 0, INT16_MAX) | None = None
    nvlinks_up: num("NVLink links active", 0, INT16_MAX) | None = None
    mig_mode: Annotated[bool | None, _d("MIG mode enabled")] = None
    links: Annotated[dict[str, str], _d("peer GPU UUID -> link as `nvidia-smi topo -m` prints it: NV#, PIX, PXB, PHB, NODE, SYS")] = {}
    p2p: Annotated[dict[str, str], _d("peer GPU UUID -> P2P read status (OK, NS, ...)")] = {}
    parent_uuid: Annotated[GpuUuid | None, _d("a MIG instance: the UUID of the GPU it is a slice of")] = None
    mig_profile: text("a MIG instance's profile, e.g. 1g.10gb (dcgm-exporter's GPU_I_PROFILE)", 32) | None = None
    gpu_instance_id: num("a MIG instance's GPU instance id (dcgm-exporter's GPU_I_ID)", 0, INT32_MAX) | None = None
    compute_instance_id: num("a MIG instance's compute instance id", 0, INT32_MAX) | None = None


class JobGpu(Struct, frozen=True):
    """A GPU of this node allocated to the job, mapped from Slurm's index to NVML's UUID."""

    gpu_uuid: GpuUuid
    gpu_index: num("NVML index", 0, INT16_MAX) | None = None
    pci_bus_id: text("PCI bus id", 32) | None = None
    share: Annotated[float, _d("the share of the GPU the job holds when it shares it (Slurm MPS: "
                               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / 100); unset: all of it (or of its MIG slice)",
                               gt=0, le=1)] | None = None


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
    state_since: Annotated[datetime, _d("when the job entered ``state`` (squeue's suspend_time: the moment Slurm "
                                        "suspended or resumed it); unset: its start, or when this was sent",
                                        tz=True)] | None = None
    exit_code: num("exit code of the job", -INT32_MAX, INT32_MAX) | None = None
    cpus: num("CPUs allocated over all nodes", 0, INT32_MAX) | None = None
    mem_mib: num("memory allocated over all nodes, MiB", 0, INT64_MAX) | None = None
    script_hash: Annotated[str, _d("SHA-256 of the batch script without its #SBATCH lines: the same work",
                                   min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")] | None = None
    run: num("the job's run: Slurm's restart count (SLURM_RESTART_COUNT, squeue's restart_cnt), 0 for the "
             "first; a requeued job keeps its id and runs again with the next", 0, INT32_MAX) | None = None
    tags: Annotated[dict[str, str], _d("researcher's tags from #SBATCH hooks")] = {}
    gpus: Annotated[list[JobGpu], _d("this node's GPUs of the job")] = []


def _text_limit(t: mi.Type) -> int | None:
    """The length limit of a descriptive text type (a limit and no pattern: a name, not an identity)."""
    if isinstance(t, mi.UnionType):
        return next((limit for x in t.types if (limit := _text_limit(x)) is not None), None)
    if isinstance(t, mi.Metadata):
        return _text_limit(t.type)
    return t.max_length if isinstance(t, mi.StrType) and t.pattern is None else None


def clipped(cls: type[Struct], values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``values`` with every descriptive text field of ``cls`` (job name, user, account, ...) cut to
    the length its column holds, and the names of those cut: a long name never costs the record
    that carries a job's identity. Identities (fields with a pattern: job id, state) are left whole,
    for validation to refuse."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    out, cut = dict(values), []
    for f in info.fields:
        limit = _text_limit(f.type)
        value = out.get(f.name)
        if limit is not None and isinstance(value, str) and len(value) > limit:
            out[f.name] = value[:limit]
            cut.append(f"{f.name} ({len(value)} characters, kept {limit})")
    return out, cut


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


class PartitionQueue(Struct, frozen=True):
    """What waits in one Slurm partition at one time, as slurm-sync reads it from the controller (a
    controller's token only): the jobs waiting to start (pending, not held) and, of them, those asking
    for GPUs and how many GPUs they ask. A job submitted to several partitions waits in each."""

    ts: Timestamp
    partition: Annotated[str, _d("Slurm partition", min_length=1, max_length=255, pattern=r"^[^\s\x00,]+$")]
    jobs_pending: num("jobs waiting to start in the partition (pending, not held)", 0, INT32_MAX)
    gpu_jobs_pending: num("of them, jobs asking for GPUs", 0, INT32_MAX)
    gpus_pending: num("GPUs those jobs ask, over all their nodes", 0, INT32_MAX)
    source: Annotated[Literal["openmetrics", "squeue"], _d(
        "what counted jobs_pending: slurmctld's OpenMetrics (Slurm 25.11+, MetricsType=metrics/openmetrics) or "
        "squeue --json; the GPU jobs and GPUs asked are squeue's in both")]


class Dropped(Struct, frozen=True):
    """What the agent had to drop since its previous batch (spool full, rate limits): never silent."""

    gpu_samples: num("GPU samples dropped", 0, INT32_MAX) = 0
    process_samples: num("process samples dropped", 0, INT32_MAX) = 0
    events: num("application events dropped", 0, INT32_MAX) = 0
    batches: num("whole batches dropped from a full spool", 0, INT32_MAX) = 0


class Capture(Struct, frozen=True):
    """The collector asks a node's agent (in its answer to a batch) for evidence on a flag: the Python
    stacks of these processes of the job, sampled for a few seconds."""

    id: num("capture id", 1, INT64_MAX)
    job_id: JobId
    pids: Annotated[list[Annotated[int, Meta(ge=1, le=INT32_MAX)]], _d("the rank's main process first, then its "
                                                                        "data-loader workers", min_length=1, max_length=16)]
    seconds: Annotated[float, _d("how long to sample stacks, or to wait for a trace's steps", gt=0, le=300)]
    kind: Annotated[Literal["stacks", "trace"], _d("stacks: sample the processes' Python stacks (py-spy); trace: ask "
                                                  "the rank's in-job client for a profiler trace")] = "stacks"
    steps: Annotated[int, _d("training steps a trace covers", ge=0, le=100)] = 0
    max_bytes: Annotated[int, _d("the largest compressed trace the collector keeps", ge=0, le=64 * 2**20)] = 0


Role = Literal["main", "workers"]  # a rank's process on its GPU, or one of its other processes (data loaders)


class StackShare(Struct, frozen=True):
    """One call path and the share of a role's samples spent in it."""

    role: Role
    frames: text("call path, caller first: `load (data.py) > decode (img.py)`", 2048)
    share: Annotated[float, _d("share of the role's samples, 0-1", ge=0, le=1)]


class KernelShare(Struct, frozen=True):
    """One GPU kernel (its name shortened) and its share of the trace's GPU kernel time."""

    name: text("kernel name without arguments and templates", 256)
    percent: Annotated[float, _d("share of all kernels' summed durations", ge=0, le=100)]


class TraceSummary(Struct, frozen=True, kw_only=True):
    """Where a rank's GPU time went in a profiler trace: the breakdown Holistic Trace Analysis gives
    (temporal breakdown, idle time by cause, communication/computation overlap, kernel types), each
    share in percent of the span from the first kernel's start to the last one's end."""

    span_s: Annotated[float, _d("first GPU kernel start to last GPU kernel end, seconds", ge=0, le=86400)]
    steps: Annotated[int, _d("profiler steps (ProfilerStep#N) the span covers", ge=0, le=INT32_MAX)]
    idle_percent: Annotated[float, _d("no kernel running", ge=0, le=100)]
    compute_percent: Annotated[float, _d("a computation kernel running", ge=0, le=100)]
    communication_percent: Annotated[float, _d("communication kernels running and no computation", ge=0, le=100)]
    memory_percent: Annotated[float, _d("memcpy/memset running and no computation or communication", ge=0, le=100)]
    overlap_percent: Annotated[float, _d("share of communication time overlapped by computation", ge=0, le=100)] \
        | None = None
    host_wait_percent: Annotated[float, _d("of the streams' idle time: the host had not launched the next kernel",
                                           ge=0, le=100)]
    launch_gap_percent: Annotated[float, _d("of the streams' idle time: gaps under 30 us between kernels",
                                            ge=0, le=100)]
    other_wait_percent: Annotated[float, _d("of the streams' idle time: waiting on other streams (kernels, "
                                            "communication) or unknown", ge=0, le=100)]
    top_kernels: Annotated[list[KernelShare], _d("the kernels that took the most GPU time", max_length=5)] = []
    rank: Annotated[int, _d("the trace's rank (distributedInfo)", ge=0, le=INT32_MAX)] | None = None
    device: text("the GPU model the trace names", 128) = ""


class CaptureResult(Struct, frozen=True):
    """What a capture found, or why it found nothing (``ok`` false and ``reason``)."""

    id: num("capture id, as asked", 1, INT64_MAX)
    job_id: JobId
    ok: bool
    seconds: Annotated[float, _d("how long it sampled", ge=0, le=120)] = 0.0
    samples: Annotated[dict[Role, Annotated[int, Meta(ge=0, le=INT32_MAX)]],
                       _d("stacks sampled per role")] = {}
    top: Annotated[list[StackShare], _d("the heaviest call paths per role", max_length=24)] = []
    reason: text("why a capture found nothing, or what it could not see", 1024) = ""
    summary: Annotated[TraceSummary | None, _d("a trace capture: where the GPU time went")] = None
    trace: Annotated[bytes, _d("a trace capture: the gzip-compressed profiler trace, when within the "
                               "collector's size cap (base64 in JSON)", max_length=64 * 2**20)] | None = None


class Batch(Struct, frozen=True, kw_only=True):
    """Everything one agent sends in one flush. ``(agent.instance, seq)`` is unique per batch."""

    version: Annotated[int, _d("wire format version; this document describes 1")]
    agent: AgentInfo
    seq: Annotated[int, _d("batch sequence number of this agent instance, from 0", ge=0, le=INT64_MAX)]
    created_at: Annotated[datetime, Meta(tz=True, description="when the agent built the batch (kept on replay)")]
    gpu_samples: list[GpuSample] = []
    process_samples: list[ProcessSample] = []
    fabric_samples: list[FabricSample] = []
    health_events: list[HealthEvent] = []
    topology: list[TopologyGpu] = []
    jobs: list[JobRecord] = []
    events: list[AppEvent] = []
    validations: list[NodeValidation] = []
    queue: Annotated[list[PartitionQueue], _d("slurm-sync: what waits in each partition")] = []
    captures: Annotated[list[CaptureResult], _d("answers to the collector's capture requests", max_length=16)] = []
    dropped: Dropped = Dropped()


TIME_SERIES = ("gpu_samples", "process_samples", "fabric_samples", "health_events", "events", "validations", "queue")
"""Batch fields that carry timestamped rows (each record has ``ts``)."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Batch)


def encode(batch: Batch) -> bytes:
    """Serialize a batch to JSON bytes (what the agent sends)."""
    return _encoder.encode(batch)


def decode(body: bytes) -> Batch:
    """Parse and type-check a batch; raises ``msgspec.DecodeError`` or ``msgspec.ValidationError``."""
    return _decoder.decode(body)
