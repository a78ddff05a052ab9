"""A policy that acts only while others wait (``only_while_queued = true``): an idle or hung job's GPUs
matter most when jobs wait for GPUs in its partition. The partition's latest reading (slurm-sync's,
`queue_reads.waiting`: at most 10 minutes old) decides; without one the policy holds back, saying why."""

from __future__ import annotations

from typing import Any


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def queued(reading: dict[str, Any]) -> str:
    """What waits, in words: ``2 jobs wait for 4 GPUs in partition gpu``."""
    jobs = reading["gpu_jobs_pending"]
    return (f"{_n(jobs, 'job')} wait{'s' if jobs == 1 else ''} for {_n(reading['gpus_pending'], 'GPU')} in partition "
            f"{reading['partition']}")


def held_back(c: dict[str, Any]) -> str | None:
    """Why a policy that acts only while others wait leaves this job alone now, or None (they wait)."""
    reading = c.get("queue")
    if reading is None:
        return (f"no reading of partition {c['partition']}'s queue in the last 10 minutes (is slurm-sync running?); "
                "the site acts only while others wait")
    if not reading["gpu_jobs_pending"]:
        return f"no job waits for GPUs in partition {c['partition']}; the site acts only while others wait"
    return None
