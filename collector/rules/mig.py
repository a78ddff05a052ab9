"""MIG profiles, to advise a job the slice that fits what it used.

A profile ``<N>g.<M>gb`` gives N of the GPU's compute slices and M GB of its memory. The lists are
those of NVIDIA's MIG user guide per GPU model; a model not listed gets no profile advice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")
_MIB_PER_GB = 1e9 / 2**20

# (words all in the model name, compute slices of the whole GPU, profiles), first match wins.
_MODELS: tuple[tuple[tuple[str, ...], int, tuple[str, ...]], ...] = (
    (("H200",), 7, ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")),
    (("H100", "NVL"), 7, ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")),
    (("H100",), 7, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    (("A100", "80GB"), 7, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    (("A100",), 7, ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")),
    (("A30",), 4, ("1g.6gb", "2g.12gb", "4g.24gb")),
)


@dataclass(frozen=True)
class Profile:
    name: str
    slices: int  # compute slices
    of: int  # compute slices of the whole GPU
    memory_mib: float  # nominal: the name's GB (decimal, so a little under what the slice has)

    @property
    def compute_share(self) -> float:
        return self.slices / self.of


def profiles(model: str | None) -> tuple[Profile, ...]:
    """The MIG profiles of a GPU model, smallest first; empty for a model without MIG (or unknown)."""
    words = (model or "").upper()
    for needed, whole, names in _MODELS:
        if all(w in words for w in needed):
            return tuple(sorted((_parse(n, whole) for n in names), key=lambda p: (p.slices, p.memory_mib)))
    return ()


def _parse(name: str, whole: int) -> Profile:
    m = _PROFILE.match(name)
    if m is None:
        raise ValueError(f"not a MIG profile name: {name!r}")
    return Profile(name, int(m.group(1)), whole, int(m.group(2)) * _MIB_PER_GB)


def fitting(model: str | None, given: str | None, peak_mib: int, activity: float | None) -> Profile | None:
    """The smallest profile of ``model`` that holds the peak memory and the compute the job used
    (its mean activity, percent of what it was given: the whole GPU, or the slice ``given``), if it
    is smaller than what the job was given; None otherwise."""
    options = profiles(model)
    if not options:
        return None
    current = next((p for p in options if p.name == given), None) if given else None
    share = current.compute_share if current else 1.0
    need = share * (activity or 0.0) / 100.0
    for p in options:
        if p.memory_mib >= peak_mib and p.compute_share >= need:
            smaller = p.compute_share < share or (current is not None and p.memory_mib < current.memory_mib)
            return p if smaller else None
    return None


def slice_shares_sql(cluster: str) -> str:
    """SQL rows (node, gpu_uuid, share) of a cluster's MIG slices (``cluster``: an SQL expression):
    the share of its GPU a slice holds, for GPU-hours. Its compute slices (the profile's leading
    number: ``2g.20gb`` 2, a compute instance's ``1c.3g.40gb`` 1) over the whole GPU's (`_MODELS`: 7,
    4 on an A30), read from the slice's model name (NVML names a slice ``<GPU model> MIG <profile>``).
    Compute, not memory: a GPU-hour is compute held, and the memory share differs little (1/8 vs 1/7
    on an A100 80GB). A slice of a model not listed has no row, and counts as a whole GPU."""
    whole = " ".join("WHEN " + " AND ".join(f"position('{w}' in upper(model)) > 0" for w in words) + f" THEN {n}"
                     for words, n, _ in _MODELS)
    return (f"SELECT node, gpu_uuid, slices / whole AS share FROM (SELECT node, gpu_uuid,"
            f" substring(mig_profile from '^(\\d+)[cg]\\.')::float8 AS slices, CASE {whole} END AS whole"
            f" FROM jobpulse.topology_current WHERE cluster = {cluster} AND starts_with(gpu_uuid, 'MIG-')"
            " AND parent_uuid IS NOT NULL) s"
            " WHERE slices IS NOT NULL AND whole IS NOT NULL")
