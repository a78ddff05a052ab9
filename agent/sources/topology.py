"""The node's GPU topology as `nvidia-smi topo -m` shows it, taken once at agent start."""

from __future__ import annotations

import os
from datetime import datetime
from typing import cast

import msgspec

from jobpulse.agent.nvml import P2P_STATUS, TOPO_LEVELS, Nvml
from jobpulse.schema import wire


def _cpulist(cpus: list[int]) -> str:
    """[0,1,2,3,8] -> '0-3,8' (the kernel's cpulist format)."""
    ranges: list[str] = []
    start = prev = None
    for c in sorted(cpus) + [None]:
        if start is not None and (c is None or c != cast(int, prev) + 1):  # prev is set with start
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if c is not None and start is None:
            start = c
        prev = c
    return ",".join(ranges)


def snapshot(nvml: Nvml, ts: datetime) -> list[wire.TopologyGpu]:
    """Every GPU, then every MIG instance: its parent's place (bus, NUMA, CPUs), its own identity."""
    gpus = _gpus(nvml, ts)
    by_uuid = {t.gpu_uuid: t for t in gpus}
    return gpus + [msgspec.structs.replace(by_uuid[g.parent.uuid], gpu_uuid=g.uuid, nvlinks_up=None, mig_mode=None,
                                           links={}, p2p={}, parent_uuid=g.parent.uuid, mig_profile=g.profile,
                                           gpu_instance_id=g.gi, compute_instance_id=g.ci)
                   for g in nvml.gpus if g.parent is not None and g.parent.uuid in by_uuid]


def _gpus(nvml: Nvml, ts: datetime) -> list[wire.TopologyGpu]:
    driver, cuda = nvml.driver_version(), nvml.cuda_version()
    physical = nvml.physical
    peers = {g.uuid: nvml.nvlink_peers(g) for g in physical}
    by_bus = {g.pci_bus_id.lower(): g.uuid for g in physical if g.pci_bus_id}
    out = []
    for g in physical:
        links: dict[str, str] = {}
        p2p: dict[str, str] = {}
        nv = [by_bus.get(bus.lower()) for bus in peers[g.uuid] or []]
        for other in physical:
            if other is g:
                continue
            count = nv.count(other.uuid)
            level = nvml.common_ancestor(g, other)
            links[other.uuid] = f"NV{count}" if count else TOPO_LEVELS.get(level, "?") if level is not None else "?"
            status = nvml.p2p_read(g, other)
            if status is not None:
                p2p[other.uuid] = P2P_STATUS.get(status, str(status))
        affinity = nvml.cpu_affinity(g, os.cpu_count() or 64)
        gen_max, width_max = nvml.pcie_link_max(g)
        up = peers[g.uuid]
        out.append(wire.TopologyGpu(
            ts=ts, gpu_uuid=g.uuid, gpu_index=g.index, pci_bus_id=g.pci_bus_id, model=g.name,
            driver_version=driver, cuda_version=cuda, numa_node=nvml.numa_node(g),
            cpu_affinity=_cpulist(affinity) if affinity else None, pcie_gen_max=gen_max, pcie_width_max=width_max,
            nvlinks_up=None if up is None else len(up), mig_mode=nvml.mig_mode(g),
            links=links, p2p=p2p))
    return out


def matrix(topo: list[wire.TopologyGpu]) -> str:
    """The GPU-GPU matrix with CPU and NUMA affinity, laid out like `nvidia-smi topo -m` (GPUs only:
    a MIG instance sits where its GPU does)."""
    topo = [t for t in topo if t.parent_uuid is None]
    names = [f"GPU{t.gpu_index}" for t in topo]
    lines = ["\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity"]
    for t in topo:
        cells = ["X" if o.gpu_uuid == t.gpu_uuid else t.links.get(o.gpu_uuid, "?") for o in topo]
        lines.append(f"GPU{t.gpu_index}\t" + "\t".join(cells) + f"\t{t.cpu_affinity or 'N/A'}\t"
                     f"{t.numa_node if t.numa_node is not None else 'N/A'}")
    return "\n".join(lines)
