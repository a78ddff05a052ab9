"""What waits in each partition, read from real output (`tests/data/slurm/`): slurmctld 26.05's
OpenMetrics (/metrics/partitions), squeue --json of 22.05 and 26.05 with the same jobs waiting
(two hold GPUs; five wait for 2, 4 (two nodes), 3 (--gpus per job) and 1 GPU (one of them in
`debug,gpu`), one held, one for CPUs only in debug), and `scontrol show config`."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from jobpulse.agent.slurm import dialect, queue
from jobpulse.schema import wire

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
TS = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)


def jobs(version: str) -> list[dialect.Job]:
    return dialect.squeue_jobs(json.loads((DATA / f"squeue-queue-{version}.json").read_text()))


@pytest.mark.parametrize("version", ["22.05", "26.05"])
def test_squeue_says_what_each_waiting_job_asks(version: str) -> None:
    asked = {j.job_id: (j.state, j.held, queue.gpus_asked(j)) for j in jobs(version)}
    assert asked == {"1": ("RUNNING", False, 2), "2": ("RUNNING", False, 1), "3": ("PENDING", False, 2),
                     "4": ("PENDING", False, 4), "5": ("PENDING", False, 3), "6": ("PENDING", True, 1),
                     "7": ("PENDING", False, 1), "8": ("PENDING", False, 0)}
    # the held job waits for a person, not a GPU; `-p debug,gpu` waits in both
    assert queue.from_squeue(jobs(version)) == {"gpu": (4, 4, 10), "debug": (2, 1, 1)}


def test_openmetrics_counts_the_controllers_waiting_jobs() -> None:
    text = (DATA / "openmetrics-partitions-26.05.txt").read_text()
    # pending less held; 26.05 counts the job of `-p debug,gpu` in gpu only
    assert queue.waiting_per_partition(text) == {"gpu": 4, "debug": 1}
    gpus = [v for name, labels, v in queue.samples(text) if name == "slurm_partition_jobs_gpus_alloc"]
    assert gpus == [0, 0], "26.05 reads no GPU allocated (3 are): the GPUs asked must come from squeue"


def test_a_reading_per_partition_from_either_source() -> None:
    squeue = queue.from_squeue(jobs("26.05"))
    om = queue.waiting_per_partition((DATA / "openmetrics-partitions-26.05.txt").read_text())
    got = queue.readings(squeue, om, TS, known={"old"})
    assert [(r.partition, r.jobs_pending, r.gpu_jobs_pending, r.gpus_pending, r.source) for r in got] == [
        ("debug", 1, 1, 1, "openmetrics"), ("gpu", 4, 4, 10, "openmetrics"), ("old", 0, 0, 0, "openmetrics")]
    plain = queue.readings(squeue, None, TS)
    assert [(r.partition, r.jobs_pending, r.source) for r in plain] == [("debug", 2, "squeue"), ("gpu", 4, "squeue")]
    for r in got:  # what the sync sends validates on the wire
        msgspec.json.decode(msgspec.json.encode(r), type=wire.PartitionQueue)


def test_the_endpoint_from_scontrol_show_config() -> None:
    assert queue.metrics_url((DATA / "scontrol-config-26.05.txt").read_text()) == \
        "http://127.0.0.1:50467/metrics/partitions"
    assert queue.metrics_url((DATA / "scontrol-config-22.05.txt").read_text()) is None  # no MetricsType before 25.11
    assert queue.metrics_url("MetricsType = metrics/openmetrics\nSlurmctldHost[0] = ctl1\nSlurmctldPort = 6817-6818\n") \
        == "http://ctl1:6817/metrics/partitions"


@pytest.mark.parametrize("tres, gpus", [("gres/gpu:a100:2", 2), ("gres/gpu", 1), ("gres:gpu:2", 2),
                                         ("gres:gpu:a100:3", 3), ("gres/gpu:2,gres/shard:4", 2), ("gres/shard:1", 0),
                                         ("", 0), (None, 0)])
def test_gpus_in_each_form_of_tres(tres: str | None, gpus: int) -> None:
    assert queue._gpus(tres) == gpus


def test_text_that_is_not_slurmctlds_partition_metrics_is_refused() -> None:
    with pytest.raises(ValueError, match="no slurm_partition_jobs_pending"):
        queue.waiting_per_partition("# HELP x\nslurm_jobs_pending 3\n")
    with pytest.raises(ValueError, match="not an OpenMetrics sample line"):
        queue.waiting_per_partition("<html>PrivateData is set</html>\n")
    with pytest.raises(ValueError, match="is not a number"):
        queue.waiting_per_partition('slurm_partition_jobs_pending{partition="gpu"} lots\n')
