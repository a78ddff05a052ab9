"""What Slurm says about jobs, read the way the version that wrote it means it: the one reader of
`squeue --json` and `sacct --json` (keyed by the data_parser version in the output's ``meta``), of
the hooks' exit statuses, of cgroup directory names and of the AdminComment text accounting gives back.

What changed between the versions jobpulse is tested on (22.05, 24.11, 26.05; `tests/data/slurm/`):

- 22.05 (openapi/v0.0.38): numbers are plain; ``job_state`` is a string; ``exit_code`` is a wait(2)
  status (``exit 3`` reads 768, ``kill -9`` reads 9).
- 23.02 and later (data_parser/v0.0.39+): numbers are ``{set, infinite, number}``; ``job_state`` is a
  list (``["RUNNING", "COMPLETING"]``); ``exit_code`` is ``{status, return_code, signal}`` whose
  ``return_code.number`` is the exit status itself and ``signal.id.number`` the signal; likewise
  ``derived_exit_code``. sacct's ``state.current`` became a list; its AdminComment is at
  ``comment.administrator`` in every version, double quotes given back as backticks in every
  version, its case kept from 24.11 (22.05 lower-cased it).
- 26.05 (data_parser/v0.0.45): each job has a SLUID (``step_id.sluid``; ``SLURM_JOB_SLUID`` in the
  hooks' and tasks' environment, e.g. ``sB19M8TKC67X00``).

The hooks' environment is the same in all three: ``SLURM_JOB_EXIT_CODE`` and ``SLURM_JOB_DERIVED_EC``
stay wait statuses (`wait_status`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Version = tuple[int, int, int]
STRUCTURED: Version = (0, 0, 39)
"""The first data_parser version (Slurm 23.02) with structured numbers, state lists and exit statuses."""
_PARSER = re.compile(r"(?:data_parser|openapi)/(?:db)?v(\d+)\.(\d+)\.(\d+)")
SLUID = re.compile(r"s[0-9A-HJKMNP-TV-Z]{13}")
"""A Slurm 26.05 job's SLUID: ``s`` and 13 characters of Crockford's base32."""
FINAL = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE"})
REQUEUED = "REQUEUED"
"""How a run that Slurm requeued ended, where nothing says more (sacct names NODE_FAIL or PREEMPTED)."""
PASSING = frozenset({"CONFIGURING", "COMPLETING"})
"""States a job passes through on its way in or out (22.05 shows them alone): not a change of its life."""


def parser_version(meta: Any) -> Version:
    """The data_parser (22.05: OpenAPI plugin) version an output was written with; 22.05's where
    ``meta`` names none."""
    plugin = meta.get("plugin", {}) if isinstance(meta, dict) else {}
    for key in ("data_parser", "type"):
        found = _PARSER.search(str(plugin.get(key) or ""))
        if found:
            major, minor, micro = found.groups()
            return int(major), int(minor), int(micro)
    return (0, 0, 38)


def number(value: Any) -> int | None:
    """A count or time as either form writes it; None where unset or infinite."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) and not value.get("infinite") else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def epoch(value: Any) -> int | None:
    """A time in epoch seconds; None where unset (0, or 22.05's sacct's None)."""
    found = number(value)
    return found if found else None


def wait_status(status: int) -> tuple[int, int]:
    """(exit status, signal) of a wait(2) status."""
    return (status >> 8) & 0xFF, status & 0x7F


def exit_status(value: Any, version: Version) -> tuple[int | None, int | None]:
    """(exit status, signal) of an ``exit_code``/``derived_exit_code`` as ``version`` writes it."""
    if version < STRUCTURED:
        if isinstance(value, dict):  # 22.05's sacct: {"status", "return_code": N, "signal": {"signal_id"}}
            signal = number((value.get("signal") or {}).get("signal_id"))
            return number(value.get("return_code")), signal
        found = number(value)
        return wait_status(found) if found is not None else (None, None)
    if not isinstance(value, dict):
        return None, None
    code, signal = number(value.get("return_code")), number((value.get("signal") or {}).get("id")) or None
    return (0 if code is None and signal else code), signal  # signaled: no status of its own, as a wait status reads


def shell_code(code: int | None, signal: int | None) -> int | None:
    """The one exit code a failed job is recorded with: its exit status, or ``128 + N`` when signal N
    (1-64: Slurm's own statuses such as SIG_OOM are no signal) killed it, as its shell would report it."""
    return 128 + signal if signal and 0 < signal <= 64 and not code else code


def admin_comment(text: str | None) -> str:
    """An AdminComment as it was written: accounting gives its double quotes back as backticks
    (22.05, 24.11 and 26.05 alike; 22.05 also lower-cases it, which cannot be undone)."""
    return (text or "").replace("`", '"')


