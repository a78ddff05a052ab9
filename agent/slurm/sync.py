"""The controller's view of jobs, asked once per cluster: `jobpulse-agent slurm-sync` polls
`squeue --json --states=all` (one request for every job, instead of one per job on every node)
and ships what only slurmctld knows — job name, time limit, submit time, the run (Slurm's restart
count: a requeued job's next run), the state as it changes while the job runs (RUNNING, SUSPENDED,
RUNNING, with when Slurm suspended or resumed it) and the final state (COMPLETED, FAILED, TIMEOUT,
CANCELLED, OUT_OF_MEMORY, NODE_FAIL, PREEMPTED) with its exit code; for a requeued job, how each
earlier run ended (from accounting where there is one) — to the collector as job records, through the same spool and shipper
as a node agent. squeue's JSON is read through `dialect`, as the Slurm version that wrote it means it.
Each poll also sends what waits in each partition (`queue`: pending jobs and the GPUs they ask).

Run one per cluster on a host with the Slurm client commands (e.g. the controller or a login
node). `squeue --json` exists in every Slurm since 21.08 and keeps ended jobs for MinJobAge
(300 s by default): an interval well below that sees every job end.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import structlog

from jobpulse.agent.shipping.batch import Batcher
from jobpulse.agent.shipping.send import Shipper, compress
from jobpulse.agent.shipping.spool import Spool
from jobpulse.agent.slurm import dialect, queue
from jobpulse.agent.slurm.env import HookError, parse_hooks
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent.slurm.sync")


def _time(epoch: int | None) -> str | None:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat() if epoch else None


SCRIPTS_PER_POLL = 100
"""Batch scripts asked of slurmctld in one poll (the first poll of a busy cluster sees thousands of
jobs: the rest are asked in the next polls)."""
_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}


def allocation(tres: Any) -> dict[str, int]:
    """CPUs and memory (MiB) from a job's ``tres_alloc_str`` (``cpu=8,mem=64G,node=2,gres/gpu=4``):
    the same text in every Slurm version's squeue --json."""
    out: dict[str, int] = {}
    for item in tres.split(",") if isinstance(tres, str) else ():
        key, _, value = item.partition("=")
        if key == "cpu" and value.isdigit():
            out["cpus"] = int(value)
        elif key == "mem" and value[:-1].replace(".", "", 1).isdigit() and value[-1:] in _MIB:
            out["mem_mib"] = round(float(value[:-1]) * _MIB[value[-1]])
        elif key == "mem" and value.isdigit():
            out["mem_mib"] = int(value)
    return out


def script_hash(script: str) -> str:
    """SHA-256 of a batch script without its ``#SBATCH`` lines and trailing blanks: the work, not
    what it asked for (a next run that took the advice changed only those lines)."""
    work = [line.rstrip() for line in script.splitlines() if not line.lstrip().startswith("#SBATCH")]
    return hashlib.sha256("\n".join(work).strip().encode()).hexdigest()


def parse_hooks_quietly(comment: Any) -> dict[str, Any]:
    """The job comment's jobpulse settings; a malformed one was ignored by the prolog too."""
    try:
        return parse_hooks(comment if isinstance(comment, str) else None)
    except HookError:
        return {}


def job_records(squeue_json: str) -> list[wire.JobRecord]:
    """Job records from `squeue --json` output (`records`)."""
    return records(dialect.squeue_jobs(json.loads(squeue_json)))


def run_ends(sacct_json: str | None, job_id: str, runs: range) -> list[wire.JobRecord]:
    """How the ``runs`` of a job Slurm requeued ended: as accounting names each (`sacct --duplicates`
    lists a job's runs oldest first: NODE_FAIL, PREEMPTED, REQUEUED), else REQUEUED (the restart
    count says it was, not why) and no end (the epilog's, or the next run's start, bounds it)."""
    found: list[dialect.Job] = []
    if sacct_json:
        try:
            found = sorted((j for j in dialect.sacct_jobs(json.loads(sacct_json))
                            if j.job_id == job_id and j.state in (*dialect.FINAL, dialect.REQUEUED)),
                           key=lambda j: j.start or 0)  # the runs that ended, oldest first
        except ValueError as exc:
            log.info("sacct output unusable", job=job_id, reason=str(exc))
    out = []
    for run in runs:
        ran = found[run] if run < len(found) else None
        record = {"job_id": job_id, "run": run, "state": ran.state if ran else dialect.REQUEUED,
                  "end_time": _time(ran.end) if ran else None,
                  "exit_code": dialect.shell_code(ran.exit_code, ran.signal) if ran else None}
        out.append(msgspec.convert({k: v for k, v in record.items() if v is not None}, wire.JobRecord))
    return out


