"""Answer control requests: register a job's GPUs, unregister it at its end, report status."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import structlog

from jobpulse.agent.attribution import Attributor
from jobpulse.agent.control.jobs import JobRegistry, RegistrationError
from jobpulse.agent.shipping.batch import Batcher
from jobpulse.schema import control, wire

log = structlog.get_logger("jobpulse.agent")


class JobControl:
    """The agent's side of `jobpulse.schema.control`: each request becomes a registry change and a
    job record in the next batch."""

    def __init__(self, node: str, gpus: Callable[[], list[str]], jobs: JobRegistry, attributor: Attributor,
                 batcher: Batcher, spooled: Callable[[], int], on_register: Callable[[], None]) -> None:
        self.node, self.gpus, self.jobs, self.attributor = node, gpus, jobs, attributor
        self.batcher, self.spooled, self.on_register = batcher, spooled, on_register

    def __call__(self, req: control.Register | control.Unregister | control.Status) -> control.Reply:
        try:
            if isinstance(req, control.Register):
                return self._register(req)
            if isinstance(req, control.Unregister):
                first = self._first(self.jobs.nodes_of(req.job_id))
                record = self.jobs.unregister(req.job_id, req.state, req.exit_code)
                if first:  # how the job ended is the job's own fact: its first node's (or slurmctld's) to say
                    self.batcher.add("jobs", [record])
                log.info("job unregistered", job=record.job_id, state=record.state)
                return control.Reply(ok=True, job_id=record.job_id)
            return control.Reply(ok=True, node=self.node, instance=self.batcher.agent.instance,
                                 jobs=sorted(self.jobs.job_ids()), gpus=self.gpus(), spooled=self.spooled())
        except RegistrationError as exc:
            return control.Reply(ok=False, error=str(exc))

    def _first(self, nodes: list[str] | None) -> bool:
        """Whether this node is the job's first (Slurm's batch host), whose records carry the job-wide
        facts; another node sends only its own part (its GPUs of the job), which is all the
        collector takes from it under a node-bound token (`collector.ingest.authority`)."""
        return not nodes or nodes[0] == self.node

    def _register(self, req: control.Register) -> control.Reply:
        given = {k: v for k, v in msgspec.structs.asdict(req.job).items() if v is not None}  # unset: defaults
        record = self.jobs.register(given, req.sent)
        self.attributor.retry_unowned()
        self.batcher.add("jobs", [record if self._first(record.nodes) else wire.JobRecord(
            job_id=record.job_id, gpus=record.gpus, run=record.run)])
        self.on_register()
        gpus = [g.gpu_uuid for g in record.gpus]
        log.info("job registered", job=record.job_id, gpus=gpus)
        return control.Reply(ok=True, job_id=record.job_id, gpus=gpus)
