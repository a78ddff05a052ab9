"""Nothing measured is lost: collector down for 15 s (30 batches the agent must hold) and the agent
restarted meanwhile -> every sample the agents produced is stored exactly once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlparse

import psycopg

from .agents import Scenario, spawn_rank, start_agent
from .conftest import start_collector, stop_collector

OUTAGE_S = 15


def test_collector_outage_and_agent_restart_lose_nothing(fake_nvml: Path, dsn: str, tmp_path: Path) -> None:
    rank = spawn_rank("6001", 0, 0)
    scn = (Scenario()
           .gpu(0, "GPU-r0", "00000000:17:00.0", sm=70, mem=30, fb_total_mib=81_559, fb_used_mib=5000, power_mw=250_000)
           .gpu(1, "GPU-r1", "00000000:65:00.0", sm=0, mem=0, fb_total_mib=81_559, fb_used_mib=0, power_mw=60_000)
           .add(f"proc 0 0 {rank.pid} 5000 70 30").write(tmp_path / "s.scn"))
    collector = start_collector(dsn, tmp_path)
    port = urlparse(collector.url).port
    workdir = tmp_path / "agent"
    first = start_agent(fake_nvml, scn, workdir, "n1", collector=collector.url, token=collector.token)
    second = None
    try:
        assert first.control("register", "6001", "--uid", str(os.getuid()), "--gpus", "0,1")["ok"]
        time.sleep(3)
        collector.proc.kill()  # the collector dies without a word
        collector.proc.wait()
        down_at = time.monotonic()
        time.sleep(OUTAGE_S / 3)
        produced_first = first.stop()  # agent restart while the collector is away
        assert len(list((workdir / "spool").glob("*.json.gz"))) > 0, "batches must wait in the spool"
        second = start_agent(fake_nvml, scn, workdir, "n1", collector=collector.url, token=collector.token)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        collector = start_collector(dsn, tmp_path, port=port)
        deadline = time.monotonic() + 60
        while second.control("status")["spooled"] != 0:
            assert time.monotonic() < deadline, "the spool did not drain"
            time.sleep(0.5)
        time.sleep(1)
        produced_second = second.stop()
        second = None
    finally:
        rank.kill()
        for agent in (first, second):
            if agent is not None and agent.proc.poll() is None:
                agent.proc.kill()
    # The second agent's final batches went out during its shutdown; give the collector a moment.
    stop_collector(collector)

    produced = {k: produced_first[k] + produced_second[k] for k in produced_first}
    with psycopg.connect(dsn) as conn:
        gpu_rows, distinct_gpu = conn.execute(
            "SELECT count(*), count(DISTINCT (node, gpu_uuid, ts)) FROM jobpulse.gpu_samples").fetchone()
        proc_rows = conn.execute("SELECT count(*) FROM jobpulse.process_samples").fetchone()[0]
        # Once the job was registered, every later sample carries it, across the agent restart too.
        unattributed_after_restart = conn.execute(
            "SELECT count(*) FROM jobpulse.gpu_samples WHERE job_id IS NULL AND ts >"
            " (SELECT min(ts) FROM jobpulse.gpu_samples WHERE job_id = '6001')").fetchone()[0]
        instances = conn.execute("SELECT count(DISTINCT agent_instance) FROM jobpulse.ingest_batches").fetchone()[0]
    print(f"\nproduced {produced}, stored gpu_samples={gpu_rows} process_samples={proc_rows}")
    assert produced["gpu_samples"] > 2 * 2 * OUTAGE_S * 0.8  # 2 GPUs at 2 Hz, most of it during the outage
    assert gpu_rows == distinct_gpu == produced["gpu_samples"]
    assert proc_rows == produced["process_samples"]
    assert instances == 2
    assert unattributed_after_restart == 0  # the restarted agent remembered the registration
