"""The one module that talks to NVML (through nvidia-ml-py's ``pynvml``).

Everything above it sees plain Python values: a call that fails (NotSupported, NoPermission,
FunctionNotFound, ...) yields ``None`` for that one field and is logged once per GPU and
field; a GPU that stops answering (GpuIsLost) is marked lost, reported once, and skipped.

A GPU in MIG mode is listed, and after it each of its MIG instances as a GPU of its own (keyed by
its ``MIG-`` UUID, linked to its parent): NVML answers only identity, memory and processes on an
instance's handle; everything else exists only on the parent.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml
import structlog

log = structlog.get_logger("jobpulse.agent.nvml")
T = TypeVar("T")

# nvidia-smi topo -m legend for NVML's common-ancestor levels.
TOPO_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "NS", 5: "NS", 6: "U"}
MAX_NVLINKS = 18
P2P_CAPS_INDEX_READ = 0
NO_INSTANCE = 0xFFFFFFFF  # NVML_INVALID_GPU_INSTANCE_ID: an event of the whole GPU, not of one instance


NUMA_MASK_WORDS = 4  # 256 NUMA nodes

NVMLError = pynvml.NVMLError  # the bindings' error, for the few callers that wait on NVML themselves
NVLINK_TX, NVLINK_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
HEALTH_EVENTS = {pynvml.nvmlEventTypeXidCriticalError: "xid", pynvml.nvmlEventTypeSingleBitEccError: "ecc_sbe",
                 pynvml.nvmlEventTypeDoubleBitEccError: "ecc_dbe"}
"""The event types the agent waits on, by the name its health events carry."""


def constant(name: str | None) -> int | None:
    """The bindings' id for an ``NVML_FI_*`` / ``NVML_GPM_METRIC_*`` name, ``None`` where the name is
    unset or the installed bindings are too old to know it (that field is then not read)."""
    return getattr(pynvml, name, None) if name else None


def _bits(mask: Sequence[int]) -> list[int]:
    """The set bits of an NVML affinity mask (64-bit words, lowest first)."""
    return [w * 64 + bit for w, word in enumerate(mask) for bit in range(64) if int(word) >> bit & 1]


def mib(n_bytes: int) -> int:
    """Bytes as whole MiB rounded up, as nvidia-smi prints memory (615.06 MiB reserved reads 616 there
    on an H200; rounding down read 1 MiB below nvidia-smi in every sample)."""
    return -(-n_bytes // 1048576)


def _layout(ctype: type[ctypes.Structure], members: dict[str, str]) -> struct.Struct:
    """A ``struct`` reading the named members (in offset order, by struct code) of one ``ctype``
    element at the offsets ctypes gives them: an array NVML filled is read in one ``iter_unpack``,
    not through pynvml's structure wrappers (a Python call per attribute)."""
    fmt, at = "=", 0
    for name, code in members.items():
        offset = getattr(ctype, name).offset
        if offset < at:
            raise TypeError(f"{ctype.__name__}.{name}: members out of offset order")
        fmt, at = fmt + f"{offset - at}x{code}", offset + struct.calcsize("=" + code)
    return struct.Struct(fmt + f"{ctypes.sizeof(ctype) - at}x")


# nvmlFieldValue_t: (fieldId, valueType, nvmlReturn, the value union's bytes), and the union read by valueType.
_FIELD_VALUE = _layout(pynvml.c_nvmlFieldValue_t, {"fieldId": "I", "valueType": "I", "nvmlReturn": "I",
                                                   "value": f"{ctypes.sizeof(pynvml.c_nvmlValue_t)}s"})
_VALUE_CODE = {pynvml.NVML_VALUE_TYPE_DOUBLE: "d", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "I",
               pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "L", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "Q",
               pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "q", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "i",
               pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "H"}
_VALUE = {kind: struct.Struct("@" + code) for kind, code in _VALUE_CODE.items()}  # native: as the C union
# nvmlGpmMetric_t: (metricId, nvmlReturn, value); nvmlProcessInfo_v2_t (= v3): (pid, usedGpuMemory);
# nvmlProcessUtilizationSample_t: (pid, smUtil, memUtil).
_GPM_METRIC = _layout(pynvml.c_nvmlGpmMetric_t, {"metricId": "I", "nvmlReturn": "I", "value": "d"})
_PROCESS = _layout(pynvml.c_nvmlProcessInfo_v2_t, {"pid": "I", "usedGpuMemory": "Q"})
_PROCESS_UTIL = _layout(pynvml.c_nvmlProcessUtilizationSample_t, {"pid": "I", "smUtil": "I", "memUtil": "I"})
_NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


