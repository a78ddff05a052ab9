"""What other tools call our GPU fields: one alias table beside the field table (`fields.GPU_FIELDS`),
so a recording written by nvidia-smi, dmon, DCGM, NVML bindings, gpustat, nvitop, a psutil-style logger
or W&B is read through one lookup, not a list of fields per format.

A column name is reduced to its key (`key`: lower case, runs of anything but letters and digits as
one ``_``, a trailing unit in brackets taken off and kept), and a key found here names a field and the
factor to its unit. Identity columns (time, GPU index, UUID, name, bus id) name pseudo-fields that
start with ``@``. A column of one GPU among several in one row (``system.gpu.3.gpu``, ``gpu1_util``,
``cuda:0 (gpu:0)/gpu_utilization (%)/mean``) is split into its GPU and its name (`split_gpu`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jobpulse.schema.fields import GPU_BY_NAME, GPU_FIELDS

TIME, ELAPSED, INDEX, UUID, MODEL, BUS_ID, NODE = "@time", "@elapsed", "@index", "@uuid", "@model", "@bus_id", "@node"
IDENTITY = (TIME, ELAPSED, INDEX, UUID, MODEL, BUS_ID, NODE)

MIB_PER = {"b": 1 / 2**20, "bytes": 1 / 2**20, "kb": 1 / 1024, "kib": 1 / 1024, "mb": 1.0, "mib": 1.0,
           "gb": 1024.0, "gib": 1024.0}
"""A memory unit in MiB (nvidia-smi's MB and GB are MiB and GiB)."""
_KB_S_PER = {"kb/s": 1.0, "kib/s": 1.0, "kbs": 1.0, "b/s": 1 / 1024, "bytes/s": 1 / 1024, "bytes": 1 / 1024,
             "b": 1 / 1024, "mb/s": 1024.0, "mib/s": 1024.0, "gb/s": 2.0**20, "gib/s": 2.0**20}
UNITS: dict[str, dict[str, float]] = {
    # the field table's unit -> a unit a column may be in -> the factor to the field's
    "percent": {"%": 1.0, "pct": 1.0, "percent": 1.0, "ratio": 100.0, "fraction": 100.0, "frac": 100.0},
    "watts": {"w": 1.0, "watt": 1.0, "watts": 1.0, "mw": 1e-3, "kw": 1e3},
    "MHz": {"mhz": 1.0, "ghz": 1e3, "khz": 1e-3},
    "MiB": MIB_PER,
    "KB/s": _KB_S_PER,  # DCGM's PROF_*_BYTES and PCITX/NVLTX are bytes per second
    "degrees Celsius": {"c": 1.0, "°c": 1.0, "celsius": 1.0, "degc": 1.0},
    "millijoules": {"mj": 1.0, "j": 1e3, "kj": 1e6},
    "nanoseconds": {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6},
}
"""What a unit written in a header ('Power (W)', 'memory.used [GiB]', 'sm_clock_ghz') or after a value
('1.5 GiB', '250 W') is in the field's unit."""


def unit_factor(field: str, unit: str) -> float | None:
    """The factor from ``unit`` to ``field``'s unit; None where the unit is not one of the field's."""
    f = GPU_BY_NAME.get(field)
    return UNITS.get(f.unit, {}).get(unit.lower()) if f is not None and unit else None


@dataclass(frozen=True)
class Alias:
    """A column's field (or identity) and the factor from the column's unit to the field's."""

    field: str
    factor: float = 1.0


def unit_of(name: str) -> tuple[str, str]:
    """A column name without a trailing unit in brackets, and that unit ('GPU Util (%)' -> 'GPU Util ', '%')."""
    end = name.rstrip()
    if end[-1:] in ("]", ")"):  # by position, not a pattern: a hostile header cannot make it backtrack
        inside = end[:-1]
        after = max(inside.rfind("]"), inside.rfind(")")) + 1
        opens = [i for i in (inside.find("[", after), inside.find("(", after)) if i >= 0]
        if opens:
            return name[:min(opens)], inside[min(opens) + 1:].strip().lower()
    return name, ""


def key(name: str) -> tuple[str, str]:
    """A column name's lookup key and the unit it names in brackets ('memory.used [MiB]' ->
    ('memory_used', 'mib'); 'GPU Util (%)' -> ('gpu_util', '%'))."""
    base, unit = unit_of(name)
    return re.sub(r"[^a-z0-9]+", "_", base.lower()).strip("_"), unit


_WIDE = (
    re.compile(r"^system_gpu_(\d+)_(.+)$"),  # W&B: system.gpu.0.gpu
    re.compile(r"^cuda_\d+_gpu_(\d+)_(.+?)(?:_mean|_min|_max|_last)?$"),  # nvitop: cuda:0 (gpu:0)/gpu_utilization
    re.compile(r"^(?:gpu|device|cuda)_?(\d+)_(.+)$"),  # gpu0_util, gpu_1_memory_used, device_0_temp
)
_WIDE_TAIL = re.compile(r"^(.+?)_(?:gpu|cuda|device)_?(\d+)$")  # util_gpu0, memory_used_gpu_1


def split_gpu(k: str) -> tuple[int, str] | None:
    """The GPU and the per-GPU key of a column of one GPU among several ('system_gpu_2_powerwatts'
    -> (2, 'system_gpu_powerwatts')), None for a column of no GPU in particular."""
    for i, pattern in enumerate(_WIDE):
        m = pattern.match(k)
        if m:
            prefix = ("system_gpu_", "nvitop_", "gpu_")[i]
            return int(m.group(1)), prefix + m.group(2)
    m = _WIDE_TAIL.match(k)
    if m and m.group(1) not in ("index", "id"):
        return int(m.group(2)), "gpu_" + m.group(1)
    return None


def _names(field: str, *names: str, factor: float = 1.0) -> dict[str, Alias]:
    return {key(n)[0]: Alias(field, factor) for n in names}


_DCGM_TAGS: dict[str, tuple[str, float]] = {
    # `dcgmi dmon -l` tags: ratios (0-1) become percent, bytes per second KB/s.
    "GPUTL": ("sm_util", 1), "MCUTL": ("mem_util", 1), "ENCUT": ("enc_util", 1), "DECUT": ("dec_util", 1),
    "FBUSD": ("fb_used_mib", 1), "FBTTL": ("fb_total_mib", 1), "FBRSV": ("fb_reserved_mib", 1),
    "POWER": ("power_w", 1), "PLIM": ("power_limit_w", 1), "TMPTR": ("gpu_temp_c", 1), "MMTMP": ("mem_temp_c", 1),
    "SMCLK": ("sm_clock_mhz", 1), "MMCLK": ("mem_clock_mhz", 1), "SMACT": ("gpm_sm_active", 100),
    "SMOCC": ("gpm_sm_occupancy", 100), "TENSO": ("gpm_tensor_active", 100), "DRAMA": ("gpm_dram_bw", 100),
    "FP64A": ("gpm_fp64_active", 100), "FP32A": ("gpm_fp32_active", 100), "FP16A": ("gpm_fp16_active", 100),
    "GRACT": ("gpm_gr_active", 100), "PCITX": ("pcie_tx_kbs", 1 / 1024), "PCIRX": ("pcie_rx_kbs", 1 / 1024),
    "NVLTX": ("nvlink_tx_kbs", 1 / 1024), "NVLRX": ("nvlink_rx_kbs", 1 / 1024),
}
DCGM_TAGS = frozenset(t.lower() for t in _DCGM_TAGS)

DMON: dict[str, Alias] = {
    # `nvidia-smi dmon` column names (-s p u c v m e t); rxpci/txpci are MB/s.
    "gpu": Alias(INDEX), "idx": Alias(INDEX), "pwr": Alias("power_w"), "gtemp": Alias("gpu_temp_c"),
    "temp": Alias("gpu_temp_c"), "mtemp": Alias("mem_temp_c"), "sm": Alias("sm_util"), "mem": Alias("mem_util"),
    "enc": Alias("enc_util"), "dec": Alias("dec_util"), "jpg": Alias("jpg_util"), "ofa": Alias("ofa_util"),
    "mclk": Alias("mem_clock_mhz"), "pclk": Alias("sm_clock_mhz"), "fb": Alias("fb_used_mib"),
    "rxpci": Alias("pcie_rx_kbs", 1024), "txpci": Alias("pcie_tx_kbs", 1024),
}
"""dmon's names, which mean something else in a table of one's own (`gpu` is its index)."""

ALIASES: dict[str, Alias] = {
    # identity
    **_names(TIME, "timestamp", "time", "ts", "datetime", "date_time", "_timestamp", "query_time", "time_stamp",
             "unix_time", "epoch", "unix_timestamp", "wall_time", "walltime", "time_s", "timestamp_s", "date"),
    **_names(ELAPSED, "_runtime", "elapsed", "elapsed_s", "elapsed_sec", "elapsed_seconds", "elapsed_time",
             "relative_time", "runtime", "seconds", "t_s", "time_elapsed", "uptime"),
    **_names(INDEX, "index", "gpu_index", "gpu_id", "gpuid", "gpu_idx", "device", "device_id", "device_index",
             "entityid", "entity_id", "entity", "gpu", "cuda_device", "gpu_num", "card"),
    **_names(UUID, "uuid", "gpu_uuid"),
    **_names(MODEL, "name", "gpu_name", "product_name", "model", "gpu_model", "modelname", "model_name"),
    **_names(NODE, "hostname", "host", "host_name", "node", "nodename", "node_name", "nodeid", "node_id", "server",
             "machine", "slurmd_nodename", "slurm_nodename", "computer", "computer_name"),
    **_names(BUS_ID, "pci.bus_id", "gpu_bus_id", "bus_id", "pci_bus_id"),
    # nvidia-smi --query-gpu (nvidia-smi --help-query-gpu), gpustat's JSON keys are the same
    **_names("sm_util", "utilization.gpu", "gpu_util", "gpu_utilization", "gpu_utilisation", "gpu_util_percent",
             "gpu_usage", "gpu_load", "gpu_percent", "utilization_gpu_percent", "gpu_busy", "util", "utilization",
             "gpu_util_pct", "gpu_utilization_percent", "gpu_usage_percent", "nvml_gpu_util"),
    **_names("mem_util", "utilization.memory", "mem_util", "memory_util", "memory_utilization", "mem_utilization",
             "gpu_mem_util", "gpu_memory_util", "gpu_memory_utilization", "gpu_mem_utilization",
             "memory_controller_util", "mem_bw_util"),
    **_names("enc_util", "utilization.encoder", "utilization.enc", "enc_util", "encoder_util"),
    **_names("dec_util", "utilization.decoder", "utilization.dec", "dec_util", "decoder_util"),
    **_names("fb_used_mib", "memory.used", "mem_used", "memory_used", "gpu_mem_used", "gpu_memory_used",
             "used_memory", "vram_used", "fb_used", "gpu_mem", "mem_used_mib", "memory_used_mib",
             "gpu_memory_used_mib", "gpu_mem_used_mib", "gpu_mem_mib"),
    **_names("fb_used_mib", "mem_used_mb", "memory_used_mb", "gpu_mem_used_mb", "gpu_memory_used_mb", "gpu_mem_mb",
             "vram_used_mb"),
    **_names("fb_used_mib", "mem_used_gb", "memory_used_gb", "gpu_mem_used_gb", "gpu_memory_used_gb", "gpu_mem_gb",
             "vram_used_gb", "gpu_memory_gb", factor=1024),
    **_names("fb_used_mib", "mem_used_bytes", "memory_used_bytes", "gpu_memory_used_bytes",
             factor=1 / 2**20),
    **_names("fb_total_mib", "memory.total", "mem_total", "memory_total", "gpu_mem_total", "gpu_memory_total",
             "total_memory", "vram_total", "mem_total_mib", "memory_total_mib", "gpu_memory_total_mib"),
    **_names("fb_total_mib", "mem_total_mb", "memory_total_mb", "gpu_mem_total_mb", "gpu_memory_total_mb"),
    **_names("fb_total_mib", "mem_total_gb", "memory_total_gb", "gpu_mem_total_gb", "gpu_memory_total_gb",
             factor=1024),
    **_names("fb_total_mib", "memory_total_bytes", "gpu_memory_total_bytes", factor=1 / 2**20),
    **_names("fb_reserved_mib", "memory.reserved"),
    **_names("power_w", "power.draw", "power.draw.instant", "power.draw.average", "power", "power_draw",
             "power_usage", "power_w", "power_watts", "gpu_power", "gpu_power_w", "power_draw_w", "gpu_power_draw",
             "power_usage_w", "pwr_w", "watts"),
    **_names("power_w", "power_mw", "power_usage_mw", "gpu_power_mw", factor=1 / 1000),
    **_names("power_limit_w", "power.limit", "enforced.power.limit", "power_limit", "power_limit_w",
             "enforced_power_limit", "power_cap"),
    **_names("gpu_temp_c", "temperature.gpu", "temperature", "temp_c", "gpu_temp", "gpu_temperature",
             "gpu_temp_c", "temperature_c", "temp_gpu"),
    **_names("mem_temp_c", "temperature.memory", "mem_temp", "memory_temp", "memory_temperature"),
    **_names("sm_clock_mhz", "clocks.sm", "clocks.current.sm", "sm_clock", "sm_clock_mhz", "clock_sm",
             "clocks.gr", "clocks.current.graphics", "graphics_clock", "gr_clock", "core_clock"),
    **_names("mem_clock_mhz", "clocks.mem", "clocks.current.memory", "mem_clock", "memory_clock", "mem_clock_mhz",
             "clock_mem"),
    **_names("sm_clock_max_mhz", "clocks.max.sm", "clocks.max.sm_clock"),
    **_names("mem_clock_max_mhz", "clocks.max.mem", "clocks.max.memory", "clocks.max.memory_clock"),
    **_names("pcie_gen", "pcie.link.gen.current", "pcie.link.gen.gpucurrent"),
    **_names("pcie_gen_max", "pcie.link.gen.max", "pcie.link.gen.gpumax"),
    **_names("pcie_width", "pcie.link.width.current"),
    **_names("pcie_width_max", "pcie.link.width.max"),
    **_names("clock_event_reasons", "clocks_throttle_reasons.active", "clocks_event_reasons.active",
             "clocks_throttle_reasons", "clocks_event_reasons", "throttle_reasons"),
    **_names("ecc_sbe_total", "ecc.errors.corrected.volatile.total"),
    **_names("ecc_dbe_total", "ecc.errors.uncorrected.volatile.total"),
    # DCGM: dcgmi tags and the DCGM_FI names dcgm-exporter and the DCGM API use
    **{t.lower(): Alias(f, factor) for t, (f, factor) in _DCGM_TAGS.items()},
    **{key(f.dcgm.name)[0]: Alias(f.name, 1 / f.dcgm.scale) for f in GPU_FIELDS
       if f.dcgm and f.sql not in ("boolean", "text")},
    # DCGM field names the field table does not expose on the agent's /metrics (DCGM's units: ratios, bytes/s)
    **_names("gpm_fp16_active", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", factor=100),
    **_names("gpm_fp32_active", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", factor=100),
    **_names("gpm_fp64_active", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", factor=100),
    **_names("nvlink_tx_kbs", "DCGM_FI_PROF_NVLINK_TX_BYTES", factor=1 / 1024),
    **_names("nvlink_rx_kbs", "DCGM_FI_PROF_NVLINK_RX_BYTES", factor=1 / 1024),
    **_names("pcie_tx_kbs", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT"), **_names("pcie_rx_kbs", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"),
    **_names("fb_total_mib", "DCGM_FI_DEV_FB_TOTAL"), **_names("power_limit_w", "DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    **_names("power_w", "DCGM_FI_DEV_POWER_USAGE_INSTANT"),
    **_names("clock_event_reasons", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
    **_names("ecc_sbe_total", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), **_names("ecc_dbe_total", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    **_names("sm_clock_max_mhz", "DCGM_FI_DEV_MAX_SM_CLOCK"), **_names("mem_clock_max_mhz", "DCGM_FI_DEV_MAX_MEM_CLOCK"),
    **_names("pcie_gen", "DCGM_FI_DEV_PCIE_LINK_GEN"), **_names("pcie_width", "DCGM_FI_DEV_PCIE_LINK_WIDTH"),
    # W&B system metrics (system.gpu.N.<name>, after `split_gpu`): percent unless named otherwise
    **_names("sm_util", "system_gpu_gpu"), **_names("mem_util", "system_gpu_memory"),
    **_names("fb_used_mib", "system_gpu_memoryallocatedbytes", factor=1 / 2**20),
    **_names("fb_total_mib", "system_gpu_memorytotalbytes", factor=1 / 2**20),
    **_names("gpu_temp_c", "system_gpu_temp"), **_names("power_w", "system_gpu_powerwatts"),
    **_names("power_limit_w", "system_gpu_enforcedpowerlimitwatts"),
    **_names("sm_clock_mhz", "system_gpu_smclock"), **_names("mem_clock_mhz", "system_gpu_memoryclock"),
    # nvitop's ResourceMetricCollector (cuda:N (gpu:M)/<name> (<unit>)/mean, after `split_gpu`)
    **_names("sm_util", "nvitop_gpu_utilization"), **_names("mem_util", "nvitop_memory_utilization"),
    **_names("fb_used_mib", "nvitop_memory_used"), **_names("fb_total_mib", "nvitop_memory_total"),
    **_names("power_w", "nvitop_power_usage"), **_names("gpu_temp_c", "nvitop_temperature"),
    # nvidia-smi -q (text) and -q -x (XML): section/key paths
    **_names("sm_util", "utilization/gpu", "utilization/gpu_util"),
    **_names("mem_util", "utilization/memory", "utilization/memory_util"),
    **_names("enc_util", "utilization/encoder", "utilization/encoder_util"),
    **_names("dec_util", "utilization/decoder", "utilization/decoder_util"),
    **_names("fb_used_mib", "fb memory usage/used", "fb_memory_usage/used"),
    **_names("fb_total_mib", "fb memory usage/total", "fb_memory_usage/total"),
    **_names("fb_reserved_mib", "fb memory usage/reserved", "fb_memory_usage/reserved"),
    **_names("power_w", "power readings/power draw", "gpu power readings/power draw",
             "gpu power readings/average power draw", "power_readings/power_draw", "gpu_power_readings/power_draw",
             "gpu_power_readings/average_power_draw"),
    **_names("power_limit_w", "power readings/power limit", "power readings/enforced power limit",
             "gpu power readings/current power limit", "power_readings/power_limit",
             "power_readings/enforced_power_limit", "gpu_power_readings/current_power_limit"),
    **_names("gpu_temp_c", "temperature/gpu current temp", "temperature/gpu_temp"),
    **_names("mem_temp_c", "temperature/memory current temp", "temperature/memory_temp"),
    **_names("sm_clock_mhz", "clocks/sm", "clocks/sm_clock"),
    **_names("mem_clock_mhz", "clocks/memory", "clocks/mem_clock"),
    **_names("sm_clock_max_mhz", "max clocks/sm", "max_clocks/sm_clock"),
    **_names("mem_clock_max_mhz", "max clocks/memory", "max_clocks/mem_clock"),
    **_names(UUID, "gpu uuid"), **_names(MODEL, "product name"),
}
"""Every other tool's name for our fields, by key (see `key`); the first spelling of a field in
each family is its tool's own, the rest are what people's loggers write."""

for _a in (*ALIASES.values(), *DMON.values()):  # an alias names a real field, so a typo is an import error
    assert _a.field in IDENTITY or _a.field in GPU_BY_NAME, _a.field


UNIT_WORDS = {"pct": "%", "percent": "%", "perc": "%", "ratio": "ratio", "fraction": "fraction",
              "mib": "mib", "gib": "gib", "mb": "mb", "gb": "gb", "kib": "kib", "kb": "kb", "bytes": "bytes",
              "w": "w", "watt": "w", "watts": "w", "mw": "mw", "kw": "kw", "mhz": "mhz", "ghz": "ghz",
              "c": "c", "celsius": "c", "degc": "c", "kbs": "kbs", "bps": "b/s", "mj": "mj", "j": "j",
              "milliwatts": "mw", "kilowatts": "kw", "megahertz": "mhz", "gigahertz": "ghz", "kilobytes": "kb",
              "megabytes": "mb", "gigabytes": "gb", "mebibytes": "mib", "gibibytes": "gib"}
"""A unit written as a word of the name ('sm_util_pct', 'memory_used_gib', 'power_draw_watts')."""
_TIME_UNITS = {"s": "", "sec": "", "secs": "", "seconds": "", "ms": ""}
"""The unit word of a time column ('relative_time_s'): its form is read from its values."""


def _by_name(k: str) -> Alias | None:
    """A key's alias, or the field the key names itself ('sm_util', 'gpm_tensor_active')."""
    alias = ALIASES.get(k)
    if alias is None and k in GPU_BY_NAME:
        alias = Alias(k)
    return alias


def words(name: str) -> list[str]:
    """A column name's words: camelCase and every run of other characters split ('gpuMemoryUsedGiB',
    'GPU Memory Used (GiB)' -> gpu, memory, used, gib); by character class, not a pattern."""
    out, word, prev = [], "", ""
    for c in name[:200]:
        if not c.isalnum():
            c = ""
        elif c.isupper() and (prev.islower() or prev.isdigit()):
            out.append(word)
            word = ""
        if c:
            word += c.lower()
        elif word:
            out.append(word)
            word = ""
        prev = c
    found = [w for w in (*out, word) if w]
    if len(found) > 2 and found[-2] + found[-1] in UNIT_WORDS:  # 'GiB', 'mW' split as camelCase
        found[-2:] = [found[-2] + found[-1]]
    return found


_GPU = frozenset({"gpu", "gpus", "sm", "fb", "vram", "nvml", "dcgm", "cuda", "tensor", "nvlink", "pcie", "dram"})
_NOT_GPU = frozenset({"cpu", "cpus", "ram", "host", "swap", "disk", "net", "network", "io", "proc", "process", "pid",
                      "fan", "free", "count", "num", "number", "job", "state", "pstate", "violation", "rank"})
_AGGREGATE = frozenset({"avg", "mean", "average", "min", "median", "last", "cur", "current", "instant", "value",
                        "dev", "fi", "prof", "pipe", "nvidia", "the", "of", "rate", "rates", "percentage"})
_UTIL = frozenset({"util", "utils", "utilization", "utilisation", "usage", "load", "busy", "use", "usg", "duty"})
_MEM = frozenset({"mem", "memory", "vram", "fb", "framebuffer"})
_USED = frozenset({"used", "use", "usage", "alloc", "allocated", "occupied"})
_CLOCK = frozenset({"clock", "clocks", "clk", "freq", "frequency"})
_ACTIVE = frozenset({"active", "activity", "act"})
_TX = frozenset({"tx", "transmit", "transmitted", "sent", "send", "out"})
_RX = frozenset({"rx", "receive", "received", "recv", "in"})


def _field_by_words(w: frozenset[str], unit: str) -> str | None:
    """The field a set of words names, by what they mean; None where they name none of ours."""
    maximum = "max" in w
    if "tensor" in w:
        return "gpm_tensor_active"
    for fp in ("fp16", "fp32", "fp64"):
        if fp in w:
            return f"gpm_{fp}_active"
    if "dram" in w:
        return "gpm_dram_bw"
    for bus, name in (({"nvlink", "nvl"}, "nvlink"), ({"pcie", "pci"}, "pcie")):
        if w & bus:
            if w & _TX or w & _RX:
                return f"{name}_{'tx' if w & _TX else 'rx'}_kbs"
            if name == "pcie" and "replay" in w:
                return "pcie_replay"
            if name == "pcie" and "gen" in w:
                return "pcie_gen_max" if maximum else "pcie_gen"
            if name == "pcie" and w & {"width", "lanes"}:
                return "pcie_width_max" if maximum else "pcie_width"
            return None
    if w & _MEM:
        if w & {"temp", "temperature"}:
            return "mem_temp_c"
        if w & _CLOCK:
            return "mem_clock_max_mhz" if maximum else "mem_clock_mhz"
        if "reserved" in w:
            return "fb_reserved_mib"
        if w & {"total", "size", "capacity"}:
            return "fb_total_mib"
        if w & {"bw", "bandwidth"} and w & _ACTIVE:  # DCGM's 'Memory BW Activity': DRAM_ACTIVE
            return "gpm_dram_bw"
        if w & ({"util", "utilization", "utilisation", "bw", "bandwidth", "copy", "controller", "busy"} | _ACTIVE):
            return "mem_util"
        if w & _USED or not w - _MEM - _GPU:  # 'gpu_memory': used, where the unit says memory
            return "fb_used_mib" if unit_factor("fb_used_mib", unit) or w & _USED and not unit else None
        return None
    if "sm" in w or "sms" in w:
        if w & _ACTIVE:
            return "gpm_sm_active"
        if w & {"occupancy", "occ"}:
            return "gpm_sm_occupancy"
        if w & _CLOCK:
            return "sm_clock_max_mhz" if maximum else "sm_clock_mhz"
        return "sm_util" if w & _UTIL else None
    if w & {"graphics", "gr"} and w & ({"engine"} | _ACTIVE) and not w & _CLOCK:
        return "gpm_gr_active"
    if w & _CLOCK:
        return "sm_clock_max_mhz" if maximum else "sm_clock_mhz"
    if "energy" in w:
        return "energy_mj"
    if w & {"power", "pwr"}:
        if w & _UTIL - {"usage", "use"}:
            return None  # 'power_utilization': a share of the limit, not watts
        return "power_limit_w" if w & {"limit", "cap", "enforced"} else "power_w"
    if w & {"temp", "temperature"}:
        return "gpu_temp_c"
    if w & {"encoder", "enc"}:
        return "enc_util"
    if w & {"decoder", "dec"}:
        return "dec_util"
    if w & {"throttle", "event"} and w & {"reason", "reasons"}:
        return "clock_event_reasons"
    return "sm_util" if w & _UTIL else None


_DCGM_RATIO = frozenset({"gpm_sm_active", "gpm_sm_occupancy", "gpm_tensor_active", "gpm_dram_bw", "gpm_fp16_active",
                         "gpm_fp32_active", "gpm_fp64_active", "gpm_gr_active"})
"""Fields DCGM gives as a ratio (0-1): a column of theirs named by its words ('sm_active') is one."""


def _by_words(name: str, k: str, unit: str) -> tuple[Alias, str] | None:
    """A column matched by what its words mean ('GPU Memory Used (GiB)', 'gpuUtilPercent', 'sm_active',
    'nvlink_tx_bytes'): its field and the unit its words name. Words of the host (cpu, ram, swap ...)
    name none of ours; a generic word (utilization, power, memory) needs a GPU word or its unit."""
    found = words(unit_of(name)[0]) if any(c.isupper() for c in name) else [w for w in k.split("_") if w]
    content: set[str] = set()
    for word in found:
        if word in UNIT_WORDS and not unit and content:
            unit = UNIT_WORDS[word]
        elif word not in _AGGREGATE:
            content.add(word)
    w = frozenset(content)
    if not w or w & _NOT_GPU:
        return None
    field = _field_by_words(w, unit)
    if field is None or unit and unit_factor(field, unit) is None:
        return None
    if not w & _GPU and (field == "sm_util" or field == "mem_util" and not w & {"util", "utilization", "bw",
                                                                                  "bandwidth", "controller", "copy"}):
        return None  # 'usage_percent', 'memory_percent': a host's as likely as a GPU's
    return Alias(field, 100.0 if field in _DCGM_RATIO and not unit else 1.0), unit


def lookup(name: str) -> tuple[Alias, int | None] | None:
    """A column's alias and, for a column of one GPU among several, that GPU; None: not ours.
    By name first (the table above, a field's own name, either with a unit as its last word), then
    by what its words mean; a unit the header gives ('memory.used [GiB]', 'Power (mW)') sets the factor."""
    k, unit = key(name)
    gpu = None
    alias = _by_name(k)
    if alias is None and (wide := split_gpu(k)) and wide[0] < 4096:
        gpu, k = wide
        alias = _by_name(k)
    if alias is None and (tail := k.rpartition("_")[2]) in UNIT_WORDS | _TIME_UNITS:
        named = _by_name(k[:-len(tail) - 1])
        if named and (unit_factor(named.field, UNIT_WORDS.get(tail, "")) or named.field in (TIME, ELAPSED)):
            alias, unit = named, unit or UNIT_WORDS.get(tail, "")
    if alias is None and (meant := _by_words(name if gpu is None else k, k, unit)):
        alias, unit = meant
    if alias is None:
        return None
    factor = unit_factor(alias.field, unit)
    return (Alias(alias.field, factor) if factor is not None else alias), gpu
