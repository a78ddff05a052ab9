"""A job's end, summarized once its rules are final: at most 25 lines and JSON with GPU-hours held,
used and wasted by cause, each flag with its advice and #SBATCH lines; kept when the job's own rows
are gone; served to the mail wrapper by the collector's job endpoint and by `jobpulse summary`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from jobpulse.agent.slurm.sync import script_hash
from jobpulse.schema import wire

from .conftest import RunningCollector

MINUTES = 25
FAST = Path(__file__).parent / "data" / "rules_fast.toml"


def jobpulse(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def seed(c: RunningCollector, job_id: str, ended: datetime) -> None:
    """Two GPUs for 25 minutes ending at ``ended``: GPU-a trains, GPU-b stops after 2 minutes."""
    start = ended - timedelta(minutes=MINUTES)
    agent = wire.AgentInfo(instance=f"sum-{job_id}", node="n1", cluster="sum", version="0.1.0", started_at=start)
    record = wire.JobRecord(job_id=job_id, user_name="ann", account="ml", partition="gpu", job_name="train\r\nBcc: x",
                            gpus_total=2, start_time=start, state="RUNNING",
                            gpus=[wire.JobGpu("GPU-a", 0), wire.JobGpu("GPU-b", 1)])
    end = wire.JobRecord(job_id=job_id, end_time=ended, state="COMPLETED", exit_code=0)
    with c.client() as http:
        for minute in range(MINUTES):
            samples = [wire.GpuSample(ts=start + timedelta(minutes=minute, seconds=s), gpu_uuid=uuid, gpu_index=i,
                                      job_id=job_id, sm_util=90 if busy else 0, fb_used_mib=30_000,
                                      fb_total_mib=81_559, power_w=400.0 if busy else 60.0)
                       for s in range(0, 60, 2)
                       for i, (uuid, busy) in enumerate((("GPU-a", True), ("GPU-b", minute < 2)))]
            jobs = [record] if minute == 0 else [end] if minute == MINUTES - 1 else []
            batch = wire.Batch(version=1, agent=agent, seq=minute, created_at=start + timedelta(minutes=minute + 1),
                               gpu_samples=samples, jobs=jobs)
            r = http.post("/v1/batches", content=wire.encode(batch))
            assert r.status_code == 200, r.text


def test_an_ended_job_is_summarized_once_and_the_summary_outlives_the_job(collector: RunningCollector,
                                                                          dsn: str) -> None:
    seed(collector, "6101", datetime.now(UTC) - timedelta(seconds=5))
    out = jobpulse("rules", "evaluate", "--dsn", dsn)  # the job's final cycle, then its summary
    assert out.returncode == 0 and "1 job summaries written" in out.stdout, out.stdout + out.stderr
    again = jobpulse("rules", "evaluate", "--dsn", dsn)
    assert "0 job summaries written" in again.stdout, "written once"

    text = jobpulse("summary", "6101", "--dsn", dsn)
    assert text.returncode == 0, text.stderr
    print("\n" + text.stdout)
    lines = text.stdout.strip().splitlines()
    assert len(lines) <= 25
    assert lines[0].startswith("jobpulse: job 6101 (sum) train Bcc: x, COMPLETED after 25m00s on 2 GPUs (n1)")
    assert re.search(r"GPU-hours: 0\.83 held, 0\.(39|40) used \(4\d%\); wasted: idle 0\.[34]\d", text.stdout)
    assert re.search(r"n1/GPU1: [78]% busy", text.stdout) and "idle_gpu (n1/GPU1): n1/GPU1 has been idle" in text.stdout
    assert "#SBATCH --time=00:45:00" in text.stdout

    summary = json.loads(jobpulse("summary", "6101", "--dsn", dsn, "--format", "json").stdout)
    assert summary["gpu_hours"]["wasted"]["idle"] > 0.3 and summary["flags"][0]["rule"] == "idle_gpu"
    with collector.client() as http:
        served = http.get("/v1/jobs/6101").json()["summary"]
    assert served["text"] == text.stdout.rstrip("\n")

    with psycopg.connect(dsn) as conn:  # the job's rows go (retention): its summary stays
        conn.execute("DELETE FROM jobpulse.jobs WHERE job_id = '6101'")
    assert jobpulse("summary", "6101", "--dsn", dsn).stdout == text.stdout
    missing = jobpulse("summary", "6199", "--dsn", dsn)
    assert missing.returncode == 1 and "no summary of job '6199'" in missing.stderr


def run(c: RunningCollector, job_id: str, start: datetime, seconds: int, gpus: dict[str, bool],
        time_limit_s: int | None = None) -> None:
    """A short job of the same work as `seed`'s (user ann, same name), one batch: each GPU busy or never."""
    agent = wire.AgentInfo(instance=f"run-{job_id}", node="n1", cluster="sum", version="0.1.0", started_at=start)
    record = wire.JobRecord(job_id=job_id, user_name="ann", account="ml", partition="gpu", job_name="train",
                            gpus_total=len(gpus), start_time=start, state="RUNNING", time_limit_s=time_limit_s,
                            gpus=[wire.JobGpu(uuid, i) for i, uuid in enumerate(gpus)])
    end = wire.JobRecord(job_id=job_id, end_time=start + timedelta(seconds=seconds), state="COMPLETED", exit_code=0)
    samples = [wire.GpuSample(ts=start + timedelta(seconds=t), gpu_uuid=uuid, gpu_index=i, job_id=job_id,
                              sm_util=90 if busy else 0, fb_used_mib=30_000 if busy else 0, fb_total_mib=81_559,
                              power_w=400.0 if busy else 60.0)
               for t in range(seconds) for i, (uuid, busy) in enumerate(gpus.items())]
    batch = wire.Batch(version=1, agent=agent, seq=0, created_at=start + timedelta(seconds=seconds),
                       gpu_samples=samples, jobs=[record, end])
    with c.client() as http:
        assert http.post("/v1/batches", content=wire.encode(batch)).status_code == 200


