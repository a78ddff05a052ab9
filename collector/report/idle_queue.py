"""The digest's lines on GPUs held idle in a partition while jobs waited there for GPUs: the
moment with the most idle GPUs, and the GPU-hours idle while others waited (`queue_reads`)."""

from __future__ import annotations

from typing import Any

from jobpulse.collector.report.summary import one_line


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def lines(rows: list[dict[str, Any]]) -> list[str]:
    """``n GPUs idle in partition P while m jobs waited for k GPUs``, one line a partition."""
    if not rows:
        return ["GPUs idle while jobs waited for GPUs: none"]
    out = ["GPUs idle while jobs waited for GPUs (per partition, the 5-minute bucket with the most):"]
    for r in rows:
        out.append(f"  {r['cluster']}/{one_line(r['partition'])}: {_n(r['idle_gpus'], 'GPU')} idle in partition "
                   f"{one_line(r['partition'])} while {_n(r['jobs_waiting'], 'job')} waited for "
                   f"{_n(r['gpus_asked'], 'GPU')} ({r['peak_at']:%Y-%m-%d %H:%M} UTC); "
                   f"{r['idle_gpu_hours']:.2f} GPU-hours idle while others waited")
    return out
