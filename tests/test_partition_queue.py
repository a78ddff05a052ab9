"""What waits in each partition, through the real collector: only the controller's token (or one not
bound to nodes) may say it; it is stored as sent and the latest fresh reading per partition is
`partition_queue_now`; a policy set to act only while others wait reads it."""

from __future__ import annotations

from datetime import timedelta

import psycopg

from jobpulse.collector.notify.policy import Policy, decide
from jobpulse.collector.store.read import queue_reads
from jobpulse.schema import wire

from .batches import AGENT, now
from .conftest import RunningCollector
from .test_authority import CTL, N1, batch, bind_tokens, post

CTL_AGENT = wire.AgentInfo(instance="sync-1", node="ctl", cluster="testcluster", version="0.1.0",
                           started_at=AGENT.started_at)


def reading(ago_s: float, jobs: int, gpus: int, partition: str = "gpu") -> wire.PartitionQueue:
    return wire.PartitionQueue(ts=now() - timedelta(seconds=ago_s), partition=partition, jobs_pending=jobs + 1,
                               gpu_jobs_pending=jobs, gpus_pending=gpus, source="squeue")


def test_only_the_controller_says_what_waits_and_the_latest_fresh_reading_counts(collector: RunningCollector,
                                                                                dsn: str) -> None:
    bind_tokens(collector)
    refused = post(collector, batch(AGENT, 0, queue=[reading(5, 9, 99)]), N1)
    assert refused.status_code == 403 and "controller" in refused.text, refused.text
    readings = [reading(900, 5, 50), reading(60, 2, 4), reading(30, 1, 2), reading(20, 0, 0, "debug")]
    assert post(collector, batch(CTL_AGENT, 0, queue=readings), CTL).status_code == 200
    with psycopg.connect(dsn) as conn:
        stored = conn.execute("SELECT node, partition, gpu_jobs_pending, gpus_pending FROM jobpulse.partition_queue"
                              " ORDER BY ts").fetchall()
        assert stored == [("ctl", "gpu", 5, 50), ("ctl", "gpu", 2, 4), ("ctl", "gpu", 1, 2), ("ctl", "debug", 0, 0)]
        gpu = queue_reads.waiting(conn, "testcluster", "gpu")
        assert gpu is not None and (gpu["gpu_jobs_pending"], gpu["gpus_pending"], gpu["jobs_pending"]) == (1, 2, 2)
        debug = queue_reads.waiting(conn, "testcluster", "debug")
        assert queue_reads.waiting(conn, "testcluster", "other") is None
    # the decisions a policy that acts only while others wait takes on them
    p = Policy(warn_after_minutes=1, only_while_queued=True)
    idle = {"started_at": now() - timedelta(minutes=5), "scope_key": "n1/GPU-0", "hardware": False, "partition": "gpu",
            "account": "ml", "user_name": "ann", "tags": {}}
    warned = decide(p, {**idle, "queue": gpu}, {}, now())
    assert warned is not None and warned[0] == "warned" and "while 1 job waits for 2 GPUs in partition gpu" in warned[1]
    held = decide(p, {**idle, "partition": "debug", "queue": debug}, {}, now())
    assert held is not None and held[0] == "unqueued" and "no job waits for GPUs in partition debug" in held[1]