def records(jobs: list[dialect.Job]) -> list[wire.JobRecord]:
    """Job records from squeue's jobs: metadata (with the CPUs and memory allocated, and the run:
    Slurm's restart count) for every job that ran and was monitored (not pending, not `jobpulse:
    off`), its state as it changes (RUNNING, SUSPENDED, ...), and for an ended job its state as
    Slurm names it (FAILED, as the epilog says, when a step failed in a job Slurm calls COMPLETED),
    exit code and end time. Jobs that do not fit the wire are skipped."""
    out = []
    for job in jobs:
        if not job.ran or parse_hooks_quietly(job.comment).get("off"):
            continue  # no prolog registered it: not a job of ours
        limit = job.time_limit_min
        record: dict[str, Any] = {
            "job_id": job.job_id, "account": job.account, "job_name": job.name, "partition": job.partition,
            "user_name": job.user_name, "time_limit_s": None if limit is None else limit * 60,
            "submit_time": _time(job.submit), "start_time": _time(job.start), "run": job.restarts,
            # memory is in the allocation only where it is a consumable resource (CR_*_Memory);
            # elsewhere what the job asked for is what it held
            **allocation(job.tres_req), **allocation(job.tres_alloc)}
        state = job.state
        if state in dialect.FINAL:
            # killed by a signal of its own (FAILED): 128 + N; Slurm's (TIMEOUT, CANCELLED): the status
            code = dialect.shell_code(job.exit_code, job.signal) if state == "FAILED" else job.exit_code
            step_code = dialect.shell_code(job.step_exit_code, job.step_signal)
            if state == "COMPLETED" and step_code:  # a step failed though the script exited 0: as the epilog says
                state, code = "FAILED", step_code
            record |= {"exit_code": code, "end_time": _time(job.end)}
        elif state == "SUSPENDED" or (state == "RUNNING" and job.state_since):  # suspended, or resumed then
            record["state_since"] = _time(job.state_since)
        if state not in dialect.PASSING:
            record["state"] = state
        kept, _ = wire.clipped(wire.JobRecord, {k: v for k, v in record.items() if v is not None})
        try:
            out.append(msgspec.convert(kept, wire.JobRecord))
        except msgspec.ValidationError as exc:
            log.info("squeue job unusable", job=record["job_id"], error=str(exc))
    return out