@dataclass(frozen=True)
class Job:
    """One job as squeue or sacct describes it, in every version's terms."""

    job_id: str
    state: str | None  # the final state where it has one, else the first listed (RUNNING, PENDING, ...)
    exit_code: int | None
    signal: int | None
    step_exit_code: int | None  # the highest step's (derived_exit_code)
    step_signal: int | None
    start: int | None  # epoch seconds
    state_since: int | None  # squeue's suspend_time: when Slurm last suspended or resumed it (unset: never)
    end: int | None
    submit: int | None
    time_limit_min: int | None
    restarts: int | None
    comment: str | None
    admin_comment: str
    sluid: str | None
    name: str | None
    user_name: str | None
    account: str | None
    partition: str | None
    tres_req: str | None
    tres_alloc: str | None
    tres_per_node: str | None  # what a job asked for on each node (``gres/gpu:2``; 22.05: ``gres:gpu:2``)
    tres_per_job: str | None  # ... for the whole job (``--gpus=4``: ``gres/gpu:4``)
    tres_per_task: str | None  # ... for each task (``--gpus-per-task``)
    tasks: int | None
    nodes: int | None
    batch: bool
    reason: str | None
    held: bool  # a pending job held by its user or an admin (24.11+: ``hold``; 22.05: its reason)

    @property
    def ran(self) -> bool:
        """Whether the job got nodes: it has a start, and an ended job's start differs from its end
        unless Slurm says it ran and then failed (a job failing within its first second ends where it
        started; a job cancelled while pending "starts" and ends at its cancel)."""
        if self.state in (None, "PENDING") or self.start is None:
            return False
        return self.state not in FINAL or self.start != self.end or self.state not in ("CANCELLED", "DEADLINE")


_HELD = ("JobHeldUser", "JobHeldAdmin")


def _state(value: Any) -> str | None:
    if isinstance(value, dict):  # sacct: {"current": ..., "reason": ...}
        value = value.get("current")
    if isinstance(value, list):  # 23.02+: ["CANCELLED"] or ["RUNNING", "COMPLETING"]
        value = next((s for s in value if s in FINAL or s == REQUEUED), value[0] if value else None)
    return value if isinstance(value, str) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _job(raw: dict[str, Any], version: Version, sacct: bool) -> Job:
    code, signal = exit_status(raw.get("exit_code"), version)
    step_code, step_signal = exit_status(raw.get("derived_exit_code"), version)
    found = raw.get("time") if sacct else None
    times: dict[str, Any] = found if isinstance(found, dict) else {}
    comment = raw.get("comment")
    step = raw.get("step_id")
    sluid = step.get("sluid") if isinstance(step, dict) else None
    return Job(
        job_id=str(raw.get("job_id")), state=_state(raw.get("state") if sacct else raw.get("job_state")),
        exit_code=code, signal=signal, step_exit_code=step_code, step_signal=step_signal,
        start=epoch(times.get("start") if sacct else raw.get("start_time")),
        state_since=None if sacct else epoch(raw.get("suspend_time")),
        end=epoch(times.get("end") if sacct else raw.get("end_time")),
        submit=epoch(times.get("submission") if sacct else raw.get("submit_time")),
        time_limit_min=number(times.get("limit") if sacct else raw.get("time_limit")),
        restarts=number(raw.get("restart_cnt")),
        comment=_text(comment.get("job") if isinstance(comment, dict) else comment),
        admin_comment=admin_comment(_text(comment.get("administrator") if isinstance(comment, dict)
                                          else raw.get("admin_comment"))),
        sluid=sluid if isinstance(sluid, str) and SLUID.fullmatch(sluid) else None,
        name=_text(raw.get("name")), user_name=_text(raw.get("user") if sacct else raw.get("user_name")),
        account=_text(raw.get("account")), partition=_text(raw.get("partition")),
        tres_req=_text(raw.get("tres_req_str")), tres_alloc=_text(raw.get("tres_alloc_str")),
        tres_per_node=_text(raw.get("tres_per_node")), tres_per_job=_text(raw.get("tres_per_job")),
        tres_per_task=_text(raw.get("tres_per_task")), tasks=number(raw.get("tasks")),
        nodes=number(raw.get("node_count")), batch=bool(raw.get("batch_flag")), reason=_text(raw.get("state_reason")),
        held=raw.get("hold") is True or raw.get("state_reason") in _HELD)


def squeue_jobs(doc: Any) -> list[Job]:
    """The jobs of a `squeue --json` output, whichever version wrote it."""
    return _jobs(doc, sacct=False)


def sacct_jobs(doc: Any) -> list[Job]:
    """The jobs of a `sacct --json` output, whichever version wrote it."""
    return _jobs(doc, sacct=True)


def _jobs(doc: Any, sacct: bool) -> list[Job]:
    if not isinstance(doc, dict):
        raise ValueError("not a Slurm JSON document (an object with meta and jobs)")
    version = parser_version(doc.get("meta"))
    jobs = doc.get("jobs")
    return [_job(j, version, sacct) for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []


_CGROUP_JOB = re.compile(r"/job_(\d+)(?:/|$)|/(?:job_)?(" + SLUID.pattern + r")(?:/|$)")


def cgroup_job(path: str) -> tuple[str | None, str | None]:
    """(job id, SLUID) a Slurm cgroup path names: ``.../job_<id>/...`` up to 25.11, a SLUID-named
    directory (``.../sB19M8TKC67X00/...``, with or without ``job_``) from 26.05."""
    found = _CGROUP_JOB.search(path)
    if not found:
        return None, None
    return found.group(1), found.group(2)


def cgroup_job_dir(path: str) -> str | None:
    """The job's own directory in a Slurm cgroup path (``.../job_<id>`` or its SLUID-named one), the
    top of every step's and task's directories; None where the path names no job."""
    found = _CGROUP_JOB.search(path)
    return path[:found.end()].rstrip("/") if found else None
