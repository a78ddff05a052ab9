"""The site policy on the real two-node Slurm cluster: a job that holds an idle GPU is warned, then
cancelled with its reason in the job's AdminComment; a job of an exempt partition is not; a hung job
whose rank exited (the others spinning at near-idle power) is warned at once and cancelled after its
warning, while a job whose ranks wait in a checkpoint barrier, all alive and one writing, is never
warned or cancelled; the report shows what was done."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .agents import Scenario
from .conftest import RunningCollector, start_collector, stop_collector
from .slurm_cluster import SlurmCluster, available
from .test_slurm import agent_pids, configure, query, running_cluster, wait_until

pytestmark = pytest.mark.skipif(available() is not None, reason=f"Slurm cluster: {available()}")
RULES = Path(__file__).parent / "data" / "rules_fast.toml"
# The hung job's GPUs work this long after their scenario starts (written just before the job is
# submitted), then spin. Its working level is the 5-min mean power of its busy samples, the spin's
# included: 10 s of work at 600 W keep it above twice the spin's 80 W until the job is cancelled, so
# an agent that starts 30 s late on a loaded machine still sees a job that worked, then hung.
WORK_S = 45


@pytest.fixture(scope="module")
def idle_cluster(fake_nvml: Path) -> Iterator[SlurmCluster]:
    with running_cluster(fake_nvml, SlurmCluster, sm=(0, 0)) as c:  # every GPU idle
        yield c


def job_state(c: SlurmCluster, job: str) -> dict[str, str]:
    """JobState and AdminComment as `scontrol show job` prints them."""
    out = subprocess.run(["scontrol", "show", "job", job], env=c.env, capture_output=True, text=True,
                         timeout=20, check=True).stdout
    return {k: m.group(1) for k in ("JobState", "AdminComment")
            if (m := re.search(rf"\b{k}=(.*?)(?=\s+[A-Z][A-Za-z]*=|\n|$)", out))}


def test_an_idle_job_is_warned_then_cancelled_and_an_exempt_one_is_not(idle_cluster: SlurmCluster, dsn: str,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    c = idle_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))  # the collector's host is a Slurm client of this cluster
    policy = tmp_path / "policy.toml"
    policy.write_text("""
[idle_gpu]
warn_after_minutes = 0.1
cancel_after_minutes = 0.2
action = "cancel"
cluster = "jpcluster"
exempt_partitions = ["debug"]
""")
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1",
                                "--policy", str(policy))
    try:
        configure(c, collector.url)
        out = f"--output={c.root}/out-%j.txt"
        idle = c.sbatch("-N1", "-w", "n1", "--gres=gpu:1", out, script="#!/bin/bash\nsleep 300\n")
        exempt = c.sbatch("-N1", "-w", "n2", "-p", "debug", "--gres=gpu:1", out, script="#!/bin/bash\nsleep 300\n")
        started = time.monotonic()
        done = c.wait_done(idle, timeout=150)
        took = time.monotonic() - started
        assert done["job_state"] == "CANCELLED", done
        comment = job_state(c, idle).get("AdminComment")
        assert isinstance(comment, str) and comment.startswith("jobpulse: cancelled,") and "idle for" in comment
        actions = query(dsn, "SELECT job_id, action FROM jobpulse.policy_actions ORDER BY at")
        assert [a for j, a in actions if j == idle] == ["warned", "cancelled"]
        wait_until(lambda: ("exempt",) in query(dsn, "SELECT action FROM jobpulse.policy_actions WHERE job_id = %s",
                                                exempt), 30, "the exempt job's audit row")
        assert job_state(c, exempt)["JobState"] == "RUNNING", "an exempt partition's job runs on"
        report = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", idle, "--dsn", dsn],
                                capture_output=True, text=True, timeout=60, check=True).stdout
        assert "Idle-GPU policy:" in report and "warned:" in report and "cancelled:" in report
        print(f"\nidle job cancelled {took:.0f} s after submission (warn after 6 s idle, cancel 12 s later)")
    finally:
        subprocess.run(["scancel", exempt], env=c.env, check=False)
        stop_collector(collector)


_RANK = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))  # the fake driver is told where this rank runs
begin, until, end = (float(x) for x in sys.argv[2:5])
while time.time() < end:
    if begin <= time.time() < until and len(sys.argv) > 5:  # the checkpoint: running, writing, GB/s
        with open(sys.argv[5], "wb") as f:
            while time.time() < until:
                stop = time.time() + 0.02
                while time.time() < stop:
                    f.write(b"x" * 65536); f.flush(); f.seek(0)
                time.sleep(0.005)
    time.sleep(0.2)
"""


