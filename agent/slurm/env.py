"""What slurmd's prolog and epilog environment tells about a job: its metadata and the
researcher's `jobpulse:` settings at the start, and how it ended, with the kernel's word on OOM
kills from the job's memory cgroup.

Slurm hands the hooks the job's account, partition, nodes and comment (and, since 23.02, its
start and end-of-limit times), so no node asks slurmctld. At the end it gives the batch script's
wait status (``SLURM_JOB_EXIT_CODE``) and the highest step's (``SLURM_JOB_DERIVED_EC``); a job
Slurm itself cancelled or timed out can still read 0 there (22.05), so a clean status leaves the
state to the controller (`jobpulse-agent slurm-sync`), never guessing COMPLETED.
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobpulse.agent.slurm import dialect
from jobpulse.agent.slurm.gres_conf import MIG_MINORS, GresConfError, job_devices
from jobpulse.schema.semantics import check_interval

# The wait status Slurm reports for a job or step its task/cgroup plugin saw OOM-killed (SIG_OOM).
SIG_OOM = 253
# Slurm's task/cgroup layouts: cgroup v1 (memory controller, per-node slurm[_NODE] folder) and v2;
# {job} is the job's directory: job_<id>, or from 26.05 its SLUID (`dialect.cgroup_job`).
_CGROUP_OOM_FILES = ("memory/slurm*/uid_*/{job}/memory.oom_control",
                     "memory/slurm*/uid_*/{job}/step_*/memory.oom_control",
                     "system.slice/slurmstepd.scope/{job}/memory.events",
                     "slurm*/{job}/memory.events")


HOOK = re.compile(r"jobpulse:\s*(?P<settings>[^;]*)", re.IGNORECASE)


class HookError(ValueError):
    """A `jobpulse:` setting in the job comment that cannot be used (names the setting)."""


NOTIFY_URL = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%!$&'()*+;=:@/?-]*)?")
NOTIFY_URL_MAX = 512


def parse_hooks(comment: str | None) -> dict[str, Any]:
    """Settings from the job comment, e.g. ``jobpulse: interval=0.5 tags=project:llm,stage:pre``.

    ``interval`` (seconds, 0.1-3600), ``tags`` (key:value,...), ``off`` (no monitoring),
    ``notify`` (an https webhook URL, e.g. Slack's or Mattermost's, for this job's flags while it runs:
    kept as the tag ``notify``; the collector posts only to the hosts its site allows), ``policy=off``
    (the job asks to be left out of the site's idle-GPU policy, where the site allows it), ``capture=off``
    (no stacks of the job's processes are sampled as evidence for its flags).
    The rest of the comment is left to the researcher.
    """
    m = HOOK.search(comment or "")
    if not m:
        return {}
    out: dict[str, Any] = {}
    for item in m.group("settings").split():
        key, _, value = item.partition("=")
        key = key.lower()
        if key == "off":
            out["off"] = True
        elif key == "interval":
            try:
                interval = float(value)
            except ValueError:
                raise HookError(f"interval must be seconds, got {value!r}") from None
            try:
                out["interval_s"] = check_interval(interval)
            except ValueError as exc:
                raise HookError(str(exc)) from None
        elif key == "tags":
            tags = {}
            for pair in filter(None, value.split(",")):
                k, sep, v = pair.partition(":")
                if not sep or not k:
                    raise HookError(f"tags must be key:value pairs, got {pair!r}")
                tags[k] = v
            out["tags"] = {**out.get("tags", {}), **tags}
        elif key in ("policy", "capture"):
            if value != "off":
                raise HookError(f"{key} can only be off, got {value[:40]!r}")
            out["tags"] = {**out.get("tags", {}), key: "off"}
        elif key == "notify":
            if len(value) > NOTIFY_URL_MAX or not NOTIFY_URL.fullmatch(value):
                raise HookError(f"notify must be an https:// URL of at most 512 characters, got {value[:80]!r}")
            out["tags"] = {**out.get("tags", {}), "notify": value}
        else:
            raise HookError(f"unknown jobpulse setting {key!r} (interval, tags, notify, policy, capture, off)")
    return out


def _epoch(value: str | None) -> datetime | None:
    return datetime.fromtimestamp(int(value), tz=UTC) if value and value.isdigit() else None


NO_LIMIT_S = 365 * 86400
"""What the prolog's end time is past the start for a job without a time limit (a year: 24.11, 26.05)."""


def job_metadata(env: dict[str, str]) -> dict[str, Any]:
    """JobRecord fields from the prolog's environment (what this Slurm version provides)."""
    start, end = _epoch(env.get("SLURM_JOB_START_TIME")), _epoch(env.get("SLURM_JOB_END_TIME"))
    restarts = env.get("SLURM_JOB_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT")  # the hooks' name, the tasks'
    record: dict[str, Any] = {"user_name": env.get("SLURM_JOB_USER"), "uid": env.get("SLURM_JOB_UID"),
                              "account": env.get("SLURM_JOB_ACCOUNT"), "partition": env.get("SLURM_JOB_PARTITION"),
                              "job_name": env.get("SLURM_JOB_NAME"),
                              "start_time": start.isoformat() if start else None,
                              "run": int(restarts) if restarts and restarts.isdigit() else None}
    if start and end and end > start and (end - start).total_seconds() != NO_LIMIT_S:
        record["time_limit_s"] = int((end - start).total_seconds())
    return {k: v for k, v in record.items() if v not in (None, "", "(null)")}


def job_gpus(env: dict[str, str], gres_conf: Path | None = None, mig_minors: Path = MIG_MINORS) -> list[str]:
    """The job's GPUs on this node as the agent resolves them: MIG slices by the `MIG-` names Slurm
    gives CUDA_VISIBLE_DEVICES when AutoDetect found them, else the GRES indices of SLURM_JOB_GPUS
    through ``gres_conf`` (a GPU's minor, a slice's GPU/GPU instance/compute instance: see
    `gres_conf`), else those indices as they are (read as device minors). A gres.conf this cannot
    read costs the mapping, not the job's monitoring: the indices as they are, and why on stderr
    (the prolog's log)."""
    visible = [g.strip() for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if visible and all(g.startswith(("MIG-", "GPU-")) for g in visible):  # names, not indices (25.11+ may give UUIDs)
        return visible
    indices = [g for g in env.get("SLURM_JOB_GPUS", "").split(",") if g]
    if gres_conf is not None and indices:
        name = "mps" if gpu_share(env) is not None else "gpu"  # an MPS job's indices are its mps GRES's
        try:
            devices = job_devices(indices, gres_conf, env.get("SLURMD_NODENAME", ""), mig_minors, name)
        except GresConfError as exc:
            print(f"jobpulse: {exc}; taking the GPU indices Slurm gave ({','.join(indices)}) as device minors",
                  file=sys.stderr)
            devices = None
        if devices is not None:
            return devices
    return indices


def gpu_share(env: dict[str, str]) -> float | None:
    """The share of each of its GPUs an MPS job holds: Slurm 22.05 puts its mps count over the
    GPU's, in percent, in the prolog's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; None for other jobs (a
    shard job's prolog gets no variable at all: its share is unknown)."""
    percent = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
    return min(int(percent), 100) / 100 if percent.isdigit() and int(percent) > 0 else None


def shares_gpus(env: dict[str, str]) -> bool:
    """The job got its GPUs as Slurm shards or MPS: other jobs may run on them too."""
    return bool(env.get("SLURM_SHARDS_ON_NODE") or env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))


def _status(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


def wait_status(value: str | None) -> tuple[int, int]:
    """(exit code, signal) of a wait(2) status as Slurm passes it to the hooks (every version); (0, 0)
    when unset."""
    return dialect.wait_status(_status(value))


def oom_killed(job_id: str, cgroup_root: Path = Path("/sys/fs/cgroup"), sluid: str | None = None) -> bool:
    """Whether the kernel OOM-killed a process in the job's memory cgroup (any step), as far as
    a cgroup of the job is still there to read (Slurm's own are removed before the epilog: then
    its SIG_OOM status tells). ``sluid``: the job's SLUID, which names its directory from 26.05."""
    names = [f"job_{job_id}", *((sluid, f"job_{sluid}") if sluid and dialect.SLUID.fullmatch(sluid) else ())]
    for pattern, name in ((p, n) for p in _CGROUP_OOM_FILES for n in names):
        for path in cgroup_root.glob(pattern.format(job=name)):
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            if any(line.startswith("oom_kill ") and int(line.split()[1]) > 0 for line in lines):
                return True
    return False


def end_state(env: dict[str, str], oom: bool) -> tuple[str | None, int]:
    """(Slurm's name for how the job ended, or None when only the controller can tell; exit code).

    OUT_OF_MEMORY on Slurm's SIG_OOM status or the kernel's count; FAILED when the batch script or
    any step exited non-zero or was killed by a signal not from Slurm (128 + N); otherwise None:
    COMPLETED, CANCELLED, TIMEOUT or NODE_FAIL as slurmctld records it. (A timeout reads status 0
    here, and the epilog's SLURM_JOB_END_TIME is when the job ended, not its limit: 24.11, 26.05.)
    """
    code, signal = wait_status(env.get("SLURM_JOB_EXIT_CODE"))
    step_code, step_signal = wait_status(env.get("SLURM_JOB_DERIVED_EC"))
    exit_code = code or step_code
    if oom or SIG_OOM in (_status(env.get("SLURM_JOB_EXIT_CODE")), _status(env.get("SLURM_JOB_DERIVED_EC"))):
        return "OUT_OF_MEMORY", exit_code
    if code or signal or step_code or step_signal:
        return "FAILED", dialect.shell_code(code, signal) or dialect.shell_code(step_code, step_signal) or 0
    return None, exit_code
