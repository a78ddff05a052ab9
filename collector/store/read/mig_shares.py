"""The share of its GPU each MIG slice holds, as SQL rows: GPU-hours of sliced GPUs count compute held."""

from __future__ import annotations

from jobpulse.schema.mig_profiles import MODELS


def slice_shares_sql(cluster: str) -> str:
    """SQL rows (node, gpu_uuid, share) of a cluster's MIG slices (``cluster``: an SQL expression):
    the share of its GPU a slice holds, for GPU-hours. Its compute slices (the profile's leading
    number: ``2g.20gb`` 2, a compute instance's ``1c.3g.40gb`` 1) over the whole GPU's (`MODELS`: 7,
    4 on an A30), read from the slice's model name (NVML names a slice ``<GPU model> MIG <profile>``).
    Compute, not memory: a GPU-hour is compute held, and the memory share differs little (1/8 vs 1/7
    on an A100 80GB). A slice of a model not listed has no row, and counts as a whole GPU."""
    whole = " ".join("WHEN " + " AND ".join(f"position('{w}' in upper(model)) > 0" for w in words) + f" THEN {n}"
                     for words, n, _ in MODELS)
    return (f"SELECT node, gpu_uuid, slices / whole AS share FROM (SELECT node, gpu_uuid,"
            f" substring(mig_profile from '^(\\d+)[cg]\\.')::float8 AS slices, CASE {whole} END AS whole"
            f" FROM jobpulse.topology_current WHERE cluster = {cluster} AND starts_with(gpu_uuid, 'MIG-')"
            " AND parent_uuid IS NOT NULL) s"
            " WHERE slices IS NOT NULL AND whole IS NOT NULL")
