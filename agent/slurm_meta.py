"""Job metadata the prolog's environment lacks (account, name, time limit, submit time), from
`squeue --json`, which every Slurm since 21.08 has (pyslurm would have to match the site's
Slurm version exactly). Runs off the agent's sampling path; a slow or absent slurmctld only
means the fields stay empty."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone
from typing import Any

import structlog

log = structlog.get_logger("jobpulse.agent.slurm_meta")


def _time(value: Any) -> str | None:
    if isinstance(value, dict):  # Slurm 23.02+: {"set": true, "number": N}
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, int) and value > 0:
        return datetime.fromtimestamp(value, tz=timezone.utc).isoformat()
    return None


def _number(value: Any) -> int | None:
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) and not value.get("infinite") else None
    return value if isinstance(value, int) and value >= 0 else None


def job_metadata(job_id: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """JobRecord fields for ``job_id`` from squeue, or None when squeue cannot tell."""
    try:
        out = subprocess.run(["squeue", "--json", "--jobs", job_id], capture_output=True, text=True,
                             timeout=timeout_s)
        jobs = json.loads(out.stdout).get("jobs", []) if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        log.info("squeue unavailable", job=job_id, reason=str(exc))
        return None
    job = next((j for j in jobs if str(j.get("job_id")) == job_id), None)
    if job is None:
        return None
    limit = _number(job.get("time_limit"))  # minutes
    record = {"job_id": job_id, "account": job.get("account") or None, "job_name": job.get("name") or None,
              "time_limit_s": None if limit is None else limit * 60, "submit_time": _time(job.get("submit_time")),
              "start_time": _time(job.get("start_time"))}
    return {k: v for k, v in record.items() if v is not None}
