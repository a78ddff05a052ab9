"""A full spool disk loses nothing silently: batches the disk refuses wait in memory within the
spool's bound, are sent once the collector is back, and whatever the bound forced out is counted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from jobpulse.collector.embedded.postgres import free_port

from .agents import FULL_H100, Scenario, start_agent
from .conftest import start_collector, stop_collector
from .test_agent_e2e import wait_for


def test_full_spool_disk_holds_batches_in_memory_and_counts_drops(fake_nvml: Path, dsn: str, tmp_path: Path,
                                                                 tiny_disk: Path) -> None:
    port = free_port()  # the collector is away at first
    scn = Scenario().gpu(0, "GPU-d", "00000000:17:00.0", **FULL_H100).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", "--spool-dir", str(tiny_disk / "spool"),
                        "--spool-max-mb", "0.06", collector=f"http://127.0.0.1:{port}", token="test-token-0123456789")
    collector = None
    try:
        # At 2 Hz the 16 KiB disk fills within seconds; then a few more batches wait in memory only.
        wait_for(lambda: "spool disk refused a batch" in agent.log.read_text(), 30, "the spool disk to refuse a batch")
        time.sleep(3)
        collector = start_collector(dsn, tmp_path, port=port)
        agent.wait_drained()
        produced = agent.stop()
    finally:
        agent.kill_if_running()
        stop_collector(collector)
    with psycopg.connect(dsn) as conn:
        stored, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT (gpu_uuid, ts)) FROM jobpulse.gpu_samples").fetchone()
        reported = conn.execute("SELECT coalesce(sum((dropped->>'gpu_samples')::int), 0)"
                                " FROM jobpulse.ingest_batches").fetchone()[0]
    print(f"\ndisk full: produced {produced['gpu_samples']}, stored {stored}, dropped and reported {reported}")
    assert stored == distinct, "nothing stored twice"
    assert stored + reported == produced["gpu_samples"], "every sample stored or counted as dropped"
    assert stored > reported, "most batches waited in memory instead of being lost"


def fill(disk: Path) -> None:
    """Every free byte of ``disk`` taken by one file."""
    with (disk / "filler").open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass


def test_a_full_spool_disk_never_blocks_a_jobs_registration_nor_its_end(fake_nvml: Path, dsn: str, tmp_path: Path,
                                                                        tiny_disk: Path) -> None:
    """Hole: with the spool disk full, saving the agent's job list failed inside the registration: the
    prolog failed after 6.9 s, the agent logged a traceback a second and the job had no row until space
    came back. The list is kept in memory (said once in the log); registration and end never wait on it."""
    c = start_collector(dsn, tmp_path)
    scn = Scenario().gpu(0, "GPU-fd", "00000000:17:00.0", minor=0, **FULL_H100).write(tmp_path / "s.scn")
    (tiny_disk / "spool").mkdir()
    fill(tiny_disk)
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_SCENARIO": str(scn), "SLURMD_NODENAME": "n1",
           "JOBPULSE_RUNTIME_DIR": str(tmp_path / "run"), "JOBPULSE_SPOOL_DIR": str(tiny_disk / "spool"),
           "JOBPULSE_LOG_DIR": str(tmp_path / "log"), "JOBPULSE_GRES_CONF": str(tmp_path / "none"),
           "JOBPULSE_COLLECTOR": c.url, "JOBPULSE_TOKEN_FILE": str(tmp_path / "tokens"), "JOBPULSE_CLUSTER": "fd",
           "SLURM_JOB_GPUS": "0", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000", "SLURM_JOB_ID": "5151"}

    def hook(what: str) -> tuple[str, float]:
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "jobpulse.agent.slurm", what], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stderr, time.monotonic() - started

    try:
        said, took = hook("prolog")
        assert "registered on n1" in said, said
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM jobpulse.gpu_samples WHERE job_id = '5151'")
                     .fetchone()[0] >= 2, 30, "the job's samples")
            said, _ = hook("epilog")
            assert "unregistered" in said or "ended" in said, said
            wait_for(lambda: conn.execute("SELECT end_time IS NOT NULL FROM jobpulse.jobs WHERE job_id = '5151'")
                     .fetchone()[0], 30, "the job's end")
    finally:
        subprocess.run(["pkill", "-f", "--", f"--control-socket {tmp_path / 'run' / 'agent.sock'}"], check=False)
        stop_collector(c)
    log = (tmp_path / "log" / "agent.log").read_text()
    print(f"\nfull spool disk: the prolog registered the job in {took:.2f} s")
    assert took < 5 and "Traceback" not in log, log[-3000:]
    assert log.count("job list not saved") == 1, log[-3000:]
