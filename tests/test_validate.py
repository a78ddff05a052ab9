"""`jobpulse-agent validate` on the fake NVML library, and `jobpulse validate report` over a real
collector and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .agents import Scenario
from .conftest import RunningCollector

HEALTHY = dict(sm=0, mem=0, temp=35, pcie_gen=4, pcie_width=16, pcie_gen_max=4, pcie_width_max=16, ecc_mode=1,
               persistence=1, power_limit_mw=400_000, power_default_mw=400_000, clkev=1, remap_corr=0, remap_unc=0,
               remap_pending=0, remap_fail=0, fb_total_mib=40_960, fb_used_mib=0)


def node(tmp_path: Path, name: str = "node", driver: str = "550.54.15", links: int = 2,
         **overrides: float) -> Path:
    """A 2-GPU A100-like node; ``overrides`` apply to GPU 1, ``links`` is GPU 1's NVLink count."""
    s = Scenario().add(f"driver {driver}")
    s.gpu(0, "GPU-a0", "00000000:17:00.0", name="NVIDIA A100-SXM4-40GB", **HEALTHY)
    s.gpu(1, "GPU-a1", "00000000:65:00.0", name="NVIDIA A100-SXM4-40GB", **{**HEALTHY, **overrides})
    for link in range(2):
        s.add(f"nvlink 0 {link} 1")
    for link in range(links):
        s.add(f"nvlink 1 {link} 0")
    return s.write(tmp_path / f"{name}.scn")


def validate(fake: Path | None, scenario: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake or "/nonexistent"), "FAKE_NVML_SCENARIO": str(scenario)}
    return subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", "validate", *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def expect_file(fake_nvml: Path, tmp_path: Path) -> Path:
    """Recorded from a known-good node, as an admin would."""
    path = tmp_path / "a100.toml"
    r = validate(fake_nvml, node(tmp_path, "good"), "--record", str(path))
    assert r.returncode == 0, r.stderr
    return path


def test_healthy_node_passes_and_record_round_trips(fake_nvml: Path, tmp_path: Path, expect_file: Path) -> None:
    text = expect_file.read_text()
    assert 'driver_version = "550.54.15"' in text and "pcie_gen = 4" in text and "nvlinks_per_gpu = 2" in text
    for args in ((), ("--expect", str(expect_file))):
        r = validate(fake_nvml, node(tmp_path), *args)
        assert r.returncode == 0, r.stdout + r.stderr
        assert " 0 failed" in r.stdout.splitlines()[-1]
    r = validate(fake_nvml, node(tmp_path), "--expect", str(expect_file), "--format", "json")
    report = json.loads(r.stdout)
    assert report["ok"] is True and {c["check"] for c in report["checks"]} >= {
        "gpu_count", "gpu_model", "driver_version", "cuda_version", "ecc_mode", "persistence_mode", "pcie_link",
        "nvlink_up", "row_remap_pending", "temperature_at_rest", "clocks_at_rest", "power_limit", "topology",
        "xid_since_boot"}


@pytest.mark.parametrize("case,kwargs,line", [
    ("pcie gen3 x8 under load", dict(sm=90, pcie_gen=3, pcie_width=8),
     "FAIL  pcie_link [GPU-a1]: observed gen3 x8, expected gen4 x16"),
    ("down NVLink", dict(links=1), "FAIL  nvlink_up [GPU-a1]: observed 1, expected 2"),
    ("ECC off", dict(ecc_mode=0), "FAIL  ecc_mode [GPU-a1]: observed off, expected on"),
    ("driver mismatch", dict(driver="535.104.05"), "FAIL  driver_version: observed 535.104.05, expected 550.54.15"),
    ("pending row remap", dict(remap_pending=1), "FAIL  row_remap_pending [GPU-a1]: observed True, expected False"),
])
def test_each_fault_fails_its_check(fake_nvml: Path, tmp_path: Path, expect_file: Path, case: str,
                                    kwargs: dict[str, object], line: str) -> None:
    r = validate(fake_nvml, node(tmp_path, **kwargs), "--expect", str(expect_file))  # type: ignore[arg-type]
    assert r.returncode == 1, r.stdout
    assert line in r.stdout, r.stdout
    assert sum(1 for x in r.stdout.splitlines() if x.startswith("FAIL")) == (2 if case == "down NVLink" else 1)


def test_idle_slow_link_is_only_a_warning(fake_nvml: Path, tmp_path: Path) -> None:
    r = validate(fake_nvml, node(tmp_path, pcie_gen=1, pcie_width=16))
    assert r.returncode == 0
    assert "WARN  pcie_link [GPU-a1]: observed gen1 x16, expected gen4 x16 — GPU idle" in r.stdout


def test_report_names_the_deviating_node(fake_nvml: Path, collector: RunningCollector, dsn: str,
                                         tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(collector.token + "\n")
    for name, kwargs in (("n1", {}), ("n2", {}), ("n3", dict(driver="535.104.05", ecc_mode=0))):
        r = validate(fake_nvml, node(tmp_path, name, **kwargs), "--node", name, "--cluster", "c1",  # type: ignore[arg-type]
                     "--collector", collector.url, "--token-file", str(token))
        assert r.returncode == (1 if name == "n3" else 0) and "Traceback" not in r.stderr, r.stderr
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "validate", "report", "--dsn", dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "c1/n1: ok" in out.stdout and "c1/n2: ok" in out.stdout
    assert "c1/n3: FAIL" in out.stdout
    assert "fail ecc_mode [GPU-a1]: observed off, expected on" in out.stdout
    assert "deviates driver_version: 535.104.05 (most nodes: 550.54.15)" in out.stdout
