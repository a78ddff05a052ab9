"""Authority follows origin: what a node-bound token's batch may write about jobs.

A node writes samples, events and its own part of a job record (its GPUs of the job) only for jobs
Slurm placed on it: a job whose node list the collector holds (from the job's own registration or
slurm-sync) must name the node. The job-wide facts of a record (user, uid, account, partition,
name, tags, times, state, exit code, node list, GPU total, ...) come only from the job's first node
(the batch host, first in Slurm's node list, whose prolog registers the job and whose epilog ends
it) or from the controller (a ``role=controller`` token: slurm-sync). Before any node list is known
(the job's own registration has not arrived), a node's claim is taken as it is: the window in
which a stolen token can still write for a job not yet registered, closed by the job's own record.
What waits in each partition (``queue``, slurm-sync's) comes only from a token not bound to nodes
or the controller's.

A refused part refuses the whole batch (403 naming the job and why): nothing of it is stored. A
non-first node's node list is dropped from its record (it is the job's own fact), never stored.

Cheap on the hot path: a batch without job records checks its job ids against the jobs each node
was last seen to hold (``Placements``), and reads the store only for job ids it has not seen there;
tokens that are not node-bound (one token shared by every node, or the controller's) skip it all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

import msgspec

from jobpulse.collector.errors import Rejected
from jobpulse.collector.ingest.auth import Grant
from jobpulse.schema import wire

NODE_PART = frozenset({"job_id", "gpus", "nodes", "run"})
"""What a job record may carry from a node that is not the job's first: its own GPUs of the job, the
run they are of, and the node list it was handed (dropped: the job's own record sets it)."""
JOB_WIDE = tuple(f for f in wire.JobRecord.__struct_fields__ if f not in NODE_PART)
_BARE = wire.JobRecord(job_id="0")  # every field unset
KEPT_PER_NODE = 256  # jobs remembered per node: more than a node runs at once


def _rows_jobs(batch: wire.Batch) -> set[str]:
    """Every job id a row of the batch (samples, events) is stamped with."""
    return {r.job_id for attr in wire.TIME_SERIES for r in getattr(batch, attr) if getattr(r, "job_id", None)}


def _job_wide(record: wire.JobRecord) -> list[str]:
    return [f for f in JOB_WIDE if getattr(record, f) != getattr(_BARE, f)]


class Placements:
    """The jobs each (cluster, node) is known to hold: a job whose stored node list names the node
    (a node list only ever comes from the job's own record or the controller). Only a batch with a
    job id its node was not seen to hold reads the store."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], dict[str, None]] = {}

    def unseen(self, cluster: str, node: str, jobs: set[str]) -> set[str]:
        held = self._held.get((cluster, node))
        return set(jobs) if held is None else {j for j in jobs if j not in held}

    def add(self, cluster: str, node: str, jobs: set[str]) -> None:
        held = self._held.setdefault((cluster, node), {})
        held.update(dict.fromkeys(jobs))
        while len(held) > KEPT_PER_NODE:
            del held[next(iter(held))]


class Known(NamedTuple):
    """What the store holds of a job, as the authority reads it."""

    nodes: list[str] | None  # the job's node list (from its own record or the controller); None: not yet
    run: int | None  # the run that list is of (Slurm's restart count)
    ended: bool  # that run ended (an end time is stored)
    gpus_here: bool  # the asking node holds GPUs of the job (its own part, accepted before)


JobsKnown = Callable[[str, str, list[str]], Awaitable[dict[str, Known]]]
"""The store's read: cluster, node, job ids -> what is known of each stored job."""


class Authority:
    def __init__(self, known: JobsKnown) -> None:
        self.known = known
        self.placements = Placements()

    async def check(self, grant: Grant, batch: wire.Batch) -> wire.Batch:
        """The batch as it may be stored (non-first nodes' node lists dropped), or `Rejected` (403)."""
        if batch.queue and grant.node_bound:
            raise Rejected(403, "what waits in a partition is the controller's to say: slurm-sync's token "
                                "(role=controller), not node " + repr(batch.agent.node), "$.queue")
        if not grant.node_bound:
            return batch
        cluster, node = batch.agent.cluster, batch.agent.node
        rows = self.placements.unseen(cluster, node, _rows_jobs(batch))
        asked = rows | {r.job_id for r in batch.jobs}
        if not asked:
            return batch
        stored = await self.known(cluster, node, sorted(asked))
        self.placements.add(cluster, node, {j for j, k in stored.items() if k.nodes and node in k.nodes})
        allowed: set[str] = set()  # jobs this batch's own accepted records place here
        records = list(batch.jobs)
        for i, record in enumerate(records):
            k = stored.get(record.job_id)
            # A later run of an ended job (Slurm requeued it): the stored list is an earlier run's.
            nodes = None if k is None or (k.ended and record.run is not None and (k.run or 0) < record.run) else k.nodes
            first = nodes[0] if nodes else record.nodes[0] if record.nodes else node
            if nodes and node not in nodes:
                raise Rejected(403, f"job {record.job_id} does not run on node {node!r} (its nodes: "
                                    f"{', '.join(nodes[:8])}{', ...' if len(nodes) > 8 else ''})", f"$.jobs[{i}]")
            if node != first:
                if wide := _job_wide(record):
                    raise Rejected(403, f"job {record.job_id}: {', '.join(wide)} are the job's own facts, written by"
                                        f" its first node {first!r} or the controller, not by node {node!r}",
                                   f"$.jobs[{i}]")
                records[i] = msgspec.structs.replace(record, nodes=None)
            allowed.add(record.job_id)
        for job in sorted(rows - allowed):
            k = stored.get(job)
            if k and k.nodes and node not in k.nodes and not k.gpus_here:
                raise Rejected(403, f"job {job} does not run on node {node!r}: this node's samples and events"
                                    " may not name it", "$.job_id")
        return batch if records == batch.jobs else msgspec.structs.replace(batch, jobs=records)
