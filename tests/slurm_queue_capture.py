"""Record what waits in each partition, as a real Slurm says it, for the queue reader's unit tests:
`python -m tests.slurm_queue_capture VERSION tests/data/slurm` (as root; 24.11 and 26.05 from the
chroots `make chroots` builds, with ``MetricsType=metrics/openmetrics`` where the version has it)."""

from __future__ import annotations

import sys
import tempfile
import urllib.request
from pathlib import Path

from .agents import build_fake_nvml
from .slurm_cluster import ChrootCluster, SlurmCluster
from .test_slurm import running_cluster, wait_until

HOLD_S = "#!/bin/bash\nsleep 120\n"


class MetricsCluster(ChrootCluster):
    """The chroot cluster with slurmctld's OpenMetrics on its port (Slurm 25.11 and later)."""

    def write_config(self) -> None:
        super().write_config()
        self.conf.write_text(self.conf.read_text() + "MetricsType=metrics/openmetrics\n")

    def metrics(self, path: str = "/metrics/partitions") -> str:
        port = next(line.split("=", 1)[1] for line in self.conf.read_text().splitlines()
                    if line.startswith("SlurmctldPort="))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return str(answer.read().decode())


def submit_queue(c: SlurmCluster) -> list[str]:
    """Two jobs holding GPUs (both of n1's, one of n2's), then jobs waiting for 2 GPUs, 2 per node on
    two nodes, 3 (``--gpus``) over two nodes, 1 in ``-p debug,gpu``, none in debug, and a held one;
    returns when every one is placed or pending with a reason."""
    out = f"--output={c.root}/out-%j.txt"
    jobs = [c.sbatch("-N1", "-w", "n1", "--gres=gpu:2", out, script=HOLD_S),
            c.sbatch("-N1", "-w", "n2", "--gres=gpu:1", out, script=HOLD_S),
            c.sbatch("-N1", "--gres=gpu:2", out, script=HOLD_S),
            c.sbatch("-N2", "--gpus-per-node=2", out, script=HOLD_S),
            c.sbatch("-N2", "--gpus=3", out, script=HOLD_S),
            c.sbatch("-N1", "-H", "--gres=gpu:1", out, script=HOLD_S),
            c.sbatch("-N1", "-p", "debug,gpu", "--gres=gpu:1", out, script=HOLD_S),
            c.sbatch("-N1", "-p", "debug", "-w", "n1", out, script=HOLD_S)]

    def settled() -> bool:
        lines = c.run("squeue", "-h", "-o", "%i %T %r").stdout.split("\n")
        states = dict(line.split(" ", 1) for line in lines if line.strip())
        return len(states) == len(jobs) and all(s.startswith("RUNNING") or (s.startswith("PENDING") and "None" not in s)
                                                for s in states.values())

    wait_until(settled, 60, "the jobs to be placed or pending with a reason")
    return jobs


def main(version: str, where: Path) -> None:
    fake = build_fake_nvml(Path(tempfile.mkdtemp()))
    kind = SlurmCluster if version == SlurmCluster.version else (lambda *p: MetricsCluster(*p, version=version))
    with running_cluster(fake, kind) as c:  # type: ignore[arg-type]
        jobs = submit_queue(c)
        (where / f"squeue-queue-{version}.json").write_text(c.run("squeue", "--json").stdout)
        (where / f"scontrol-config-{version}.txt").write_text(c.run("scontrol", "show", "config").stdout)
        if isinstance(c, MetricsCluster):
            (where / f"openmetrics-partitions-{version}.txt").write_text(c.metrics())
        for job in jobs:
            c.run("scancel", job)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