def test_the_next_run_of_the_same_work_is_checked_against_its_advice(collector: RunningCollector,
                                                                     dsn: str) -> None:
    fast = ("--rules", str(FAST))  # thresholds in seconds: a one-minute job is judged
    # The first run ended 32 s ago, so that the next one (30 s from its end) has ended by now.
    first_end = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=32)
    run(collector, "6201", first_end - timedelta(seconds=60), 60, {"GPU-a": True, "GPU-b": False})
    assert jobpulse("rules", "evaluate", "--dsn", dsn, *fast).returncode == 0
    first = json.loads(jobpulse("summary", "6201", "--dsn", dsn, "--format", "json").stdout)
    assert first["sbatch"] == ["#SBATCH --gres=gpu:1", "#SBATCH --time=00:15:00"], first["text"]
    assert "advice_check" not in first
    # The next run of the same work (same user and job name), after the first ended: one GPU, 15 minutes.
    run(collector, "6202", first_end + timedelta(seconds=1), 30, {"GPU-c": True}, time_limit_s=15 * 60)
    assert jobpulse("rules", "evaluate", "--dsn", dsn, *fast).returncode == 0
    text = jobpulse("summary", "6202", "--dsn", dsn).stdout
    print("\n" + text)
    assert "Advice from job 6201: --gres=gpu:1 followed, --time=00:15:00 followed; saved 0.01 GPU-hours" in text, text
    digest = jobpulse("digest", "--dsn", dsn, "--by", "user", "--since", "1d")
    assert digest.returncode == 0, digest.stderr
    assert "advice from a previous run followed in 1 of 1 runs, 0.01 GPU-hours saved" in digest.stdout, digest.stdout