class SlurmSync:
    """Polls squeue and ships each job's record whenever what the controller says about it changed."""

    def __init__(self, node: str, cluster: str, collector: str, token_file: Path, spool_dir: Path,
                 squeue: list[str] | None = None, scontrol: list[str] | None = None,
                 metrics_url: str | None = None) -> None:
        self.batcher = Batcher(node, cluster)
        self.spool = Spool(spool_dir, 64 * 1024 * 1024)
        self.shipper = Shipper(collector, token_file, self.spool, lambda counts: log.warning("dropped", **counts))
        self.squeue = squeue or ["squeue", "--json", "--states=all"]
        self.seen: dict[str, wire.JobRecord] = {}
        self.scontrol = scontrol or ["scontrol"]
        self.sacct = ["sacct"]
        self.told: dict[str, int] = {}  # job -> the restart count whose earlier runs' ends were sent
        self.scripts: dict[str, str | None] = {}  # job -> its script's hash (None: not to be had)
        self.asks = SCRIPTS_PER_POLL
        self.queue = queue.Queue(self.scontrol, metrics_url)

    def poll(self, timeout_s: float = 30.0) -> int:
        """One squeue call (and slurmctld's OpenMetrics where served); returns how many job records
        were queued for the collector. What waits in each partition goes every poll."""
        try:
            out = subprocess.run(self.squeue, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("squeue failed", reason=str(exc))
            return 0
        if out.returncode != 0:
            log.warning("squeue failed", status=out.returncode, stderr=out.stderr.strip()[-500:])
            return 0
        try:
            jobs = dialect.squeue_jobs(json.loads(out.stdout))
        except ValueError as exc:
            log.warning("squeue output unusable", reason=str(exc))
            return 0
        self.batcher.add("queue", self.queue.read(jobs, datetime.now(UTC)))
        batch = {j.job_id for j in jobs if j.batch}
        self.asks = SCRIPTS_PER_POLL
        now = {r.job_id: self._with_script(r, r.job_id in batch) for r in records(jobs)}
        self.scripts = {j: h for j, h in self.scripts.items() if j in now}
        self.told = {j: n for j, n in self.told.items() if j in {x.job_id for x in jobs}}
        # how the earlier runs of requeued jobs ended, before their new runs' records
        changed = [end for j in jobs if j.restarts and self.told.get(j.job_id) != j.restarts
                   and not parse_hooks_quietly(j.comment).get("off") for end in self._run_ends(j.job_id, j.restarts)]
        changed += [r for r in now.values() if self.seen.get(r.job_id) != r]
        self.seen = now  # a job squeue no longer shows will not come back
        if changed:
            self.batcher.add("jobs", changed)
        return len(changed)

    def _with_script(self, record: wire.JobRecord, batch: bool) -> wire.JobRecord:
        """The record with its batch script's hash, asked of slurmctld once per job (an interactive
        job has none; a script the controller no longer holds is not asked for again)."""
        if record.job_id not in self.scripts and (not batch or self.asks > 0):
            self.asks -= batch
            self.scripts[record.job_id] = self._script_hash(record.job_id) if batch else None
        found = self.scripts.get(record.job_id)
        return msgspec.structs.replace(record, script_hash=found) if found else record

    def _run_ends(self, job_id: str, restarts: int) -> list[wire.JobRecord]:
        """How runs 0 .. ``restarts`` - 1 of a requeued job ended, asked again at the next poll while
        accounting has not yet named every one (slurmdbd may lag the requeue), once where there is none."""
        found = self._sacct(job_id)
        ends = run_ends(found, job_id, range(restarts))
        if found is None or all(e.state != dialect.REQUEUED or e.end_time for e in ends):
            self.told[job_id] = restarts
        return ends

    def _sacct(self, job_id: str) -> str | None:
        """`sacct --json --duplicates` of a requeued job (every run), or None where accounting is off."""
        try:
            out = subprocess.run([*self.sacct, "--json", "--duplicates", "-j", job_id], capture_output=True,
                                 text=True, errors="replace", timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.info("sacct not read", job=job_id, reason=str(exc))
            return None
        if out.returncode != 0:
            log.info("sacct not read", job=job_id, status=out.returncode, stderr=out.stderr.strip()[-300:])
            return None
        return out.stdout

    def _script_hash(self, job_id: str) -> str | None:
        try:
            out = subprocess.run([*self.scontrol, "write", "batch_script", job_id, "-"], capture_output=True,
                                 text=True, errors="replace", timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.info("batch script not read", job=job_id, reason=str(exc))
            return None
        if out.returncode != 0:
            log.info("batch script not read", job=job_id, status=out.returncode, stderr=out.stderr.strip()[-300:])
            return None
        return script_hash(out.stdout)

    def ship(self) -> bool:
        ready = self.batcher.take()
        if ready is not None:
            self.spool.put(*compress(ready))
        return self.shipper.drain()

    def run(self, interval_s: float, once: bool = False) -> None:
        while True:
            queued = self.poll()
            delivered = self.ship()
            log.info("slurm sync", jobs=queued, delivered=delivered, known=len(self.seen))
            if once:
                return
            time.sleep(interval_s)
