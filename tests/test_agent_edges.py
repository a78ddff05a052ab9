"""The agent's edges: probe, no NVML, a GPU that is lost, a spool that overflows."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from jobpulse.collector.embedded.postgres import free_port

from .agents import FULL_H100, Scenario, start_agent
from .conftest import RunningCollector, start_collector, stop_collector


def agent_cli(fake_dir: Path | None, scenario: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_dir or "/nonexistent"),
           "FAKE_NVML_SCENARIO": str(scenario or "/nonexistent")}
    return subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_probe_prints_gpus_fields_and_topology(fake_nvml: Path, tmp_path: Path) -> None:
    scn = (Scenario().gpu(0, "GPU-p0", "00000000:17:00.0", **FULL_H100).gpu(1, "GPU-p1", "00000000:65:00.0", sm=1)
           .add("nvlink 0 0 1").add("nvlink 1 0 0").write(tmp_path / "s.scn"))
    r = agent_cli(fake_nvml, scn, "probe")
    assert r.returncode == 0, r.stderr
    assert "driver 550.54.15  CUDA 12.4  GPUs 2" in r.stdout
    assert "GPU0 NVIDIA H100 80GB HBM3  GPU-p0  bus 00000000:17:00.0" in r.stdout
    assert "sm_util=87" in r.stdout and "power_w=312.5" in r.stdout
    assert "unsupported: " in r.stdout and "gpm_sm_active" in r.stdout
    assert "GPU0\tX\tNV1" in r.stdout and "GPU1\tNV1\tX" in r.stdout


def test_no_nvml_is_a_clear_error(tmp_path: Path) -> None:
    for args in (["probe"], ["run", "--control-socket", str(tmp_path / "s"), "--spool-dir", str(tmp_path)]):
        r = agent_cli(None, None, *args)
        assert r.returncode == 1
        assert "NVML is not available" in r.stderr and "Traceback" not in r.stderr


def test_lost_gpu_is_a_health_event_and_sampling_goes_on(fake_nvml: Path, collector: RunningCollector, dsn: str,
                                                         tmp_path: Path) -> None:
    scn = (Scenario().gpu(0, "GPU-ok", "00000000:17:00.0", sm=50, mem=1)
           .gpu(1, "GPU-gone", "00000000:65:00.0", sm=50, mem=1).add("lost 4.0 1").write(tmp_path / "s.scn"))
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", collector=collector.url, token=collector.token)
    time.sleep(max(0.0, scn_start(scn) + 6 - time.time()))  # lost after the agent started, even on a loaded machine
    agent.stop()
    with psycopg.connect(dsn) as conn:
        events = conn.execute("SELECT kind, gpu_uuid FROM jobpulse.gpu_health_events").fetchall()
        last = dict(conn.execute("SELECT gpu_uuid, max(ts) FROM jobpulse.gpu_samples GROUP BY 1").fetchall())
    assert events == [("gpu_lost", "GPU-gone")]
    assert last["GPU-ok"] > last["GPU-gone"]
    assert "Traceback" not in agent.log.read_text()


def test_full_spool_drops_oldest_and_reports_it(fake_nvml: Path, dsn: str, tmp_path: Path) -> None:
    port = free_port()  # nothing listens here yet
    scn = Scenario().gpu(0, "GPU-s", "00000000:17:00.0", **FULL_H100).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", "--spool-max-mb", "0.008",
                        collector=f"http://127.0.0.1:{port}", token="test-token-0123456789")
    collector = None
    try:
        time.sleep(6)
        spooled = sum(p.stat().st_size for p in (tmp_path / "a" / "spool").glob("*.json.gz"))
        assert 0 < spooled <= int(0.008 * 1024 * 1024)  # --spool-max-mb 0.008: 8,388 bytes
        collector = start_collector(dsn, tmp_path, port=port)
        deadline = time.monotonic() + 30
        while agent.control("status")["spooled"] != 0 or time.monotonic() < deadline - 27:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        produced = agent.stop()
    finally:
        agent.kill_if_running()
        stop_collector(collector)
    with psycopg.connect(dsn) as conn:
        stored = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]
        reported = conn.execute("SELECT coalesce(sum((dropped->>'gpu_samples')::int), 0),"
                                " coalesce(sum((dropped->>'batches')::int), 0) FROM jobpulse.ingest_batches").fetchone()
    from jobpulse.agent.shipping.spool import Spool

    still_spooled = Spool(tmp_path / "a" / "spool", 1 << 30).pending()["gpu_samples"]  # sent at the next start
    assert reported[0] > 0 and reported[1] > 0
    # Every sample is stored, counted as dropped, or still waiting in the spool.
    assert stored + reported[0] + still_spooled == produced["gpu_samples"]


def scn_start(path: Path) -> float:
    """A scenario file's time 0 (its ``start`` line)."""
    return float(path.read_text().split()[1])


_EXEC_LATER = """
import os, time
time.sleep(float(os.environ["PRE_EXEC_S"]))  # slurmstepd's child while the task prolog runs: no job yet
os.execve("/bin/sleep", ["sleep", "3"], {**os.environ, "SLURM_JOB_ID": "55", "SLURM_STEP_ID": "0",
                                         "SLURM_PROCID": "2", "SLURM_LOCALID": "0"})
"""


def test_a_task_first_seen_before_its_exec_is_attributed_after_it(fake_nvml: Path, collector: RunningCollector,
                                                                  dsn: str, tmp_path: Path) -> None:
    """slurmstepd forks a task, runs the task prolog, then execs the program with the job's environment:
    an agent that looked at the task before the exec (no job) must look again after it, even though no
    job registers in between (a whole short job's process samples were lost this way)."""
    scn = Scenario().gpu(0, "GPU-x", "00000000:17:00.0", **FULL_H100).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", collector=collector.url, token=collector.token)
    try:
        assert agent.control("register", "55", "--uid", str(os.getuid()), "--gpus", "0")["ok"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        task = subprocess.Popen([sys.executable, "-c", _EXEC_LATER], env={**env, "PRE_EXEC_S": "2"})
        assert task.wait(30) == 0
        agent.end_jobs("55")
        agent.wait_drained()
        agent.stop()
    finally:
        agent.kill_if_running()
    with psycopg.connect(dsn) as conn:
        seen = conn.execute("SELECT job_id, rank, command, count(*) FROM jobpulse.process_samples WHERE pid = %s"
                            " GROUP BY 1, 2, 3", (task.pid,)).fetchall()
    # about 6 samples: 3 s at the agent's 0.5 s, none before the exec (no job's process then)
    assert len(seen) == 1 and seen[0][:3] == ("55", 2, "sleep") and seen[0][3] >= 3, (seen, agent.log.read_text())
