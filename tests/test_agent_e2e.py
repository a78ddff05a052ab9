"""The real agent on the fake NVML library -> a real collector -> real PostgreSQL.

Two agents play two nodes of one job; real child processes with Slurm environments are the
ranks. Every field arrives with its unit, processes carry the right job/step/rank/PID,
unsupported functions give NULLs, an XID becomes a health event.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from .agents import FULL_H100, RunningAgent, Scenario, spawn_rank, start_agent
from .conftest import RunningCollector

JOB = "5001"


def wait_for(predicate, timeout: float = 30, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def query(dsn: str, sql: str, *params: object) -> list[tuple]:  # type: ignore[type-arg]
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.fixture
def ranks() -> Iterator[list]:  # type: ignore[type-arg]
    procs = [spawn_rank(JOB, rank, rank % 2) for rank in range(4)]
    procs.append(spawn_rank(JOB, 0, 0, step="batch"))  # a CPU-only process of the job (no GPU)
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def two_nodes(tmp_path: Path, ranks: list) -> tuple[Path, Path]:  # type: ignore[type-arg]
    n1 = (Scenario()
          .gpu(0, "GPU-n1-0", "00000000:17:00.0", minor=1, numa=0, cpus="ff", **FULL_H100)
          .gpu(1, "GPU-n1-1", "00000000:65:00.0", minor=0, numa=1, cpus="ff00", sm=0, mem=0, fb_total_mib=81_559,
               fb_used_mib=0, power_mw=70_000)
          .add(f"proc 0 0 {ranks[0].pid} 30000 80 30").add(f"proc 0 1 {ranks[1].pid} 1000 0 0")
          .add("nvlink 0 0 1").add("nvlink 0 1 1").add("nvlink 1 0 0").add("nvlink 1 1 0")
          .add("unsupported nvmlDeviceGetJpgUtilization 1"))
    n2 = (Scenario()
          .gpu(0, "GPU-n2-0", "00000000:17:00.0", sm=60, mem=20, fb_total_mib=81_559, fb_used_mib=2000,
               power_mw=200_000)
          .gpu(1, "GPU-n2-1", "00000000:65:00.0", sm=61, mem=21, fb_total_mib=81_559, fb_used_mib=3000,
               power_mw=210_000)
          .add(f"proc 0 0 {ranks[2].pid} 2000 55 10").add(f"proc 0 1 {ranks[3].pid} 3000 57 11")
          .add("link 0 1 50").add("xid 20 1 79"))  # after both agents registered the job, even on a loaded machine
    return n1.write(tmp_path / "n1.scn"), n2.write(tmp_path / "n2.scn")


def test_two_node_job_end_to_end(fake_nvml: Path, collector: RunningCollector, dsn: str, tmp_path: Path,
                                 ranks: list) -> None:  # type: ignore[type-arg]
    s1, s2 = two_nodes(tmp_path, ranks)
    uid = str(os.getuid())
    agents: list[RunningAgent] = []
    try:
        for node, scn in (("n1", s1), ("n2", s2)):
            agent = start_agent(fake_nvml, scn, tmp_path / node, node, collector=collector.url, token=collector.token)
            agents.append(agent)
            # Slurm index 0 is /dev/nvidia0: on n1 that is NVML index 1 (minor numbers are swapped there).
            reply = agent.control("register", JOB, "--uid", uid, "--user", "alice", "--partition", "gpu",
                                  "--gpus", "0,1", "--nodes", "n1,n2")
            assert reply["ok"], reply
            if node == "n1":
                assert reply["gpus"] == ["GPU-n1-1", "GPU-n1-0"]
        wait_for(lambda: query(dsn, "SELECT count(DISTINCT gpu_uuid) FROM jobpulse.gpu_samples WHERE job_id = %s",
                               JOB)[0][0] == 4, what="samples of all 4 GPUs")
        wait_for(lambda: query(dsn, "SELECT count(*) FROM jobpulse.gpu_health_events")[0][0] >= 1, what="the XID")
        time.sleep(1.5)
        for agent in agents:
            assert agent.control("unregister", JOB, "--state", "COMPLETED", "--exit-code", "0")["ok"]
        for agent in agents:
            agent.stop()
    finally:
        for agent in agents:
            agent.kill_if_running()

    # Every dmon field of the fully populated GPU, in the wire format's units.
    cols = ("sm_util, mem_util, enc_util, dec_util, jpg_util, ofa_util, power_w, power_limit_w, gpu_temp_c, "
            "mem_temp_c, sm_clock_mhz, mem_clock_mhz, sm_clock_max_mhz, mem_clock_max_mhz, fb_used_mib, fb_total_mib, "
            "pcie_rx_kbs, pcie_tx_kbs, pcie_gen, pcie_width, pcie_gen_max, pcie_width_max, pcie_replay, "
            "clock_event_reasons, ecc_sbe_total, ecc_dbe_total, remapped_correctable, remapped_uncorrectable, "
            "remap_pending, remap_failure, gpu_index, job_id, gpm_sm_active, gpm_sm_occupancy, gpm_tensor_active, "
            "gpm_dram_bw, gpm_fp16_active, gpm_fp32_active, gpm_fp64_active")
    row = query(dsn, f"SELECT {cols} FROM jobpulse.gpu_samples WHERE gpu_uuid = 'GPU-n1-0'"
                f" AND job_id = '{JOB}' ORDER BY ts DESC LIMIT 1")[0]
    assert row == (87, 41, 3, 4, 5, 6, 312.5, 700.0, 61, 72, 1980, 2619, 1980, 2619, 40_123, 81_559, 1_234_567,
                   765_432, 5, 16, 5, 16, 7, 4, 2, 0, 1, 0, False, False, 0, JOB,
                   pytest.approx(71.5), pytest.approx(33.25), pytest.approx(40), pytest.approx(55),
                   pytest.approx(30), pytest.approx(5), pytest.approx(0, abs=1e-6))
    # Energy is a counter in mJ that grows with power (312.5 W -> 312,500 mJ per second).
    e = query(dsn, "SELECT ts, energy_mj FROM jobpulse.gpu_samples WHERE gpu_uuid = 'GPU-n1-0' ORDER BY ts")
    (t0, e0), (t1, e1) = e[1], e[-1]
    assert (e1 - e0) / (t1 - t0).total_seconds() == pytest.approx(312_500, rel=0.05)
    # NVLink totals (KiB counters) become KB/s rates.
    nvl = query(dsn, "SELECT nvlink_rx_kbs, nvlink_tx_kbs FROM jobpulse.gpu_samples WHERE gpu_uuid = 'GPU-n1-0'"
                     " AND nvlink_rx_kbs IS NOT NULL")
    assert nvl and all(rx == pytest.approx(2_000_000, rel=0.05) and tx == pytest.approx(1_000_000, rel=0.05)
                       for rx, tx in nvl[1:])
    # Unsupported: declared NOT_SUPPORTED (JPG on n1 GPU1), never set (clocks on n2), missing symbols (GPM).
    assert query(dsn, "SELECT count(*) FROM jobpulse.gpu_samples WHERE gpu_uuid = 'GPU-n1-1' AND jpg_util IS NOT NULL"
                 )[0][0] == 0
    assert query(dsn, "SELECT count(*) FROM jobpulse.gpu_samples WHERE node = 'n2' AND (sm_clock_mhz IS NOT NULL"
                      " OR gpm_sm_active IS NOT NULL)")[0][0] == 0
    assert query(dsn, "SELECT count(*) FROM jobpulse.gpu_samples WHERE gpu_uuid = 'GPU-n2-1' AND sm_util = 61")[0][0] > 0

    # Processes: the right job, step, rank, local rank, PID and GPU; the CPU-only process too. (Both
    # "nodes" share this machine's /proc, so each agent also reports the other's ranks as CPU-only.)
    procs = {(r[0], r[1]): r[2:] for r in query(
        dsn, "SELECT DISTINCT node, pid, job_id, step, rank, local_rank, gpu_uuid, gpu_mem_mib, sm_util"
             " FROM jobpulse.process_samples WHERE job_id = %s AND (gpu_uuid IS NOT NULL OR step = 'batch')", JOB)}
    assert procs[("n1", ranks[0].pid)] == (JOB, "0", 0, 0, "GPU-n1-0", 30000, 80)
    assert procs[("n1", ranks[1].pid)] == (JOB, "0", 1, 1, "GPU-n1-1", 1000, 0)
    assert procs[("n2", ranks[2].pid)] == (JOB, "0", 2, 0, "GPU-n2-0", 2000, 55)
    assert procs[("n2", ranks[3].pid)] == (JOB, "0", 3, 1, "GPU-n2-1", 3000, 57)
    assert procs[("n1", ranks[4].pid)] == (JOB, "batch", 0, 0, None, None, None)
    assert len(procs) == 6  # the 4 ranks on their GPUs, the batch step seen by both agents
    cpu = query(dsn, "SELECT max(rss_mib), count(cpu_percent) FROM jobpulse.process_samples WHERE pid = %s",
                ranks[0].pid)[0]
    assert cpu[0] > 0 and cpu[1] > 0

    # The XID, with its job, and the topology as nvidia-smi topo -m shows it.
    assert query(dsn, "SELECT node, gpu_uuid, kind, code, job_id FROM jobpulse.gpu_health_events") == [
        ("n2", "GPU-n2-1", "xid", 79, JOB)]
    topo = dict(query(dsn, "SELECT gpu_uuid, links FROM jobpulse.topology"))
    assert topo["GPU-n1-0"] == {"GPU-n1-1": "NV2"} and topo["GPU-n2-0"] == {"GPU-n2-1": "SYS"}
    assert query(dsn, "SELECT cpu_affinity, numa_node, model FROM jobpulse.topology WHERE gpu_uuid = 'GPU-n1-1'") == [
        ("8-15", 1, "NVIDIA H100 80GB HBM3")]

    # The job: both nodes' GPUs, ended with its state and exit code.
    assert query(dsn, "SELECT user_name, partition, state, exit_code, end_time IS NOT NULL FROM jobpulse.jobs") == [
        ("alice", "gpu", "COMPLETED", 0, True)]
    assert sorted(r[0] for r in query(dsn, "SELECT gpu_uuid FROM jobpulse.job_gpus")) == [
        "GPU-n1-0", "GPU-n1-1", "GPU-n2-0", "GPU-n2-1"]


def test_process_claiming_a_job_of_another_user_is_not_attributed(fake_nvml: Path, collector: RunningCollector,
                                                                  dsn: str, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another user (runs in CI as root)")
    liar = spawn_rank(JOB, 0, 0, user="nobody")  # says SLURM_JOB_ID=5001, but the job is root's
    honest = spawn_rank(JOB, 1, 1)
    scn = (Scenario().gpu(0, "GPU-x", "00000000:17:00.0", sm=50, mem=1, fb_total_mib=1000, fb_used_mib=10)
           .add(f"proc 0 0 {liar.pid} 10 1 1").add(f"proc 0 0 {honest.pid} 10 1 1").write(tmp_path / "s.scn"))
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", collector=collector.url, token=collector.token)
    try:
        assert agent.control("register", JOB, "--uid", "0", "--gpus", "0")["ok"]
        wait_for(lambda: query(dsn, "SELECT count(DISTINCT pid) FROM jobpulse.process_samples WHERE job_id = %s",
                               JOB)[0][0] >= 1, what="the honest process")
        time.sleep(1)
    finally:
        agent.stop()
        liar.kill()
        honest.kill()
    owners: dict[int, set[str | None]] = {}
    for pid, job in query(dsn, "SELECT DISTINCT pid, job_id FROM jobpulse.process_samples"):
        owners.setdefault(pid, set()).add(job)
    assert JOB in owners[honest.pid]  # (samples taken before the registration arrived have no job)
    assert owners[liar.pid] == {None}


def test_agent_without_collector_serves_dcgm_metrics(fake_nvml: Path, tmp_path: Path) -> None:
    from jobpulse.collector.embedded.postgres import free_port

    port = free_port()
    scn = Scenario().gpu(0, "GPU-m", "00000000:17:00.0", **FULL_H100).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n9", "--prometheus-listen", f"127.0.0.1:{port}")
    try:
        assert agent.control("register", "77", "--uid", "0", "--gpus", "0")["ok"]
        time.sleep(1.2)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        agent.stop()
    expected = {"gpu": "0", "UUID": "GPU-m", "pci_bus_id": "00000000:17:00.0", "device": "nvidia0",
                "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "n9", "hpc_job": "77",
                "DCGM_FI_DRIVER_VERSION": "550.54.15"}
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(expected.items()))
    assert f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 87.0" in text
    assert f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 312.5" in text
    assert f"DCGM_FI_DEV_FB_FREE{{{labels}}} {81_559 - 40_123 - 555}.0" in text  # NVML v2: reserved apart
    assert f"DCGM_FI_DEV_MEMORY_TEMP{{{labels}}} 72.0" in text
    assert f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} 0.715" in text  # GPM percent -> dcgm's ratio
    assert f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.4" in text
    assert 'jobpulse_agent_samples_total{kind="gpu_samples"}' in text
