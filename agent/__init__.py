"""Node agent: sample (NVML, /proc) -> attribute (job, step, rank, PID) -> batch -> ship (spool)."""
