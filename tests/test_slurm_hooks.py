"""The agent the hooks would start, run as systemd runs jobpulse-agent.service on the hooks' settings
file (what the prolog parses, without a cluster: tests/unit/test_hook_parsing.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_the_systemd_agent_runs_on_the_hooks_settings_file(fake_nvml: Path, tmp_path: Path) -> None:
    """jobpulse-agent.service: the settings file loaded as systemd's EnvironmentFile= loads it, then
    `python -m jobpulse.agent.slurm serve`: the agent the hooks would start, at the paths and port set there."""
    from jobpulse.collector.embedded.postgres import free_port

    from .agents import Scenario

    port = free_port()
    scenario = Scenario().gpu(0, "GPU-s", "00000000:17:00.0", sm=10).write(tmp_path / "s.scn")
    conf = tmp_path / "jobpulse.conf"
    conf.write_text(f"""# as slurm/jobpulse.conf.example
JOBPULSE_CLUSTER=c1
JOBPULSE_RUNTIME_DIR={tmp_path}/%n/run
JOBPULSE_SPOOL_DIR={tmp_path}/%n/spool
JOBPULSE_AGENT_ARGS="--prometheus-listen 127.0.0.1:{port}"
LD_LIBRARY_PATH={fake_nvml}
FAKE_NVML_SCENARIO={scenario}
""")
    settings = dict(line.split("=", 1) for line in conf.read_text().splitlines() if line and not line.startswith("#"))
    env = {"PATH": os.environ["PATH"], **{k: v.strip('"') for k, v in settings.items()}}  # systemd drops the quotes
    node = os.uname().nodename.split(".")[0]
    agent = subprocess.Popen([sys.executable, "-m", "jobpulse.agent.slurm", "serve"], env=env,
                             stdout=subprocess.DEVNULL, stderr=(tmp_path / "agent.log").open("wb"))
    try:
        sock = tmp_path / node / "run" / "agent.sock"
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert agent.poll() is None and time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.1)
        status = subprocess.run([sys.executable, "-m", "jobpulse.agent", "status", "--control-socket", str(sock)],
                                capture_output=True, text=True, timeout=30)
        assert json.loads(status.stdout)["gpus"] == ["GPU-s"]
        assert (tmp_path / node / "run").stat().st_mode & 0o777 == 0o755  # jobs reach the events socket
        assert "DCGM_FI_DEV_GPU_UTIL" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        agent.terminate()
        agent.wait(30)
    assert (tmp_path / node / "spool").is_dir()
