"""What waits in each partition, for slurm-sync: the jobs waiting to start there (pending, not held)
and, of them, those asking for GPUs and how many they ask, so that the collector can weigh a GPU
held idle by who waits for it.

Two readers. squeue's JSON (every version, through `dialect`; the sync reads it anyway for the job
records) names each pending job's GPUs: ``tres_per_job`` (``--gpus``), ``tres_per_node``
(``--gres``, ``--gpus-per-node``) times its nodes, or ``tres_per_task`` times its tasks. slurmctld's
OpenMetrics (Slurm 25.11 and later with ``MetricsType=metrics/openmetrics``, served on
SlurmctldPort at ``/metrics/partitions``) is the controller's own count of the jobs pending and held
in each partition, where squeue shows only what its caller may see; it does not say what they ask
(26.05: no metric of a pending job's GPUs, and ``slurm_partition_jobs_gpus_alloc`` reads 0 with
GPUs allocated), so the GPU figures are squeue's in both. Where the endpoint is configured but does
not answer (PrivateData set, MetricsAuthUsers without a token), squeue counts, and the sync says so
once.
"""

from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterable
from datetime import datetime

import structlog

from jobpulse.agent.slurm import dialect
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.agent.slurm.queue")

PATH = "/metrics/partitions"
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of Prometheus/OpenMetrics text; comments skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        found = _SAMPLE.match(line)
        if not found:
            raise ValueError(f"not an OpenMetrics sample line: {line[:120]!r}")
        name, labels, value = found.groups()
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"{name}: value {value[:40]!r} is not a number") from None
        yield name, {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(labels or "")}, number


def waiting_per_partition(text: str) -> dict[str, int]:
    """Jobs waiting in each partition by slurmctld's ``/metrics/partitions``: pending less held."""
    pending: dict[str, float] = {}
    held: dict[str, float] = {}
    for name, labels, value in samples(text):
        if name in ("slurm_partition_jobs_pending", "slurm_partition_jobs_hold") and "partition" in labels:
            (pending if name.endswith("pending") else held)[labels["partition"]] = value
    if not pending:
        raise ValueError("no slurm_partition_jobs_pending sample: not slurmctld's /metrics/partitions")
    return {p: max(0, round(n - held.get(p, 0))) for p, n in pending.items()}


def _gpus(tres: str | None) -> int:
    """GPUs in a per-job, per-node or per-task TRES list: ``gres/gpu:2``, ``gres/gpu:a100:2``,
    ``gres/gpu`` (one), 22.05's ``gres:gpu:2``; other kinds (``gres/shard``) are not GPUs."""
    total = 0
    for item in (tres or "").split(","):
        parts = item.strip().replace("=", ":").split(":")
        kind = parts.pop(0)
        if kind == "gres" and parts:  # 22.05: gres:gpu[:type]:N
            kind = "gres/" + parts.pop(0)
        if kind == "gres/gpu":
            total += int(parts[-1]) if parts and parts[-1].isdigit() else 1
    return total


def gpus_asked(job: dialect.Job) -> int:
    """The GPUs a job asks over all its nodes: per job, else per node times its nodes, else per task
    times its tasks."""
    if per_job := _gpus(job.tres_per_job):
        return per_job
    if per_node := _gpus(job.tres_per_node):
        return per_node * (job.nodes or 1)
    return _gpus(job.tres_per_task) * (job.tasks or 1)


def waits(job: dialect.Job) -> bool:
    """Whether a job waits to start: pending and not held (a held job waits for a person, not a GPU)."""
    return job.state == "PENDING" and not job.held


def from_squeue(jobs: list[dialect.Job]) -> dict[str, tuple[int, int, int]]:
    """Per partition any job names: (jobs waiting, of them asking for GPUs, GPUs they ask). A job
    submitted to several partitions (``-p a,b``) waits in each."""
    out: dict[str, tuple[int, int, int]] = {}
    for job in jobs:
        for partition in filter(None, (job.partition or "").split(",")):
            n, gpu_jobs, gpus = out.get(partition, (0, 0, 0))
            if waits(job):
                asked = gpus_asked(job)
                n, gpu_jobs, gpus = n + 1, gpu_jobs + (asked > 0), gpus + asked
            out[partition] = (n, gpu_jobs, gpus)
    return out


def readings(squeue: dict[str, tuple[int, int, int]], openmetrics: dict[str, int] | None, ts: datetime,
             known: Iterable[str] = ()) -> list[wire.PartitionQueue]:
    """One reading per partition seen now or before (``known``: a partition whose jobs all left
    squeue reads zero, not its last queue)."""
    names = sorted({*squeue, *(openmetrics or {}), *known})
    out = []
    for p in names:
        n, gpu_jobs, gpus = squeue.get(p, (0, 0, 0))
        if openmetrics is not None:
            n = max(openmetrics.get(p, 0), gpu_jobs)  # two reads a moment apart: never fewer than the GPU jobs
        out.append(wire.PartitionQueue(ts=ts, partition=p, jobs_pending=n, gpu_jobs_pending=gpu_jobs,
                                       gpus_pending=gpus, source="openmetrics" if openmetrics is not None else "squeue"))
    return out


def metrics_url(show_config: str) -> str | None:
    """slurmctld's OpenMetrics address from `scontrol show config`, or None where MetricsType is not
    metrics/openmetrics (before 25.11 there is no such setting)."""
    conf = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in show_config.splitlines()) if _}
    if conf.get("MetricsType") != "metrics/openmetrics":
        return None
    host = conf.get("SlurmctldHost[0]") or conf.get("SlurmctldHost") or ""
    found = re.fullmatch(r"([^(\s]+)(?:\(([^)]+)\))?", host)
    port = (conf.get("SlurmctldPort") or "6817").split("-")[0]
    if not found or not port.isdigit():
        return None
    address = found.group(2) or found.group(1)
    return f"http://{'[' + address + ']' if ':' in address else address}:{port}{PATH}"


class Queue:
    """The sync's reader: OpenMetrics where slurmctld serves it (found once from `scontrol show
    config`, or given), squeue's jobs for what they ask; the partitions seen so far."""

    def __init__(self, scontrol: list[str], url: str | None = None) -> None:
        self.scontrol = scontrol
        self.url = url
        self.asked = url is not None
        self.known: set[str] = set()
        self.failing = False

    def _url(self) -> str | None:
        if not self.asked:
            self.asked = True
            try:
                out = subprocess.run([*self.scontrol, "show", "config"], capture_output=True, text=True, timeout=20)
                self.url = metrics_url(out.stdout) if out.returncode == 0 else None
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.info("scontrol show config failed: the queue is counted from squeue", reason=str(exc))
            log.info("partition queue", source="openmetrics" if self.url else "squeue", url=self.url)
        return self.url

    def _openmetrics(self, timeout_s: float) -> dict[str, int] | None:
        url = self._url()
        if url is None:
            return None
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as answer:
                found = waiting_per_partition(answer.read(8 * 1024 * 1024).decode("utf-8", "replace"))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            if not self.failing:
                log.warning("slurmctld's OpenMetrics unreadable: the queue is counted from squeue", url=url,
                            reason=str(exc))
            self.failing = True
            return None
        if self.failing:
            log.info("slurmctld's OpenMetrics readable again", url=url)
        self.failing = False
        return found

    def read(self, jobs: list[dialect.Job], ts: datetime, timeout_s: float = 10.0) -> list[wire.PartitionQueue]:
        """This poll's readings, one per partition seen so far."""
        found = readings(from_squeue(jobs), self._openmetrics(timeout_s), ts, self.known)
        self.known |= {r.partition for r in found}
        return found