def held_too_much(c: RunningCollector, job_id: str, start: datetime, script: str, cpus: int, mem_gib: int) -> None:
    """A 60 s run of `lean` on one busy GPU whose processes (main and two loader workers) use about
    2 cores and 6 GiB at once, whatever it held (``cpus``, ``mem_gib``)."""
    agent = wire.AgentInfo(instance=f"lean-{job_id}", node="n1", cluster="sum", version="0.1.0", started_at=start)
    record = wire.JobRecord(job_id=job_id, user_name="ann", job_name="lean", gpus_total=1, start_time=start,
                            state="RUNNING", cpus=cpus, mem_mib=mem_gib * 1024, nodes=["n1"],
                            script_hash=script_hash(script), gpus=[wire.JobGpu("GPU-l", 0)])
    end = wire.JobRecord(job_id=job_id, end_time=start + timedelta(seconds=60), state="COMPLETED", exit_code=0)
    ts = [start + timedelta(seconds=t) for t in range(60)]
    samples = [wire.GpuSample(ts=t, gpu_uuid="GPU-l", gpu_index=0, job_id=job_id, sm_util=95, fb_used_mib=70_000,
                              fb_total_mib=81_559) for t in ts]
    procs = [wire.ProcessSample(ts=t, pid=pid, gpu_uuid="GPU-l" if pid == 100 else None, job_id=job_id, rank=0,
                                cpu_percent=cpu, rss_mib=rss)
             for t in ts for pid, cpu, rss in ((100, 100.0, 4096), (101, 48.0, 1024), (102, 48.0, 1024))]
    batch = wire.Batch(version=1, agent=agent, seq=0, created_at=start + timedelta(seconds=60),
                       gpu_samples=samples, process_samples=procs, jobs=[record, end])
    with c.client() as http:
        assert http.post("/v1/batches", content=wire.encode(batch)).status_code == 200


def test_cpus_and_memory_held_twice_over_are_advised_and_the_same_script_is_checked(
        collector: RunningCollector, dsn: str) -> None:
    """A job that held 32 CPUs and 64 GiB for a GPU and used about 2 cores and 6 GiB is told
    `--cpus-per-gpu=3` and `--mem=8G`. A later job of the same name whose script does other work is
    not its next run; one whose script differs only in the #SBATCH lines (the advice taken) is."""
    fast = ("--rules", str(FAST))
    script = "#!/bin/bash\n#SBATCH --cpus-per-gpu=32\n#SBATCH --mem=64G\nsrun python train.py --epochs 3\n"
    first_end = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=63)  # the later runs end by now
    held_too_much(collector, "6301", first_end - timedelta(seconds=60), script, cpus=32, mem_gib=64)
    assert jobpulse("rules", "evaluate", "--dsn", dsn, *fast).returncode == 0
    first = json.loads(jobpulse("summary", "6301", "--dsn", dsn, "--format", "json").stdout)
    print("\n" + first["text"])
    assert first["sbatch"] == ["#SBATCH --cpus-per-gpu=3", "#SBATCH --mem=8G", "#SBATCH --time=00:15:00"]
    assert first["allocation"] | {"cores_per_gpu_used": round(first["allocation"]["cores_per_gpu_used"])} == {
        "gpus": 1, "nodes": 1, "cpus_per_gpu": 32, "mem_per_node_mib": 65536, "cores_per_gpu_used": 2,
        "mem_per_node_used_mib": 6144}
    assert "CPU and memory: 2.0 of 32 cores per GPU (95th percentile), memory peak 6.0 of 64 GiB per node" in first["text"]

    other = script.replace("train.py", "evaluate.py")  # another work of the same name: not checked
    held_too_much(collector, "6302", first_end + timedelta(seconds=1), other, cpus=32, mem_gib=64)
    taken = script.replace("=32", "=3").replace("=64G", "=8G")  # the advice taken: only #SBATCH lines changed
    held_too_much(collector, "6303", first_end + timedelta(seconds=2), taken, cpus=3, mem_gib=8)
    assert jobpulse("rules", "evaluate", "--dsn", dsn, *fast).returncode == 0
    assert "advice_check" not in json.loads(jobpulse("summary", "6302", "--dsn", dsn, "--format", "json").stdout)
    text = jobpulse("summary", "6303", "--dsn", dsn).stdout
    assert ("Advice from job 6301: --cpus-per-gpu=3 followed, --mem=8G followed, --time=00:15:00 not checked"
            in text), text