@functools.cache
def _c_function(name: str) -> Any:
    """NVML's C function itself, found through pynvml's loader (its lock, its FunctionNotFound), for
    the per-sample reads whose pynvml wrapper sets or builds a Python object per element and member:
    the agent fills and reads those arrays as bytes instead. Looked up once per name (pynvml takes a
    lock for each look-up); a name the driver lacks raises each time, as pynvml does."""
    return pynvml._nvmlGetFunctionPointer(name)


def _check(ret: int) -> None:
    if ret != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(ret)  # pynvml's subclass for the code: GpuIsLost, NotSupported, ...


@functools.cache
def _field_request(ids: tuple[tuple[int, int], ...]) -> tuple[type[ctypes.Array[Any]], bytes]:
    """The nvmlFieldValue_t array type for ``ids`` and its request (ids and scopes set) as bytes:
    built once, copied per call."""
    array = pynvml.c_nvmlFieldValue_t * len(ids)
    request = array()
    for entry, (fid, scope) in zip(request, ids):
        entry.fieldId, entry.scopeId = fid, scope
    return array, bytes(request)


@dataclass(frozen=True)
class _Read:
    """A read NVML answers in one number: its C function, the arguments before the outputs, the
    output's C type, and how many outputs the function fills (the engines' second one is their
    sampling period). Called directly, as pynvml's wrapper would, but without the exception
    pynvml raises every sample for a field the GPU does not have."""

    function: str
    args: tuple[int, ...] = ()
    out: type[ctypes.c_uint] | type[ctypes.c_ulonglong] = ctypes.c_uint
    outs: int = 1


