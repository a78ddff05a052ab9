"""What a GPU GRES index of this node names, read from gres.conf as slurmd reads it (Slurm 22.05).

Slurm names a job's GPUs in the prolog by GRES index (``SLURM_JOB_GPUS``; ``CUDA_VISIBLE_DEVICES``
too, unless AutoDetect gave the device a unique id). With ``AutoDetect`` off, slurmd numbers the
node's ``Name=gpu`` lines of gres.conf in file order: each file of a ``File=`` line is one index,
a ``MultipleFiles=`` line (a MIG slice) is one index for all its files. gres.conf of 22.05 has no
``UniqueId``, so a slice's index names no NVML device; its files do: the parent's ``/dev/nvidiaN``
(minor N) and the ``/dev/nvidia-caps/nvidia-capM`` capabilities of its GPU instance and compute
instance, whose minors the driver lists in ``/proc/driver/nvidia-caps/mig-minors``
(``gpu0/gi1/access 12``, ``gpu0/gi1/ci0/access 13``). So an index maps to a device the agent
resolves: a GPU's minor (``"1"``), or a slice's ``gpu0/gi1/ci0`` (``gpu0/gi1`` when the line lists
only the GPU instance's capability: all its compute instances).

With AutoDetect on, slurmd orders the GPUs itself and names a slice by its MIG UUID, so gres.conf
says nothing here (None).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import hostlist

MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
_CAP = re.compile(r"gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access")


class GresConfError(ValueError):
    """gres.conf or the MIG minors table cannot say what a GRES index is (names the line or file)."""


@dataclass(frozen=True)
class GresGpu:
    """One GPU GRES of this node: its Slurm index, type and device files."""
    index: int
    type: str | None
    files: tuple[str, ...]


def _records(text: str) -> list[dict[str, str]]:
    """gres.conf lines as {lower-case key: value}; `#` starts a comment, `\\` continues a line."""
    out = []
    for line in text.replace("\\\n", "").splitlines():
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        record = {}
        for f in fields:
            key, sep, value = f.partition("=")
            if not sep:
                raise GresConfError(f"gres.conf: {f!r} is not key=value in line {line.strip()!r}")
            record[key.lower()] = value.strip('"')
        out.append(record)
    return out


def _on_node(record: dict[str, str], node: str) -> bool:
    return "nodename" not in record or node in hostlist.expand_hostlist(record["nodename"])


def node_gpus(text: str, node: str, name: str = "gpu") -> list[GresGpu] | None:
    """The node's GRES ``name`` (``gpu``; ``mps``, whose indices an MPS job's prolog gets) in Slurm's
    index order, or None when AutoDetect orders them (or gres.conf declares no file for the node)."""
    gpus: list[GresGpu] = []
    for r in _records(text):
        if not _on_node(r, node):
            continue
        if r.get("autodetect", "off").lower() != "off":
            return None
        if r.get("name") != name:
            continue
        many = r.get("multiplefiles")
        spec = many or r.get("file") or r.get("files")
        if not spec:
            continue
        files = hostlist.expand_hostlist(spec)
        if many:
            gpus.append(GresGpu(len(gpus), r.get("type"), tuple(files)))
        else:
            gpus.extend(GresGpu(len(gpus), r.get("type"), (f,)) for f in files)
    return gpus or None


def mig_minors(text: str) -> dict[int, str]:
    """The driver's MIG capability table: minor -> ``gpuG/giI[/ciC]`` (``config``/``monitor`` left out)."""
    out = {}
    for line in text.splitlines():
        name, _, minor = line.strip().partition(" ")
        m = _CAP.fullmatch(name)
        if m and minor.strip().isdigit():
            out[int(minor)] = name.removesuffix("/access")
    return out


def _minor(path: str) -> int:
    try:
        return os.minor(os.stat(path).st_rdev)
    except OSError as exc:
        raise GresConfError(f"gres.conf names {path}, which cannot be read: {exc.strerror}") from None


def device(gpu: GresGpu, minors: dict[int, str] | None) -> str:
    """What the agent resolves for one GRES: a GPU's minor, or a MIG slice's ``gpuG/giI[/ciC]``."""
    caps = [f for f in gpu.files if "nvidia-cap" in os.path.basename(f)]
    if not caps:
        return str(_minor(gpu.files[0]))
    if minors is None:
        raise GresConfError(f"GPU {gpu.index} ({gpu.type}) is a MIG slice but the MIG minors table is unreadable")
    names = []
    for cap in caps:
        name = minors.get(_minor(cap))
        if name is None:
            raise GresConfError(f"{cap} (GPU {gpu.index}, {gpu.type}) is no MIG instance in the minors table")
        names.append(name)
    return max(names, key=len)  # the compute instance when the line lists it, else the GPU instance


def job_devices(indices: list[str], gres_conf: Path, node: str, minors_file: Path = MIG_MINORS,
                name: str = "gpu") -> list[str] | None:
    """The devices of the job's GRES ``name`` indices on ``node``, or None when gres.conf cannot tell
    (absent, AutoDetect): then Slurm's names in the environment stand."""
    try:
        text = gres_conf.read_text()
    except FileNotFoundError:
        return None
    gpus = node_gpus(text, node, name)
    if gpus is None:
        return None
    try:
        minors: dict[int, str] | None = mig_minors(minors_file.read_text())
    except OSError:
        minors = None
    out = []
    for i in indices:
        if not i.isdigit() or int(i) >= len(gpus):
            raise GresConfError(f"GRES index {i!r} is not one of the {len(gpus)} {name} {gres_conf} gives {node}")
        out.append(device(gpus[int(i)], minors))
    return out
