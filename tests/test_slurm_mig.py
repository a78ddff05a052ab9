"""MIG slices as Slurm GRES on the real two-node cluster (Slurm 22.05, AutoDetect off): gres.conf
declares n1's MIG GPU's slices as typed GRES, each a `MultipleFiles=` line of the GPU's device and
its GPU/compute instance capabilities, as sites configure MIG by hand; jobs ask for a slice by its
profile. Slurm hands the prolog only GRES indices, and the prolog maps them through gres.conf and
the driver's MIG minors table (here a file in its format, beside the fake NVML's instances) to the
NVML instance: the job's samples and processes are its slice's, never the parent's or a neighbour's."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .agents import Scenario
from .conftest import RunningCollector
from .slurm_cluster import SlurmCluster, available
from .test_slurm import agent_pids, configure, query, running_cluster, wait_until

pytestmark = pytest.mark.skipif(available() is not None, reason=f"Slurm cluster: {available()}")

CAPS_MAJOR = 237  # the driver's nvidia-caps major is dynamic; slurmd only checks for a character device
# n1's GPU GRES in gres.conf order (= Slurm's GRES index): the whole GPU 1 first, so an index is not
# a minor; then GPU 0's slices, one listing only its GPU instance's capability (as some sites do).
SLICES = {"gi3": ("2g.20gb", 3, True), "gi9": ("1g.10gb", 9, True), "gi10": ("1g.10gb", 10, False)}
GRES_ORDER = ["gpu1", "gi3", "gi9", "gi10"]
UUID = {"gpu1": "GPU-n1-1", "gi3": "MIG-n1-0-gi3", "gi9": "MIG-n1-0-gi9", "gi10": "MIG-n1-0-gi10"}


def cap_minor(gpu: int, gi: int, ci: int | None = None) -> int:
    """A MIG capability's minor in this test's table (the driver's format, ``name minor`` lines;
    the numbering is the test's: config 1, monitor 2, then per GPU 15 GPU instances, each its own
    access and eight compute instances')."""
    base = 3 + gpu * 135 + gi * 9
    return base if ci is None else base + 1 + ci


class MigCluster(SlurmCluster):
    """n1's GPU 0 in MIG mode, its slices declared as typed GRES in gres.conf; n2 as before."""

    def write_config(self) -> None:
        super().write_config()
        caps = self.root / "dev" / "nvidia-caps"
        caps.mkdir(exist_ok=True)
        table = ["config 1", "monitor 2"]
        for gpu in (0, 1):
            for gi in range(15):
                table.append(f"gpu{gpu}/gi{gi}/access {cap_minor(gpu, gi)}")
                table += [f"gpu{gpu}/gi{gi}/ci{ci}/access {cap_minor(gpu, gi, ci)}" for ci in range(8)]
        (self.root / "mig-minors").write_text("\n".join(table) + "\n")
        lines = ["AutoDetect=off", f"NodeName=n1 Name=gpu Type=a100 File={self.root}/dev/nvidia1"]
        for name in GRES_ORDER[1:]:
            profile, gi, with_ci = SLICES[name]
            files = [f"{self.root}/dev/nvidia0"]
            for minor in (cap_minor(0, gi), *((cap_minor(0, gi, 0),) if with_ci else ())):
                dev = caps / f"nvidia-cap{minor}"
                if not dev.exists():
                    os.mknod(dev, 0o666 | 0o020000, os.makedev(CAPS_MAJOR, minor))
                files.append(str(dev))
            lines.append(f"NodeName=n1 Name=gpu Type={profile} MultipleFiles={','.join(files)}")
        lines.append(f"NodeName=n2 Name=gpu File={self.root}/dev/nvidia[0-1]")
        (self.conf.parent / "gres.conf").write_text("\n".join(lines) + "\n")
        conf = re.sub(r"^(NodeName=n1 .*)Gres=gpu:\d+$", r"\1Gres=gpu:a100:1,gpu:2g.20gb:1,gpu:1g.10gb:2",
                      self.conf.read_text(), flags=re.M)
        self.conf.write_text(conf)


class MpsCluster(SlurmCluster):
    """Every GPU shared by MPS too: 100 mps GRES each (a MIG node beside it, in the same cluster,
    got no typed GPU allocated in Slurm 22.05: `GRES=gpu:1g.10gb:0(IDX:)`)."""

    def write_config(self) -> None:
        super().write_config()
        with (self.conf.parent / "gres.conf").open("a") as f:
            f.write(f"Name=mps Count=200 File={self.root}/dev/nvidia[0-1]\n")
        conf = re.sub(r"^(NodeName=.*Gres=gpu:\d+)$", r"\1,mps:200", self.conf.read_text(), flags=re.M)
        self.conf.write_text(conf.replace("GresTypes=gpu", "GresTypes=gpu,mps"))


@pytest.fixture(scope="module")
def mig_cluster(fake_nvml: Path) -> Iterator[SlurmCluster]:
    with running_cluster(fake_nvml, MigCluster) as c:
        slice_values = dict(fb_used_mib=3000)
        scenario = (Scenario().add("driver 550.54.15")
                    .gpu(0, "GPU-n1-0", "00000000:17:00.0", minor=0, name="NVIDIA A100-SXM4-80GB", power_mw=250_000,
                         fb_total_mib=81_920, fb_used_mib=12_000)
                    .mig(0, 100, 0, UUID["gi3"], gi=3, profile="2g.20gb", fb_total_mib=19_968, **slice_values)
                    .mig(0, 101, 1, UUID["gi9"], gi=9, profile="1g.10gb", fb_total_mib=9_856, **slice_values)
                    .mig(0, 102, 2, UUID["gi10"], gi=10, profile="1g.10gb", fb_total_mib=9_856, **slice_values)
                    .gpu(1, UUID["gpu1"], "00000000:65:00.0", minor=1, name="NVIDIA A100-SXM4-80GB", sm=40, mem=10,
                         power_mw=200_000, fb_total_mib=81_920, fb_used_mib=5000))
        (c.root / "pids").mkdir()
        for name, where in (("gi3", 100), ("gi9", 101), ("gi10", 102), ("gpu1", 1)):
            # What the driver would know: which process runs on which slice (the test tells the fake below).
            scenario.add(f"procfile 0 {where} {c.root}/pids/{name} 2000 0 0")
        scenario.write(c.root / "n1.scn")
        yield c


def gres_index(c: SlurmCluster, job: str) -> int:
    """The GRES index slurmctld gave the job on n1 (`scontrol show job -d`: ``gpu:1g.10gb:1(IDX:2)``)."""
    out = subprocess.run(["scontrol", "show", "job", "-d", job], env=c.env, capture_output=True, text=True,
                         check=True, timeout=20).stdout
    found = re.findall(r"GRES=gpu[^ ]*\(IDX:(\d+)\)", out)
    assert len(found) == 1, out
    return int(found[0])


def test_a_job_asking_for_a_mig_slice_gets_that_slice(mig_cluster: SlurmCluster, collector: RunningCollector,
                                                      dsn: str) -> None:
    c = mig_cluster
    configure(c, collector.url)
    script = (f"#!/bin/bash\necho $$ > {c.root}/pids/job-$SLURM_JOB_ID\n"
              f"echo \"$SLURM_JOB_GPUS $CUDA_VISIBLE_DEVICES\" > {c.root}/env-$SLURM_JOB_ID\n"
              f"while [ ! -e {c.root}/done ]; do sleep 0.2; done\n")
    asks = ["1g.10gb", "1g.10gb", "2g.20gb", "a100"]
    jobs = [c.sbatch("-N1", "-w", "n1", "-n1", f"--gres=gpu:{gres}:1", f"--output={c.root}/out-%j.txt",
                     script=script) for gres in asks]
    given = {}
    try:
        for job in jobs:
            pid_file = c.root / "pids" / f"job-{job}"  # the job's shell writes it: it may exist, empty, a moment
            wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, f"job {job} to run")
            given[job] = GRES_ORDER[gres_index(c, job)]  # the test's own knowledge of its gres.conf
            # The fake is told where the job runs, as the driver would know it.
            (c.root / "pids" / given[job]).write_text(pid_file.read_text())
        seen = {job: 0 for job in jobs}

        def every_job_seen() -> bool:
            seen.update({job: query(dsn, "SELECT count(*) FROM jobpulse.process_samples WHERE job_id = %s"
                                         " AND gpu_uuid IS NOT NULL", job)[0][0] for job in jobs})
            return min(seen.values()) >= 3
        try:
            wait_until(every_job_seen, 120, "every job's process on its GPU")
        except AssertionError:  # say why: which job, and what n1's hooks and agent said
            logs = c.root / "jp" / "n1" / "log"
            said = {f.name: f.read_text()[-3000:] for f in sorted(logs.glob("*.log"))} if logs.is_dir() else {}
            raise AssertionError(f"process samples per job {seen}, given {given}; n1's logs: {said}") from None
    finally:
        (c.root / "done").touch()
    for job in jobs:
        c.wait_done(job)
    wait_until(lambda: not agent_pids(c.root, "n1"), 30, "the agent on n1 to exit")

    assert sorted(given.values()) == sorted(GRES_ORDER)  # Slurm gave each job another GRES
    assert [SLICES.get(given[j], ("a100",))[0] for j in jobs] == asks  # of the profile it asked for
    for job in jobs:
        # What Slurm says: a GRES index, never a MIG name (22.05's gres.conf has no UniqueId).
        slurm_gpus, visible = (c.root / f"env-{job}").read_text().split()
        assert slurm_gpus == str(GRES_ORDER.index(given[job])) and not visible.startswith("MIG-")
    owner = dict(query(dsn, "SELECT gpu_uuid, array_agg(DISTINCT job_id) FROM jobpulse.job_gpus"
                            " WHERE job_id = ANY(%s) GROUP BY 1", jobs))
    assert owner == {UUID[given[j]]: [j] for j in jobs}
    for job in jobs:
        samples = dict(query(dsn, "SELECT gpu_uuid, count(*) FROM jobpulse.gpu_samples WHERE job_id = %s GROUP BY 1",
                             job))
        assert set(samples) == {UUID[given[job]]} and samples[UUID[given[job]]] > 0  # its slice only
        pid = int((c.root / "pids" / f"job-{job}").read_text())
        assert query(dsn, "SELECT DISTINCT gpu_uuid FROM jobpulse.process_samples WHERE job_id = %s AND pid = %s"
                          " AND gpu_uuid IS NOT NULL", job, pid) == [(UUID[given[job]],)]
    # The parent GPU is no job's: its work is its slices'.
    assert query(dsn, "SELECT count(*) FROM jobpulse.gpu_samples WHERE gpu_uuid = 'GPU-n1-0'"
                      " AND job_id IS NOT NULL")[0][0] == 0


def test_an_mps_job_holds_its_share_of_a_gpu(fake_nvml: Path, collector: RunningCollector, dsn: str) -> None:
    """Slurm 22.05 gives an MPS job's prolog its mps GRES index and its share of the GPU
    (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): the job holds that share of the GPU, beside other jobs."""
    with running_cluster(fake_nvml, MpsCluster) as c:
        configure(c, collector.url)
        jobs = [c.sbatch("-N1", "-w", "n2", "-n1", f"--gres=mps:{n}", f"--output={c.root}/out-%j.txt",
                         script="#!/bin/bash\nsleep 2\n") for n in (25, 50)]
        for job in jobs:
            c.wait_done(job)
        wait_until(lambda: not agent_pids(c.root, "n2"), 30, "the agent on n2 to exit")
    held = query(dsn, "SELECT job_id, gpu_uuid, share FROM jobpulse.job_gpus WHERE node = 'n2' AND job_id = ANY(%s)"
                      " ORDER BY 1", jobs)
    assert held == [(jobs[0], "GPU-n2-0", 0.25), (jobs[1], "GPU-n2-0", 0.5)]  # both on GPU 0, sharing it