def _two_ranks(c: SlurmCluster, dsn: str, tmp_path: Path, *, gpu1_from: dict[str, float],
               rank1: Callable[[float], str], rules_extra: dict[str, float], job_s: int,
               resume_at: float | None = None) -> tuple[str, float, RunningCollector]:
    """A 2-GPU job on n1 with a rank process on each GPU (the fake driver told which), both GPUs working
    at 600 W for WORK_S s; then GPU 0 spins (100 % duty cycle at 80 W, no traffic) and GPU 1 takes
    ``gpu1_from``, until both work again at ``resume_at`` (s) if given; ``rank1``: rank 1's arguments
    after its pid file, from the scenario's start epoch (when it writes, from and until, and when it
    ends, as epochs; then the file it writes). Returns the job, when it was submitted, and the
    collector."""
    scenario = c.root / "n1.scn"
    # The scenario's clock starts when it is written: the job must start at once, not at the scheduler's
    # next pass (up to a minute later) because n1 still completes an earlier test's job; a job that
    # started after most of the work phase would have no working power to judge the barrier by.
    wait_until(lambda: not c.run("squeue", "-h", "-w", "n1", "-o", "%i").stdout.strip()
               and c.run("sinfo", "-h", "-n", "n1", "-o", "%T").stdout.strip().startswith("idle"), 120, "n1 idle")
    agent_pids(c.root, "n1", kill=True)  # an agent left from an earlier job plays the scenario it read
    work = dict(sm=95, mem=40, power_mw=600_000, power_limit_mw=700_000, fb_total_mib=81_559, fb_used_mib=50_000,
                pcie_rx_kbs=90_000, pcie_tx_kbs=30_000)
    spin = dict(sm=100, mem=0, power_mw=80_000, pcie_rx_kbs=10, pcie_tx_kbs=10)
    rules = tmp_path / "rules.toml"
    # Two 10 s blocks of waiting make a hang or a stall; an idle or low GPU waits longer than that, as by
    # default (10 and 3 minutes against 3), so that the hang or the stall explains the waiting GPUs (one flag).
    settings = {"hang_minutes": 0.3, "idle_minutes": 1.0, "evidence_minutes": 0.5, **rules_extra}
    rules.write_text("".join(line + "\n" for line in RULES.read_text().splitlines()
                             if line.partition("=")[0].strip() not in settings)
                     + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    policy = tmp_path / "policy.toml"
    policy.write_text("""
[hung]
warn_after_minutes = 0
cancel_after_minutes = 0.1
action = "cancel"
cluster = "jpcluster"
partitions = ["gpu"]
""")
    collector = start_collector(dsn, tmp_path, "--rules", str(rules), "--rules-interval", "1",
                                "--policy", str(policy))
    configure(c, collector.url)
    pids = c.root / "pids"
    pids.mkdir(exist_ok=True)
    hanging = Scenario().add("driver 550.54.15")  # its time starts now, not before the collector did
    for i, bus in enumerate(("00000000:17:00.0", "00000000:65:00.0")):
        (pids / f"rank{i}").unlink(missing_ok=True)
        hanging.gpu(i, f"GPU-n1-{i}", bus, minor=i, **work).set(WORK_S, i, **(spin if i == 0 else gpu1_from))
        if resume_at is not None:
            hanging.set(resume_at, i, **work)
        hanging.add(f"procfile 0 {i} {pids}/rank{i} 50000 0 0")
    hanging.write(scenario)
    t0 = hanging.start
    rank = f"{sys.executable} -c '{_RANK}'"
    script = (f"#!/bin/bash\n{rank} {pids}/rank0 0 0 {t0 + job_s} &\n"
              f"{rank} {pids}/rank1 {rank1(t0)} &\nwait\n")
    return c.sbatch("-N1", "-w", "n1", "--gres=gpu:2", f"--output={c.root}/out-%j.txt", script=script), \
        time.monotonic(), collector


def test_a_job_whose_rank_exited_is_warned_at_once_then_cancelled(idle_cluster: SlurmCluster, dsn: str,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Both GPUs work at 600 W for 45 s; then rank 1 exits (its GPU idle, its memory released) and
    GPU 0 spins: a broken part, the strong form of the hang claim: the hung flag, its owner warned at
    once naming the exited rank, the job cancelled after its warning."""
    c = idle_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    before = (c.root / "n1.scn").read_text()
    gone = dict(sm=0, mem=0, power_mw=60_000, fb_used_mib=100, pcie_rx_kbs=10, pcie_tx_kbs=10)
    job, started, collector = _two_ranks(c, dsn, tmp_path, gpu1_from=gone, rank1=lambda t0: f"0 0 {t0 + WORK_S}",
                                         rules_extra={}, job_s=400)
    try:
        try:
            done = c.wait_done(job, timeout=240)
        except TimeoutError:
            print(query(dsn, "SELECT rule_id, started_at, ended_at, evidence FROM jobpulse.job_flags WHERE job_id = %s", job))
            print(query(dsn, "SELECT * FROM jobpulse.policy_actions WHERE job_id = %s", job))
            print(collector.log.read_text()[-3000:])
            raise
        took = time.monotonic() - started
        assert done["job_state"] == "CANCELLED", done
        comment = job_state(c, job).get("AdminComment")
        assert isinstance(comment, str) and comment.startswith("jobpulse: cancelled,") and "hung since" in comment
        actions = query(dsn, "SELECT action, reason FROM jobpulse.policy_actions WHERE job_id = %s AND policy = 'hung'"
                             " ORDER BY at", job)
        assert [a for a, _ in actions] == ["warned", "cancelled"], actions
        assert "acting on a broken part: " in actions[0][1] and "exited" in actions[0][1], actions
        flags = query(dsn, "SELECT rule_id, evidence->>'basis' FROM jobpulse.job_flags WHERE job_id = %s", job)
        assert ("hung", "broken part") in flags and not any(r == "idle_gpu" for r, _ in flags), flags
        report = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", job, "--dsn", dsn],
                                capture_output=True, text=True, timeout=60, check=True).stdout
        assert "Hung-job policy:" in report and "warned:" in report and "cancelled:" in report
        print(f"\njob whose rank exited cancelled {took:.0f} s after submission (work {WORK_S} s, then rank 1 exits)")
    finally:
        subprocess.run(["scancel", job], env=c.env, check=False)
        stop_collector(collector)
        (c.root / "n1.scn").write_text(before)


def test_a_checkpoint_barrier_job_is_never_warned_nor_cancelled(idle_cluster: SlurmCluster, dsn: str,
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Both GPUs work for 45 s; then for 50 s rank 1 writes its checkpoint (its process running and
    writing, its GPU quiet with its memory held) while GPU 0 spins in the barrier; then both work
    again and the job ends by itself. Every rank alive and shorter than the collective timeout (1.2
    min here): the stalled note names the writer; the hang policy neither warns nor cancels."""
    c = idle_cluster
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    before = (c.root / "n1.scn").read_text()
    barrier = 50
    quiet = dict(sm=3, mem=0, power_mw=70_000, pcie_rx_kbs=10, pcie_tx_kbs=10)
    ckpt = c.root / "ckpt.bin"
    job, _, collector = _two_ranks(
        c, dsn, tmp_path, gpu1_from=quiet, resume_at=WORK_S + barrier,
        rank1=lambda t0: f"{t0 + WORK_S} {t0 + WORK_S + barrier} {t0 + WORK_S + barrier + 40} {ckpt}",
        rules_extra={"hang_timeout_minutes": 1.2}, job_s=WORK_S + barrier + 40)
    try:
        done = c.wait_done(job, timeout=300)
        assert done["job_state"] == "COMPLETED", done
        wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.job_flags WHERE job_id = %s AND ended_at IS NOT NULL",
                                 job)[0][0] >= 1, 60, "the job's flags closed at its end")
        flags = query(dsn, "SELECT rule_id, evidence FROM jobpulse.job_flags WHERE job_id = %s", job)
        assert [r for r, _ in flags] == ["stalled"], flags
        writers = [w["pid"] for w in flags[0][1]["working_ranks"]]
        assert writers == [int((c.root / "pids" / "rank1").read_text())], flags
        assert query(dsn, "SELECT action FROM jobpulse.policy_actions WHERE job_id = %s", job) == []
        assert not (job_state(c, job).get("AdminComment") or "").startswith("jobpulse")
    finally:
        subprocess.run(["scancel", job], env=c.env, check=False)
        stop_collector(collector)
        (c.root / "n1.scn").write_text(before)
