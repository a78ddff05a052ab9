"""The job's summary in Slurm's own record: run from `EpilogSlurmctld` (slurm/epilog_slurmctld.sh)
when a job ends, it waits for jobpulse's summary of the job and writes a compact form of it into
the job's ``AdminComment`` (the slot Princeton's jobstats uses), so `sacct -o AdminComment` and
whatever the site builds on accounting carry the GPU figures long after the job.

The value is ``jp1:`` then lower-case base32 of zlib-compressed JSON: GPU-hours held, used and
wasted by cause, each GPU's busy share and memory peak, the flags (rule and place) and the #SBATCH
advice, kept under `MAX_CHARS` (GPUs, then flags, then advice dropped until it fits), after what the
comment already said (the idle-GPU policy's reason for a cancel). Base32, because Slurm 22.05's
sacctmgr lower-cases the AdminComment it is given, quoted or not. `decode` reads it back
(`python -m jobpulse.agent.slurm.admin_comment --decode VALUE`).

Written with `sacctmgr update job`, as jobstats does: it needs slurmdbd (`scontrol update` refuses
a job that has ended: "Job has already finished", Slurm 22.05). It never fails the epilog: what it
cannot do is logged and it exits 0. Standard library only.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from jobpulse.agent.slurm import dialect, job_summary

PREFIX = "jp1:"
MAX_CHARS = 1024
"""The longest value written: Slurm stores any length, but sacct's users read it on one line and
slurmdbd keeps it for every job."""


def compact(summary: dict[str, Any]) -> dict[str, Any]:
    """What of a summary goes into the comment: figures and verdicts, no prose."""
    h = summary.get("gpu_hours", {})
    return {"v": 1, "held": h.get("held"), "used": h.get("used"), "wasted": h.get("wasted", {}),
            "gpus": [[g.get("where"), g.get("busy_percent"), g.get("memory_peak_mib")] for g in summary.get("gpus", [])],
            "flags": [[f.get("rule"), f.get("where")] for f in summary.get("flags", [])],
            "sbatch": summary.get("sbatch", [])}


def encode(summary: dict[str, Any], limit: int = MAX_CHARS) -> str:
    """The comment's value, at most ``limit`` characters: what does not fit is left out, GPUs first
    (the report has them), then flags, then advice; the totals always fit."""
    data = compact(summary)
    for drop in (None, "gpus", "flags", "sbatch"):
        if drop:
            data[drop] = []
        packed = zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 9)
        value = PREFIX + base64.b32encode(packed).decode().rstrip("=").lower()
        if len(value) <= limit:
            return value
    raise ValueError(f"a summary's totals do not fit in {limit} characters")


def decode(value: str) -> dict[str, Any]:
    """The JSON of the `jp1:` word in an AdminComment (in either case, after whatever the comment
    held before); ValueError for anything else."""
    at = value.lower().rfind(PREFIX)
    if at < 0 or (at and not value[at - 1].isspace()):
        raise ValueError(f"no jobpulse summary ({PREFIX}...) in this AdminComment: {value[:40]!r}")
    try:
        word = value[at + len(PREFIX):].split(maxsplit=1)
        text = word[0].upper() if word else ""
        found = json.loads(zlib.decompress(base64.b32decode(text + "=" * (-len(text) % 8))))
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"a damaged jobpulse AdminComment: {exc}") from exc
    if not isinstance(found, dict):
        raise ValueError("a damaged jobpulse AdminComment: not an object")
    return found


def store(job_id: str, value: str, wait_s: float = 30.0) -> None:
    """Write the value into the job's AdminComment in Slurm's accounting (slurmdbd), waiting up to
    ``wait_s`` for slurmctld to have sent the job there; RuntimeError when it could not."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            before = current(job_id)  # a reason the job already carries (the idle-GPU policy's) is kept
            comment = f"{before} {value}" if before and PREFIX not in before.lower() else value
            out = subprocess.run(["sacctmgr", "-i", "update", "job", "where", f"jobid={job_id}", "set",
                                  f"AdminComment={comment}"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"sacctmgr: {exc}") from exc
        said = (out.stdout + out.stderr).strip()
        if out.returncode == 0 and "Nothing modified" not in said:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"sacctmgr (status {out.returncode}): {said[-300:]}")
        time.sleep(2)


def current(job_id: str) -> str:
    """The job's AdminComment as it was written ("" where none, or not yet): from `sacct --json`,
    read as its version means it (24.11 gives double quotes back as backticks: `dialect`)."""
    out = subprocess.run(["sacct", "--json", "-j", job_id], capture_output=True, text=True, timeout=30, check=False)
    try:
        jobs = dialect.sacct_jobs(json.loads(out.stdout)) if out.returncode == 0 else []
    except ValueError:
        return ""
    return next((j.admin_comment.strip() for j in jobs if j.job_id == job_id), "")


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--decode"] and len(argv) == 2:
        try:
            print(json.dumps(decode(argv[1]), indent=2))
        except ValueError as exc:
            print(f"jobpulse-admin-comment: {exc}", file=sys.stderr)
            return 2
        return 0
    environ = dict(os.environ if env is None else env)
    job = environ.get("SLURM_JOB_ID")  # an array task's own id, as the prolog registered it
    if not job:
        print("jobpulse-admin-comment: no SLURM_JOB_ID: run it from EpilogSlurmctld", file=sys.stderr)
        return 0
    try:
        summary = job_summary.fetch(environ.get("JOBPULSE_COLLECTOR", ""),
                                    Path(environ.get("JOBPULSE_TOKEN_FILE", "/etc/jobpulse/agent.token")),
                                    environ.get("SLURM_CLUSTER_NAME") or environ.get("JOBPULSE_CLUSTER"), job,
                                    float(environ.get("JOBPULSE_ADMIN_COMMENT_WAIT", "300")))
        if summary is None:
            print(f"jobpulse-admin-comment: job {job}: no summary in time: AdminComment left alone", file=sys.stderr)
            return 0
        store(job, encode(summary))
        print(f"jobpulse-admin-comment: job {job}: summary written into AdminComment", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - an epilog never fails because monitoring is broken
        print(f"jobpulse-admin-comment: job {job}: {exc!r}: AdminComment left alone", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
