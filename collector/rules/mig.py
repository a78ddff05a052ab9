"""MIG profiles, to advise a job the slice that fits what it used.

A profile ``<N>g.<M>gb`` gives N of the GPU's compute slices and M GB of its memory (the lists per
GPU model: `jobpulse.schema.mig_profiles`); a model not listed gets no profile advice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jobpulse.schema.mig_profiles import MODELS

_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb$")
_MIB_PER_GB = 1e9 / 2**20

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
    for needed, whole, names in MODELS:
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
