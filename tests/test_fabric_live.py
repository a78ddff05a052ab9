"""The fabric end to end: a real agent reads a sysfs tree made to the kernel's layout
(`tests/sysfs_tree.py`) while the test moves its counters, ships to a real collector, and the rows
land in `fabric_samples`: rates in KB/s from 4-byte words, the job's traffic on a node it holds
alone and the node's on a shared one; node validation against the site's expected fabric."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from .agents import Scenario, start_agent
from .conftest import RunningCollector
from .sysfs_tree import SysfsTree

GB = 10**9


def rows(dsn: str, sql: str, *params: object) -> list[tuple]:  # type: ignore[type-arg]
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()


def wait_rows(dsn: str, sql: str, *params: object, timeout: float = 30) -> list[tuple]:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while not (got := rows(dsn, sql, *params)):
        assert time.monotonic() < deadline, f"nothing from {sql}"
        time.sleep(0.3)
    return got


def test_agent_ships_fabric_rates_attributed_to_the_job_holding_the_node(
        fake_nvml: Path, collector: RunningCollector, dsn: str, tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path / "sys")
    tree.add_port("mlx5_0", 1)
    tree.add_port("mlx5_1", 1, link_layer="Ethernet", netdev="ens2np0")
    scn = Scenario().gpu(0, "GPU-f-0", "00000000:17:00.0", sm=90, power_mw=300_000).write(tmp_path / "n.scn")
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "fab1", "--sysfs-root", str(tree.root),
                        collector=collector.url, token=collector.token)
    try:
        assert agent.control("register", "9100", "--gpus", "0", "--uid", "0")["ok"]
        time.sleep(1.5)
        t0 = time.monotonic()
        for _ in range(8):  # 1 GB/s in, 0.5 GB/s out on the IB port; the RoCE port's interface alike
            tree.add_bytes("mlx5_0", 1, rx=GB // 4, tx=GB // 8)
            tree.add_bytes("mlx5_1", 1, rx=GB // 4, tx=GB // 8, netdev="ens2np0")
            time.sleep(0.25)
        spent = time.monotonic() - t0
        assert agent.control("register", "9101", "--gpus", "0", "--uid", "0")["ok"]  # a second job: shared
        time.sleep(1.5)
        agent.stop()
    finally:
        agent.kill_if_running()
    got = rows(dsn, "SELECT device, job_id, max(rx_kbs), max(tx_kbs), max(net_rx_kbs), count(*),"
                    " max(width), max(rate_gbps), min(link_layer) FROM jobpulse.fabric_samples"
                    " WHERE node = 'fab1' GROUP BY 1, 2 ORDER BY 1, 2")
    by = {(d, j): r for d, j, *r in got}
    ib = by[("mlx5_0", "9100")]
    mean_rx = GB / spent / 1024  # what the test wrote per second, in KB/s
    assert 0.5 * mean_rx < ib[0] < 2.5 * mean_rx, (ib, mean_rx)  # a second's samples see one to three writes
    assert ib[1] < ib[0] and ib[4:] == [4, 100.0, "InfiniBand"]
    assert by[("mlx5_1", "9100")][2] is not None and by[("mlx5_1", "9100")][6] == "Ethernet"
    assert ("mlx5_0", None) in by  # two jobs on the node: its traffic is the node's
    assert agent.produced()["fabric_samples"] == sum(r[3] for r in by.values())


def test_validate_reports_a_port_at_the_wrong_rate_or_width_and_a_port_down(fake_nvml: Path, tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path / "sys")
    tree.add_port("mlx5_0", 1)  # 4X EDR, as expected
    tree.add_port("mlx5_1", 1, lanes=1)  # trained down to a quarter width
    tree.add_port("mlx5_2", 1, lanes=4, speed="QDR")  # 40 Gb/s: the wrong rate
    tree.add_port("mlx5_3", 1, state=1, phys_state=2)  # down (Polling: no cable or no peer)
    tree.set_counter("mlx5_0", 1, "symbol_error", 12)
    scn = Scenario().gpu(0, "GPU-v-0", "00000000:17:00.0", sm=0, power_mw=60_000).write(tmp_path / "v.scn")
    expect = tmp_path / "expect.toml"
    expect.write_text("[node]\nfabric_ports = 4\nfabric_rate_gbps = 100\nfabric_width = 4\n")
    env = {"LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_SCENARIO": str(scn)}
    out = subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", "validate", "--expect", str(expect),
                          "--sysfs-root", str(tree.root), "--format", "json"],
                         capture_output=True, text=True, timeout=60, env={**_env(), **env})
    assert out.returncode == 1, out.stderr
    results = [r for r in json.loads(out.stdout)["checks"] if r["check"].startswith("fabric")]
    by = {(r["check"], r["observed"].split(":")[0]): r for r in results}
    assert by[("fabric_ports", "4 ports")]["status"] == "pass"
    assert by[("fabric_width", "mlx5_1/1")]["status"] == "fail"
    assert "1X" in by[("fabric_width", "mlx5_1/1")]["observed"] and by[("fabric_width", "mlx5_1/1")]["expected"] == "4X"
    assert by[("fabric_rate", "mlx5_2/1")]["status"] == "fail"
    assert by[("fabric_rate", "mlx5_0/1")]["status"] == "pass" and by[("fabric_width", "mlx5_0/1")]["status"] == "pass"
    assert by[("fabric_state", "mlx5_3/1")]["status"] == "fail"
    assert "DOWN" in by[("fabric_state", "mlx5_3/1")]["observed"]
    assert by[("fabric_errors", "mlx5_0/1")]["status"] == "warn"  # errors counted since the counters' reset
    assert "symbol_error 12" in by[("fabric_errors", "mlx5_0/1")]["observed"]
    assert ("fabric_rate", "mlx5_3/1") not in by  # a port that is down has no rate to judge


def _env() -> dict[str, str]:
    import os
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_SCENARIO")}
