"""The one module that talks to NVML (through nvidia-ml-py's ``pynvml``).

Everything above it sees plain Python values: a call that fails (NotSupported, NoPermission,
FunctionNotFound, ...) yields ``None`` for that one field and is logged once per GPU and
field; a GPU that stops answering (GpuIsLost) is marked lost, reported once, and skipped.

A GPU in MIG mode is listed, and after it each of its MIG instances as a GPU of its own (keyed by
its ``MIG-`` UUID, linked to its parent): NVML answers only identity, memory and processes on an
instance's handle; everything else exists only on the parent.
"""

from __future__ import annotations

from collections.abc import Callable
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
_VALUE_MEMBER = {pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
                 pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
                 pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal"}


# Reads that take only the device handle and return the value as NVML gives it.
SCALARS: dict[str, Callable[[Any], int]] = {
    "power_mw": pynvml.nvmlDeviceGetPowerUsage,
    "power_limit_mw": pynvml.nvmlDeviceGetEnforcedPowerLimit,
    "power_default_limit_mw": pynvml.nvmlDeviceGetPowerManagementDefaultLimit,
    "energy_mj": pynvml.nvmlDeviceGetTotalEnergyConsumption,
    "pcie_gen": pynvml.nvmlDeviceGetCurrPcieLinkGeneration,
    "pcie_width": pynvml.nvmlDeviceGetCurrPcieLinkWidth,
    "pcie_gen_max": pynvml.nvmlDeviceGetMaxPcieLinkGeneration,
    "pcie_width_max": pynvml.nvmlDeviceGetMaxPcieLinkWidth,
    "pcie_replay": pynvml.nvmlDeviceGetPcieReplayCounter,
    "clock_event_reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons,
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
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(pynvml.nvmlDeviceGetUUID(h))
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
        except pynvml.NVMLError_GpuIsLost:
            gpu.lost = True
            self.lost_now.append(gpu)
            log.error("GPU lost", gpu=gpu.uuid, index=gpu.index, field=name)
            return None
        except Exception as exc:  # noqa: BLE001 - NVMLError, or a binding that does not match the driver
            if name not in gpu.failed:
                gpu.failed.add(name)
                log.info("field unavailable", gpu=gpu.uuid, field=name, reason=str(exc) or type(exc).__name__)
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
    def scalar(self, g: Gpu, name: str) -> int | None:
        """One of the plain integer reads in ``SCALARS`` (by its name there)."""
        fn = SCALARS[name]
        return self.call(g, name, lambda: fn(g.handle))

    def utilization(self, g: Gpu) -> tuple[int, int] | None:
        u = self.call(g, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(g.handle))
        return None if u is None else (int(u.gpu), int(u.memory))

    def engine(self, g: Gpu, engine: str) -> int | None:
        fn = {"enc": pynvml.nvmlDeviceGetEncoderUtilization, "dec": pynvml.nvmlDeviceGetDecoderUtilization,
              "jpg": pynvml.nvmlDeviceGetJpgUtilization, "ofa": pynvml.nvmlDeviceGetOfaUtilization}[engine]
        v = self.call(g, f"{engine}_util", lambda: fn(g.handle))
        return None if v is None else int(v[0])

    def temperature(self, g: Gpu) -> int | None:
        return self.call(g, "temperature",
                         lambda: pynvml.nvmlDeviceGetTemperature(g.handle, pynvml.NVML_TEMPERATURE_GPU))

    def clock(self, g: Gpu, which: str, maximum: bool = False) -> int | None:
        kind = pynvml.NVML_CLOCK_SM if which == "sm" else pynvml.NVML_CLOCK_MEM
        fn = pynvml.nvmlDeviceGetMaxClockInfo if maximum else pynvml.nvmlDeviceGetClockInfo
        return self.call(g, f"{which}_clock{'_max' if maximum else ''}", lambda: fn(g.handle, kind))

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

    def pcie_kbs(self, g: Gpu, direction: str) -> int | None:
        counter = pynvml.NVML_PCIE_UTIL_RX_BYTES if direction == "rx" else pynvml.NVML_PCIE_UTIL_TX_BYTES
        return self.call(g, f"pcie_{direction}", lambda: pynvml.nvmlDeviceGetPcieThroughput(g.handle, counter))

    def ecc_enabled(self, g: Gpu) -> bool | None:
        mode = self.call(g, "ecc_mode", lambda: pynvml.nvmlDeviceGetEccMode(g.handle))
        return None if mode is None else bool(mode[0])

    def persistence_enabled(self, g: Gpu) -> bool | None:
        mode = self.call(g, "persistence_mode", lambda: pynvml.nvmlDeviceGetPersistenceMode(g.handle))
        return None if mode is None else bool(mode)

    def pcie_link(self, g: Gpu) -> tuple[int | None, int | None, int | None, int | None]:
        """(current gen, current width, max gen, max width)."""
        return (self.scalar(g, "pcie_gen"), self.scalar(g, "pcie_width"), self.scalar(g, "pcie_gen_max"),
                self.scalar(g, "pcie_width_max"))

    def ecc_total(self, g: Gpu, uncorrected: bool) -> int | None:
        kind = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED if uncorrected else pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return self.call(g, "ecc_dbe" if uncorrected else "ecc_sbe",
                         lambda: pynvml.nvmlDeviceGetTotalEccErrors(g.handle, kind, pynvml.NVML_VOLATILE_ECC))

    def remapped_rows(self, g: Gpu) -> tuple[int, int, bool, bool] | None:
        r = self.call(g, "remapped_rows", lambda: pynvml.nvmlDeviceGetRemappedRows(g.handle))
        return None if r is None else (int(r[0]), int(r[1]), bool(r[2]), bool(r[3]))

    def field_values(self, g: Gpu, ids: list[int]) -> dict[int, Any]:
        """NVML field values by id; a field whose own return code is an error is left out."""
        values = self.call(g, "field_values", lambda: pynvml.nvmlDeviceGetFieldValues(g.handle, ids))
        out: dict[int, Any] = {}
        for v in values or []:
            if v.nvmlReturn != pynvml.NVML_SUCCESS:
                if f"fv{v.fieldId}" not in g.failed:
                    g.failed.add(f"fv{v.fieldId}")
                    log.info("field unavailable", gpu=g.uuid, field=f"field_value_{v.fieldId}",
                             reason=pynvml.nvmlErrorString(v.nvmlReturn))
                continue
            out[v.fieldId] = getattr(v.value, _VALUE_MEMBER.get(v.valueType, "ullVal"))
        return out

    def compute_processes(self, g: Gpu) -> list[tuple[int, int | None]]:
        """(pid, used GPU memory bytes or None) of compute processes on the GPU."""
        procs = self.call(g, "processes", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(g.handle))
        return [(int(p.pid), p.usedGpuMemory) for p in procs or []]

    def process_utilization(self, g: Gpu, since_us: int) -> dict[int, tuple[int, int]]:
        """pid -> (SM %, memory %) over samples newer than ``since_us``; empty when none."""
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(g.handle, since_us)
        except pynvml.NVMLError_NotFound:
            return {}  # no process ran in the window: a quiet outcome, not an error
        except pynvml.NVMLError:
            self.call(g, "process_utilization", lambda: pynvml.nvmlDeviceGetProcessUtilization(g.handle, since_us))
            return {}
        return {int(s.pid): (int(s.smUtil), int(s.memUtil)) for s in samples}

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
        if mask is None:
            return None
        return [w * 64 + bit for w, word in enumerate(mask) for bit in range(64) if int(word) >> bit & 1]

    def numa_node(self, g: Gpu) -> int | None:
        return self.call(g, "numa_node", lambda: pynvml.nvmlDeviceGetNumaNodeId(g.handle))

    def mig_mode(self, g: Gpu) -> bool | None:
        m = self.call(g, "mig_mode", lambda: pynvml.nvmlDeviceGetMigMode(g.handle))
        return None if m is None else bool(m[0])

    # -- GPM (Hopper and later) -------------------------------------------------------------------
    def gpm_supported(self, g: Gpu) -> bool:
        """GPM on the GPU (a MIG instance: on its parent, where NVML answers the query)."""
        device = g.parent or g
        s = self.call(g, "gpm", lambda: pynvml.nvmlGpmQueryDeviceSupport(device.handle))
        return bool(s and s.isSupportedDevice)

    def gpm_sample(self, g: Gpu) -> Any:
        """A GPM sample of the GPU, or of a MIG instance through its parent and GPU instance id."""
        def take() -> Any:
            sample = pynvml.nvmlGpmSampleAlloc()
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

    def gpm_metrics(self, g: Gpu, earlier: Any, later: Any, ids: list[int]) -> dict[int, float]:
        def get() -> Any:
            m = pynvml.c_nvmlGpmMetricsGet_t()
            m.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            m.numMetrics = len(ids)
            m.sample1 = earlier
            m.sample2 = later
            for i, mid in enumerate(ids):
                m.metrics[i].metricId = mid
            return pynvml.nvmlGpmMetricsGet(m)
        got = self.call(g, "gpm", get)
        if got is None:
            return {}
        return {int(got.metrics[i].metricId): float(got.metrics[i].value) for i in range(len(ids))
                if got.metrics[i].nvmlReturn == pynvml.NVML_SUCCESS}

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