# The reads by the name a failure is recorded under (``Gpu.failed``).
READS: dict[str, _Read] = {
    "power_mw": _Read("nvmlDeviceGetPowerUsage"),  # only where the power field ids are unknown (drivers before R535)
    "power_limit_mw": _Read("nvmlDeviceGetEnforcedPowerLimit"),
    "power_default_limit_mw": _Read("nvmlDeviceGetPowerManagementDefaultLimit"),
    "pcie_gen": _Read("nvmlDeviceGetCurrPcieLinkGeneration"),
    "pcie_width": _Read("nvmlDeviceGetCurrPcieLinkWidth"),
    "pcie_gen_max": _Read("nvmlDeviceGetMaxPcieLinkGeneration"),
    "pcie_width_max": _Read("nvmlDeviceGetMaxPcieLinkWidth"),
    "clock_event_reasons": _Read("nvmlDeviceGetCurrentClocksEventReasons", out=ctypes.c_ulonglong),
    "temperature": _Read("nvmlDeviceGetTemperature", (pynvml.NVML_TEMPERATURE_GPU,)),
    "sm_clock": _Read("nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_SM,)),
    "mem_clock": _Read("nvmlDeviceGetClockInfo", (pynvml.NVML_CLOCK_MEM,)),
    "sm_clock_max": _Read("nvmlDeviceGetMaxClockInfo", (pynvml.NVML_CLOCK_SM,)),
    "mem_clock_max": _Read("nvmlDeviceGetMaxClockInfo", (pynvml.NVML_CLOCK_MEM,)),
    "pcie_rx": _Read("nvmlDeviceGetPcieThroughput", (pynvml.NVML_PCIE_UTIL_RX_BYTES,)),
    "pcie_tx": _Read("nvmlDeviceGetPcieThroughput", (pynvml.NVML_PCIE_UTIL_TX_BYTES,)),
    "enc_util": _Read("nvmlDeviceGetEncoderUtilization", outs=2),
    "dec_util": _Read("nvmlDeviceGetDecoderUtilization", outs=2),
    "jpg_util": _Read("nvmlDeviceGetJpgUtilization", outs=2),
    "ofa_util": _Read("nvmlDeviceGetOfaUtilization", outs=2),
}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be loaded or initialized on this node (no driver, no GPU)."""


@dataclass
class Gpu:
    index: int
    handle: Any
    uuid: str
    name: str | None
    pci_bus_id: str | None
    minor: int | None
    lost: bool = False
    failed: set[str] = field(default_factory=set)
    mig: bool = False  # a GPU in MIG mode: its work runs on (and is read from) its instances
    parent: Gpu | None = None  # a MIG instance: the GPU it is a slice of
    gi: int | None = None  # a MIG instance's GPU instance id (dcgm-exporter's GPU_I_ID)
    ci: int | None = None  # ... and compute instance id
    profile: str | None = None  # ... and profile (dcgm-exporter's GPU_I_PROFILE), e.g. "1g.10gb"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Nvml:
    """An initialized NVML session and the node's GPUs in NVML index order."""

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML is not available on this node: {exc}") from None
        except OSError as exc:
            raise NvmlUnavailable(f"cannot load libnvidia-ml.so.1: {exc}") from None
        self.gpus: list[Gpu] = []
        self.lost_now: list[Gpu] = []
        self._gpm_requests: dict[tuple[str, tuple[int, ...]], Any] = {}  # (GPU, metric ids) -> nvmlGpmMetricsGet_t
        self._bound: dict[tuple[str, str], tuple[Any, tuple[Any, ...], Any]] = {}  # (GPU, read) -> fn, args, output
        self._read_lock = threading.Lock()
        for i in range(pynvml.nvmlDeviceGetCount()):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            except pynvml.NVMLError as exc:  # lost or broken before it could be named: the others go on
                log.error("GPU not enumerated: not sampled", index=i, error=str(exc))
                continue
            gpu = Gpu(i, h, uuid, None, None, None)
            gpu.name = self.call(gpu, "name", lambda: _text(pynvml.nvmlDeviceGetName(h)))
            gpu.pci_bus_id = self.call(gpu, "pci_bus_id", lambda: _text(pynvml.nvmlDeviceGetPciInfo(h).busId))
            gpu.minor = self.call(gpu, "minor", lambda: pynvml.nvmlDeviceGetMinorNumber(h))
            gpu.mig = bool(self.mig_mode(gpu))
            self.gpus += [gpu, *(self._instances(gpu) if gpu.mig else ())]

    @property
    def physical(self) -> list[Gpu]:
        """The GPUs themselves, without MIG instances (topology, events, node checks)."""
        return [g for g in self.gpus if g.parent is None]

    def _instances(self, parent: Gpu) -> list[Gpu]:
        """The MIG instances (compute instances) of a GPU in MIG mode, in MIG device index order."""
        out = []
        for i in range(self.call(parent, "mig_devices", lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(parent.handle))
                       or 0):
            try:
                h = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, i)
            except pynvml.NVMLError_NotFound:
                continue  # no compute instance at this index
            except pynvml.NVMLError as exc:
                log.info("MIG device unreadable", gpu=parent.uuid, index=i, reason=str(exc))
                continue
            try:
                uuid = _text(pynvml.nvmlDeviceGetUUID(h))
            except pynvml.NVMLError as exc:
                log.info("MIG device unreadable", gpu=parent.uuid, index=i, reason=str(exc))
                continue
            g = Gpu(parent.index, h, uuid, parent.name, parent.pci_bus_id, None, parent=parent)
            g.gi = self.call(g, "gpu_instance_id", lambda: pynvml.nvmlDeviceGetGpuInstanceId(h))
            g.ci = self.call(g, "compute_instance_id", lambda: pynvml.nvmlDeviceGetComputeInstanceId(h))
            # NVML names an instance "<GPU name> MIG <profile>", as `nvidia-smi -L` lists it.
            name = self.call(g, "name", lambda: _text(pynvml.nvmlDeviceGetName(h))) or ""
            g.profile = name.rsplit(" MIG ", 1)[1].strip() if " MIG " in name else None
            out.append(g)
        return out

    def shutdown(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass

    def call(self, gpu: Gpu, name: str, fn: Callable[[], T]) -> T | None:
        """Run one NVML read for ``gpu``; ``None`` (logged once) when it fails."""
        if gpu.lost:
            return None
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - NVMLError, or a binding that does not match the driver
            self._failed(gpu, name, exc)
            return None

    def _failed(self, gpu: Gpu, name: str, exc: Exception) -> None:
        """A lost GPU is marked and reported once; any other failure is logged once per GPU and field."""
        if isinstance(exc, pynvml.NVMLError_GpuIsLost):
            gpu.lost = True
            self.lost_now.append(gpu)
            log.error("GPU lost", gpu=gpu.uuid, index=gpu.index, field=name)
        elif name not in gpu.failed:
            gpu.failed.add(name)
            log.info("field unavailable", gpu=gpu.uuid, field=name, reason=str(exc) or type(exc).__name__)

    def read(self, g: Gpu, name: str) -> int | None:
        """One of the ``READS`` (by its name there); ``None`` when it fails, as ``call`` gives. Each
        is bound once per GPU (C function, arguments, output buffers): the sampler makes a dozen
        per GPU every second. The lock gives a bound read's buffers to one caller at a time."""
        if g.lost:
            return None
        try:
            with self._read_lock:
                bound = self._bound.get((g.uuid, name))
                if bound is None:
                    r = READS[name]
                    outs = [r.out() for _ in range(r.outs)]
                    bound = (_c_function(r.function), (g.handle, *r.args, *map(ctypes.byref, outs)), outs[0])
                    self._bound[(g.uuid, name)] = bound
                fn, args, out = bound
                ret = fn(*args)
                if ret == pynvml.NVML_SUCCESS:
                    return int(out.value)
            raise pynvml.NVMLError(ret)  # pynvml's subclass for the code: GpuIsLost, NotSupported, ...
        except Exception as exc:  # noqa: BLE001 - FunctionNotFound (an older driver), or the call's own code
            self._failed(g, name, exc)
            return None

    def take_lost(self) -> list[Gpu]:
        """GPUs that became lost since the last call (each reported once)."""
        lost, self.lost_now = self.lost_now, []
        return lost

    # -- system ---------------------------------------------------------------------------------
    @staticmethod
    def driver_version() -> str | None:
        try:
            return _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            return None

    @staticmethod
    def cuda_version() -> str | None:
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion()
        except pynvml.NVMLError:
            return None
        return f"{v // 1000}.{v % 1000 // 10}"

    # -- per-GPU reads used by the samplers -------------------------------------------------------
    def utilization(self, g: Gpu) -> tuple[int, int] | None:
        u = self.call(g, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(g.handle))
        return None if u is None else (int(u.gpu), int(u.memory))


    def memory(self, g: Gpu) -> tuple[int, int, int | None] | None:
        """(used, total, reserved) bytes. Version 2 (drivers 510+) is nvidia-smi's view: ``used``
        leaves out what the driver reserves; older drivers give version 1 and no ``reserved``."""
        if "memory_v2" not in g.failed:
            m = self.call(g, "memory_v2", lambda: pynvml.nvmlDeviceGetMemoryInfo(g.handle, pynvml.nvmlMemory_v2))
            if m is not None:
                return int(m.used), int(m.total), int(m.reserved)
            if g.lost:
                return None
        m = self.call(g, "memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(g.handle))
        return None if m is None else (int(m.used), int(m.total), None)

    def ecc_enabled(self, g: Gpu) -> bool | None:
        mode = self.call(g, "ecc_mode", lambda: pynvml.nvmlDeviceGetEccMode(g.handle))
        return None if mode is None else bool(mode[0])

    def persistence_enabled(self, g: Gpu) -> bool | None:
        mode = self.call(g, "persistence_mode", lambda: pynvml.nvmlDeviceGetPersistenceMode(g.handle))
        return None if mode is None else bool(mode)

    def pcie_link_max(self, g: Gpu) -> tuple[int | None, int | None]:
        """(max gen, max width)."""
        return self.read(g, "pcie_gen_max"), self.read(g, "pcie_width_max")

    def field_values(self, g: Gpu, ids: tuple[tuple[int, int], ...]) -> dict[int, int | float]:
        """NVML field values by id, in one ``nvmlDeviceGetFieldValues`` call (``ids``: (field id,
        scope id) pairs). Each value carries its own return code: one the GPU does not support is
        left out (logged once), the rest still arrive; GpuIsLost on any one marks the GPU lost, as a
        failed call does."""
        array, request = _field_request(ids)

        def read() -> list[tuple[int, int, int, bytes]]:
            values = array.from_buffer_copy(request)
            _check(_c_function("nvmlDeviceGetFieldValues")(g.handle, ctypes.c_int32(len(ids)), ctypes.byref(values)))
            rows = list(_FIELD_VALUE.iter_unpack(bytes(values)))
            if pynvml.NVML_ERROR_GPU_IS_LOST in [ret for _, _, ret, _ in rows]:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return rows
        out: dict[int, int | float] = {}
        for fid, kind, ret, raw in self.call(g, "field_values", read) or ():
            if ret == pynvml.NVML_SUCCESS and kind in _VALUE:
                out[fid] = _VALUE[kind].unpack_from(raw)[0]
            elif f"fv{fid}" not in g.failed:
                g.failed.add(f"fv{fid}")
                log.info("field unavailable", gpu=g.uuid, field=f"field_value_{fid}",
                         reason=pynvml.nvmlErrorString(ret) if ret != pynvml.NVML_SUCCESS else f"value type {kind}")
        return out

    def compute_processes(self, g: Gpu) -> list[tuple[int, int | None]]:
        """(pid, used GPU memory bytes or None) of compute processes on the GPU: NVML's two-call
        size protocol, as pynvml's ``nvmlDeviceGetComputeRunningProcesses`` does it."""
        def read() -> list[tuple[int, int]]:
            fn = _c_function("nvmlDeviceGetComputeRunningProcesses_v3")
            count = ctypes.c_uint(0)
            ret = fn(g.handle, ctypes.byref(count), None)
            if ret == pynvml.NVML_SUCCESS:
                return []  # no process
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                raise pynvml.NVMLError(ret)
            count.value = count.value * 2 + 5  # room for processes started in between
            procs = (pynvml.c_nvmlProcessInfo_v2_t * count.value)()
            _check(fn(g.handle, ctypes.byref(count), procs))
            return list(_PROCESS.iter_unpack(ctypes.string_at(ctypes.addressof(procs), _PROCESS.size * count.value)))
        return [(pid, None if mem == _NOT_AVAILABLE else mem) for pid, mem in self.call(g, "processes", read) or ()]

    def process_utilization(self, g: Gpu, since_us: int) -> dict[int, tuple[int, int]]:
        """pid -> (SM %, memory %) over samples newer than ``since_us``; empty when none. NVML's
        two-call size protocol, as pynvml's ``nvmlDeviceGetProcessUtilization`` does it, with
        the array read as bytes."""
        def read() -> dict[int, tuple[int, int]]:
            fn = _c_function("nvmlDeviceGetProcessUtilization")
            count, since = ctypes.c_uint(0), ctypes.c_ulonglong(since_us)
            ret = fn(g.handle, None, ctypes.byref(count), since)
            if ret == pynvml.NVML_ERROR_NOT_FOUND:
                return {}  # no process ran in the window: a quiet outcome, not an error
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
                raise pynvml.NVMLError(ret)
            samples = (pynvml.c_nvmlProcessUtilizationSample_t * count.value)()
            ret = fn(g.handle, samples, ctypes.byref(count), since)
            if ret == pynvml.NVML_ERROR_NOT_FOUND:
                return {}
            _check(ret)
            raw = ctypes.string_at(ctypes.addressof(samples), _PROCESS_UTIL.size * count.value)
            return {pid: (sm, mem) for pid, sm, mem in _PROCESS_UTIL.iter_unpack(raw)}
        return self.call(g, "process_utilization", read) or {}

    # -- topology --------------------------------------------------------------------------------
    def nvlink_peers(self, g: Gpu) -> list[str] | None:
        """Remote PCI bus ids of active NVLinks (one entry per link); None when NVLink is unsupported."""
        peers = []
        for link in range(MAX_NVLINKS):
            try:
                if not pynvml.nvmlDeviceGetNvLinkState(g.handle, link):
                    continue
                peers.append(_text(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(g.handle, link).busId))
            except pynvml.NVMLError_InvalidArgument:
                break
            except pynvml.NVMLError:
                if link == 0:
                    return None
                continue
        return peers

    def common_ancestor(self, a: Gpu, b: Gpu) -> int | None:
        return self.call(a, "topology", lambda: pynvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle))

    def p2p_read(self, a: Gpu, b: Gpu) -> int | None:
        # pynvml defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,): pass the index itself.
        return self.call(a, "p2p", lambda: pynvml.nvmlDeviceGetP2PStatus(a.handle, b.handle, P2P_CAPS_INDEX_READ))

    def cpu_affinity(self, g: Gpu, ncpus: int) -> list[int] | None:
        words = (ncpus + 63) // 64
        mask = self.call(g, "cpu_affinity", lambda: pynvml.nvmlDeviceGetCpuAffinity(g.handle, words))
        return None if mask is None else _bits(mask)

    def numa_node(self, g: Gpu) -> int | None:
        """The CPU NUMA node nearest the GPU, as `nvidia-smi topo -m` prints it (NUMA Affinity).
        Not `nvmlDeviceGetNumaNodeId`: that is the GPU's own memory as a node, which only coherent
        platforms have (an H200 over PCIe answers NOT_SUPPORTED there and 0 here)."""
        mask = self.call(g, "numa_node", lambda: pynvml.nvmlDeviceGetMemoryAffinity(
            g.handle, NUMA_MASK_WORDS, pynvml.NVML_AFFINITY_SCOPE_NODE))
        nodes = [] if mask is None else _bits(mask)
        return nodes[0] if len(nodes) == 1 else None  # several: the platform does not say which is near

    def mig_mode(self, g: Gpu) -> bool | None:
        m = self.call(g, "mig_mode", lambda: pynvml.nvmlDeviceGetMigMode(g.handle))
        return None if m is None else bool(m[0])

    # -- GPM (Hopper and later) -------------------------------------------------------------------
    def gpm_supported(self, g: Gpu) -> bool:
        """GPM on the GPU (a MIG instance: on its parent, where NVML answers the query)."""
        device = g.parent or g
        s = self.call(g, "gpm", lambda: pynvml.nvmlGpmQueryDeviceSupport(device.handle))
        return bool(s and s.isSupportedDevice)

    def gpm_sample(self, g: Gpu, reuse: Any = None) -> Any:
        """A GPM sample of the GPU, or of a MIG instance through its parent and GPU instance id,
        taken into ``reuse`` (a sample no longer needed: NVML fills a buffer again) or a new one; a
        failed read frees the buffer."""
        def take() -> Any:
            sample = pynvml.nvmlGpmSampleAlloc() if reuse is None else reuse
            try:
                if g.parent is not None:
                    pynvml.nvmlGpmMigSampleGet(g.parent.handle, g.gi, sample)
                else:
                    pynvml.nvmlGpmSampleGet(g.handle, sample)
            except pynvml.NVMLError:
                pynvml.nvmlGpmSampleFree(sample)
                raise
            return sample
        return self.call(g, "gpm", take)

    def gpm_metrics(self, g: Gpu, earlier: Any, later: Any, ids: tuple[int, ...]) -> dict[int, float]:
        """The metrics ``ids`` between two GPM samples. The request (19 KiB, room for every metric
        NVML knows) is built once per GPU and ids and filled again by each call; only the sampling
        thread reads a GPU's metrics."""
        key = (g.uuid, ids)
        m = self._gpm_requests.get(key)
        if m is None:
            m = self._gpm_requests[key] = pynvml.c_nvmlGpmMetricsGet_t()
            m.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            m.numMetrics = len(ids)
            for i, mid in enumerate(ids):
                m.metrics[i].metricId = mid

        def get() -> bool:
            m.sample1, m.sample2 = earlier, later
            _check(_c_function("nvmlGpmMetricsGet")(ctypes.byref(m)))
            return True
        if not self.call(g, "gpm", get):
            return {}
        metrics = ctypes.string_at(ctypes.addressof(m.metrics), _GPM_METRIC.size * len(ids))
        return {mid: value for mid, ret, value in _GPM_METRIC.iter_unpack(metrics) if ret == pynvml.NVML_SUCCESS}

    @staticmethod
    def gpm_free(sample: Any) -> None:
        try:
            pynvml.nvmlGpmSampleFree(sample)
        except pynvml.NVMLError:
            pass

    # -- events ------------------------------------------------------------------------------------
    def event_set(self, types: int) -> Any | None:
        """An event set with every GPU registered for ``types`` it supports; None if unsupported."""
        try:
            es = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("NVML events unavailable", reason=str(exc))
            return None
        for g in self.physical:
            supported = self.call(g, "events", lambda: pynvml.nvmlDeviceGetSupportedEventTypes(g.handle)) or 0
            if supported & types:
                self.call(g, "events", lambda: pynvml.nvmlDeviceRegisterEvents(g.handle, supported & types, es))
        return es

    def wait_event(self, es: Any, timeout_ms: int) -> tuple[list[Gpu], int, int] | None:
        """(the GPUs it concerns, event type, event data) or None on timeout. An event arrives on the
        GPU; in MIG mode NVML names the GPU instance it came from, else it is the whole GPU's and so
        concerns every instance on it (each job on a slice hears of its GPU's fault)."""
        try:
            data = pynvml.nvmlEventSetWait(es, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        uuid = None
        try:
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            pass
        gpu = next((g for g in self.gpus if g.uuid == uuid), None)
        return self._concerned(gpu, int(data.gpuInstanceId)), int(data.eventType), int(data.eventData)

    def _concerned(self, gpu: Gpu | None, gi: int) -> list[Gpu]:
        if gpu is None or not gpu.mig:
            return [gpu] if gpu else []
        instances = [g for g in self.gpus if g.parent is gpu]
        own = [g for g in instances if g.gi == gi] if gi != NO_INSTANCE else []
        return own or instances or [gpu]
