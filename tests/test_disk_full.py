"""A full spool disk loses nothing silently: batches the disk refuses wait in memory within the
spool's bound, are sent once the collector is back, and whatever the bound forced out is counted."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg

from jobpulse.collector.demo.embedded_postgres import free_port

from .agents import FULL_H100, Scenario, start_agent
from .conftest import start_collector, stop_collector


def test_full_spool_disk_holds_batches_in_memory_and_counts_drops(fake_nvml: Path, dsn: str, tmp_path: Path,
                                                                 tiny_disk: Path) -> None:
    port = free_port()  # the collector is away at first
    scn = Scenario().gpu(0, "GPU-d", "00000000:17:00.0", **FULL_H100).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", "--spool-dir", str(tiny_disk / "spool"),
                        "--spool-max-mb", "0.06", collector=f"http://127.0.0.1:{port}", token="test-token-0123456789")
    collector = None
    try:
        time.sleep(10)  # at 2 Hz the 16 KiB disk fills within seconds
        assert "spool disk refused a batch" in agent.log.read_text()
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
