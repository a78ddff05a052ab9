"""The agent's /metrics next to NVIDIA's dcgm-exporter: its default counters with their names,
types, units and labels, its counters-file format, its port left free, its newer host label.
Everything through the real agent process on the fake NVML library."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from jobpulse.collector.embedded.postgres import free_port

from .agents import FULL_H100, Scenario, start_agent

# dcgm-exporter's etc/default-counters.csv (3.x/4.x): every row not commented out, with its type
# (DCGM_FI_DEV_VGPU_LICENSE_STATUS left out: vGPU licensing is not in NVML's bare-metal view).
DCGM_DEFAULTS = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge", "DCGM_FI_DEV_MEM_CLOCK": "gauge", "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge", "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge", "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge", "DCGM_FI_DEV_ENC_UTIL": "gauge",
    "DCGM_FI_DEV_DEC_UTIL": "gauge", "DCGM_FI_DEV_XID_ERRORS": "gauge", "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge", "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter", "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gauge", "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge", "DCGM_FI_PROF_PCIE_RX_BYTES": "gauge",
}
# What promtool says of dcgm-exporter's own names: camelCase labels (modelName, UUID, Hostname), counters
# without `_total`. Anything else is ours to fix.
INHERITED_LINT = re.compile(r"^DCGM_FI_\w+ (label names should be written in 'snake_case' not 'camelCase'"
                            r"|counter metrics should have \"_total\" suffix|metric name should not include type)")
# The PromQL of NVIDIA's own Grafana dashboard for dcgm-exporter (grafana/dcgm-exporter-dashboard.json).
DASHBOARD_QUERIES = [
    'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}',
    'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}',
    'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})',
    'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000',
    'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}',
    'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}',
]
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\} (\S+)$", re.MULTILINE)


def parse(text: str) -> tuple[dict[str, str], dict[str, tuple[dict[str, str], float]]]:
    """(metric -> type, metric -> (labels, value)) of the first GPU's samples."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    samples = {}
    for name, labels, value in SAMPLE.findall(text):
        samples.setdefault(name, (dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    return types, samples


def scrape(port: int, until: str) -> str:
    deadline = time.monotonic() + 20
    while True:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        if until in text or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    return Scenario().gpu(0, "GPU-d", "00000000:17:00.0", **FULL_H100).write(tmp_path / "s.scn")


def test_every_default_counter_of_dcgm_exporter_with_its_type_unit_and_labels(
        fake_nvml: Path, scenario: Path, tmp_path: Path) -> None:
    port = free_port()
    agent = start_agent(fake_nvml, scenario, tmp_path / "a", "n9", "--prometheus-listen", f"127.0.0.1:{port}",
                        "--hostname-label", "hostname")
    try:
        # NVLink's byte counter and GPM need two samples.
        text = scrape(port, "DCGM_FI_PROF_GR_ENGINE_ACTIVE{")
    finally:
        agent.stop()
    types, samples = parse(text)
    missing = {n for n in DCGM_DEFAULTS if n not in samples}
    assert not missing, missing
    assert {n: types[n] for n in DCGM_DEFAULTS} == DCGM_DEFAULTS
    labels, _ = samples["DCGM_FI_DEV_GPU_UTIL"]
    assert labels == {"gpu": "0", "UUID": "GPU-d", "pci_bus_id": "00000000:17:00.0", "device": "nvidia0",
                      "modelName": "NVIDIA H100 80GB HBM3", "hostname": "n9", "DCGM_FI_DRIVER_VERSION": "550.54.15",
                      "hpc_job": ""}
    value = {n: v for n, (_, v) in samples.items()}
    assert value["DCGM_FI_DEV_FB_RESERVED"] == 555  # MiB
    assert value["DCGM_FI_DEV_FB_FREE"] == FULL_H100["fb_total_mib"] - FULL_H100["fb_used_mib"] - 555
    assert value["DCGM_FI_PROF_PCIE_TX_BYTES"] == FULL_H100["pcie_tx_kbs"] * 1024  # NVML KB/s -> bytes/s
    assert value["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.9)  # GPM percent -> dcgm's ratio
    assert value["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 1 and value["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 0
    # Bytes since driver load: the fake integrates 3 GB/s of NVLink traffic over its scenario time.
    assert value["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] > 1e9
    assert types["jobpulse_agent_batches_sent_total"] == "counter"
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=30)
        problems = [line for line in (lint.stdout + lint.stderr).splitlines() if not INHERITED_LINT.match(line)]
        assert not problems, problems


def test_a_dcgm_exporter_counters_file_chooses_what_is_exposed(fake_nvml: Path, scenario: Path,
                                                               tmp_path: Path) -> None:
    counters = tmp_path / "counters.csv"
    counters.write_text("# site selection\n"
                        "DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).\n"
                        "DCGM_FI_DEV_POWER_USAGE ,  gauge, Power draw (in W).\n"
                        "DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status\n")
    port = free_port()
    agent = start_agent(fake_nvml, scenario, tmp_path / "a", "n9", "--prometheus-listen", f"127.0.0.1:{port}",
                        "--dcgm-counters", str(counters), "--hostname-label", "none")
    try:
        text = scrape(port, "DCGM_FI_DEV_POWER_USAGE{")
    finally:
        agent.stop()
    _, samples = parse(text)
    assert {n for n in samples if n.startswith("DCGM_")} == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"}
    labels, _ = samples["DCGM_FI_DEV_GPU_UTIL"]
    assert "hostname" not in labels and "Hostname" not in labels and "DCGM_FI_DRIVER_VERSION" not in labels
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" in agent.log.read_text()  # named as not served


def run_agent(fake_nvml: Path, scenario: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_SCENARIO": str(scenario)}
    return subprocess.run([sys.executable, "-m", "jobpulse.agent", "run", "--node", "n9",
                           "--control-socket", str(tmp_path / "c.sock"), "--events-socket", str(tmp_path / "e.sock"),
                           "--spool-dir", str(tmp_path / "spool"), *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_a_taken_port_and_a_bad_counters_file_are_clear_errors(fake_nvml: Path, scenario: Path,
                                                               tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_agent(fake_nvml, scenario, tmp_path, "--prometheus-listen", f"127.0.0.1:{port}")
    assert out.returncode == 1 and f"127.0.0.1:{port}" in out.stderr and "taken" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("# mine\nDCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_POWER_USAGE, histogramm, typo\n")
    out = run_agent(fake_nvml, scenario, tmp_path, "--dcgm-counters", str(bad))
    assert out.returncode == 1 and f"{bad}:3" in out.stderr and "histogramm" in out.stderr, out.stderr


@pytest.mark.skipif(not shutil.which("prometheus"), reason="Debian's prometheus is not installed (make setup does)")
def test_nvidias_dashboard_queries_return_data_through_a_real_prometheus(fake_nvml: Path, scenario: Path,
                                                                          tmp_path: Path) -> None:
    port, web = free_port(), free_port()
    agent = start_agent(fake_nvml, scenario, tmp_path / "a", "n9", "--prometheus-listen", f"127.0.0.1:{port}")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: dcgm, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}]\n")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"))
    try:
        # The counters' metadata as Prometheus learnt it from the scrape: counters, not "unknown".
        metadata: dict[str, object] = {}
        answered: dict[str, int] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                for q in DASHBOARD_QUERIES:
                    r = httpx.get(f"http://127.0.0.1:{web}/api/v1/query",
                                  params={"query": q.replace("$instance", ".*").replace("$gpu", ".*")}, timeout=5)
                    answered[q] = len(r.json()["data"]["result"])
                metadata = httpx.get(f"http://127.0.0.1:{web}/api/v1/metadata", timeout=5).json()["data"]
            except (httpx.TransportError, ValueError, KeyError):
                pass  # not up yet (refused, or 503 while it starts)
            if answered and all(answered.values()) and "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in metadata:
                break
            time.sleep(0.5)
    finally:
        prom.terminate()
        prom.wait(30)
        agent.stop()
    assert answered == {q: 1 for q in DASHBOARD_QUERIES}, (tmp_path / "prometheus.log").read_text()[-2000:]
    assert metadata["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["type"] == "counter"
