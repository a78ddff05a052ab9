"""The MIG profile the memory advice names: the smallest of the GPU model's that holds the job's peak
memory and the compute it used, and only when smaller than what the job was given."""

from __future__ import annotations

from jobpulse.collector.rules import mig


def test_memory_advice_names_the_smallest_profile_holding_memory_and_compute() -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    assert mig.fitting(h100, None, 900, 20.0).name == "2g.20gb"  # 20 % of the GPU needs 2 of its 7 slices
    assert mig.fitting(h100, None, 900, 10.0).name == "1g.10gb"
    assert mig.fitting(h100, None, 15_000, 10.0).name == "1g.20gb"  # the memory decides
    assert mig.fitting(h100, None, 900, 85.0) is None  # needs the whole GPU
    assert mig.fitting(h100, "1g.20gb", 5_000, 100.0).name == "1g.10gb"  # a slice: a smaller one
    assert mig.fitting(h100, "1g.10gb", 5_000, 100.0) is None  # already the smallest that fits
    assert mig.fitting("NVIDIA A100-SXM4-40GB", None, 3_000, None).name == "1g.5gb"
    assert mig.fitting("NVIDIA A30", None, 3_000, 30.0).name == "2g.12gb"  # 4 slices: 30 % needs 2
    assert mig.fitting("Tesla V100-SXM2-32GB", None, 900, 10.0) is None  # no MIG
