"""Real `nvidia-smi -q -x` captures as the fake NVML's truth: what NVML returned for each value nvidia-smi
printed (in NVML's units, for the fake's scenario) and what the agent must then sample (in the wire
format's units). A value nvidia-smi printed as N/A is left unset, so the fake answers NOT_SUPPORTED, as
NVML did, and the agent must send NULL.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:%|W|C|MHz|MiB|KB/s|x)?\s*$")


@dataclass
class Card:
    """One GPU of a capture: how to play it on the fake, and what the agent must sample from it."""

    uuid: str
    bus_id: str
    name: str
    keys: dict[str, float] = field(default_factory=dict)  # fake scenario keys, NVML units
    unsupported: list[str] = field(default_factory=list)  # NVML calls the card's driver did not answer
    expected: dict[str, float | bool | None] = field(default_factory=dict)  # wire fields, our units


def _number(node: ET.Element | None) -> float | None:
    """The number nvidia-smi printed (its unit stripped), None for N/A or a missing element."""
    m = _NUMBER.match(node.text or "") if node is not None else None
    return float(m.group(1)) if m else None


def _first(gpu: ET.Element, *paths: str) -> ET.Element | None:
    """The first of ``paths`` the capture has with a value (schemas moved elements between versions)."""
    found = [n for n in (gpu.find(p) for p in paths) if n is not None]
    return next((n for n in found if _number(n) is not None), found[0] if found else None)


def _ecc(gpu: ET.Element, corrected: bool) -> float | None:
    """Volatile ECC errors, all memories: schema v10 `single_bit/total`, v11+ `sram_*` + `dram_*`."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    old = _number(volatile.find("single_bit/total" if corrected else "double_bit/total"))
    if volatile.find("single_bit") is not None:
        return old
    parts = [_number(n) for n in volatile if ("uncorrectable" in n.tag) != corrected and "correctable" in n.tag]
    return None if not parts or any(p is None for p in parts) else sum(p for p in parts if p is not None)


def _yes(node: ET.Element | None) -> bool | None:
    text = (node.text or "").strip() if node is not None else ""
    return {"Yes": True, "No": False}.get(text)


# wire field: (fake key, NVML units per ours, where nvidia-smi prints it)
_PLAIN: dict[str, tuple[str, float, tuple[str, ...]]] = {
    "sm_util": ("sm", 1, ("utilization/gpu_util",)),
    "mem_util": ("mem", 1, ("utilization/memory_util",)),
    "enc_util": ("enc", 1, ("utilization/encoder_util",)),
    "dec_util": ("dec", 1, ("utilization/decoder_util",)),
    "jpg_util": ("jpg", 1, ("utilization/jpeg_util",)),
    "ofa_util": ("ofa", 1, ("utilization/ofa_util",)),
    # nvmlDeviceGetPowerUsage / NVML_FI_DEV_POWER_AVERAGE, mW: the 1 s average where printed
    "power_w": ("power_mw", 1000, ("gpu_power_readings/average_power_draw", "power_readings/average_power_draw",
                                   "gpu_power_readings/power_draw", "power_readings/power_draw")),
    "power_limit_w": ("power_limit_mw", 1000, ("power_readings/enforced_power_limit",
                                               "gpu_power_readings/enforced_power_limit",
                                               "gpu_power_readings/current_power_limit")),
    "gpu_temp_c": ("temp", 1, ("temperature/gpu_temp",)),
    "mem_temp_c": ("memtemp", 1, ("temperature/memory_temp",)),
    "sm_clock_mhz": ("smclk", 1, ("clocks/sm_clock",)),
    "mem_clock_mhz": ("memclk", 1, ("clocks/mem_clock",)),
    "sm_clock_max_mhz": ("smclk_max", 1, ("max_clocks/sm_clock",)),
    "mem_clock_max_mhz": ("memclk_max", 1, ("max_clocks/mem_clock",)),
    "fb_total_mib": ("fb_total_mib", 1, ("fb_memory_usage/total",)),
    "fb_used_mib": ("fb_used_mib", 1, ("fb_memory_usage/used",)),
    "fb_reserved_mib": ("fb_reserved_mib", 1, ("fb_memory_usage/reserved",)),
    "pcie_rx_kbs": ("pcie_rx_kbs", 1, ("pci/rx_util",)),
    "pcie_tx_kbs": ("pcie_tx_kbs", 1, ("pci/tx_util",)),
    "pcie_gen": ("pcie_gen", 1, ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",)),
    "pcie_gen_max": ("pcie_gen_max", 1, ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",)),
    "pcie_width": ("pcie_width", 1, ("pci/pci_gpu_link_info/link_widths/current_link_width",)),
    "pcie_width_max": ("pcie_width_max", 1, ("pci/pci_gpu_link_info/link_widths/max_link_width",)),
    "pcie_replay": ("replay", 1, ("pci/replay_counter",)),
}


def parse(path: Path) -> list[Card]:
    """The GPUs of one capture."""
    root = ET.parse(path).getroot()
    cards = []
    for gpu in root.findall("gpu"):
        card = Card((gpu.findtext("uuid") or "").strip(), (gpu.findtext("pci/pci_bus_id") or gpu.get("id") or "").strip(),
                    (gpu.findtext("product_name") or "").strip())
        for name, (key, per_unit, paths) in _PLAIN.items():
            value = _number(_first(gpu, *paths))
            card.expected[name] = value
            if value is not None:
                card.keys[key] = value * per_unit
        if gpu.find("fb_memory_usage/reserved") is None:  # a driver before 510: no reserved memory (version 1)
            card.unsupported.append("nvmlDeviceGetMemoryInfo_v2")
        for name, key, corrected in (("ecc_sbe_total", "ecc_sbe", True), ("ecc_dbe_total", "ecc_dbe", False)):
            card.expected[name] = value = _ecc(gpu, corrected)
            if value is not None:
                card.keys[key] = value
        rows = gpu.find("remapped_rows")
        remap = {"remapped_correctable": ("remap_corr", _number(gpu.find("remapped_rows/remapped_row_corr"))),
                 "remapped_uncorrectable": ("remap_unc", _number(gpu.find("remapped_rows/remapped_row_unc"))),
                 "remap_pending": ("remap_pending", _yes(gpu.find("remapped_rows/remapped_row_pending"))),
                 "remap_failure": ("remap_fail", _yes(gpu.find("remapped_rows/remapped_row_failure")))}
        known = rows is not None and all(v is not None for _, v in remap.values())
        for name, (key, value) in remap.items():  # one NVML call gives all four, or none
            card.expected[name] = value if known else None
            if known:
                card.keys[key] = float(value)  # type: ignore[arg-type]
        cards.append(card)
    return cards
