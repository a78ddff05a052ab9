"""`jobpulse demo`, the README's first command: it runs the whole system, names the flagged jobs,
writes the HTML reports, and leaves no process behind — at its end (run from the wheel in
tests/test_packaging.py, with `check_demo`) and after Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """The demo's own folder for this test: as root under /var/tmp (PostgreSQL runs as `postgres`)."""
    where = Path(tempfile.mkdtemp(prefix="jobpulse-demo-test-", dir="/var/tmp" if os.geteuid() == 0 else tmp_path))
    where.chmod(0o711)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def leftovers(folder: Path) -> list[str]:
    """The processes the demo in ``folder`` started that still run: each names the folder (its data,
    its token files), so the suite's other collectors and a checkout whose path says "demo" are not
    taken for the demo's."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmd:
            out.append(f"{pid}: {cmd}")
    return out


def check_demo(out: subprocess.CompletedProcess[str], folder: Path) -> None:
    """What a finished `jobpulse demo --duration 45` must have shown and left (run from the wheel with
    only the demo extra: tests/test_packaging.py)."""
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = out.stdout[out.stdout.index("Flagged jobs"):out.stdout.index("Job 1003 (demo)")]
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if line.startswith("│ 10")}
    assert "none" in rows["1001"]  # the healthy 2-node job
    # One flag per cause: the data-loader-bound GPU is input-bound (not also low), the never-used GPU
    # is the job's over-allocation (not also idle and a straggler), the throttling GPU the node's.
    flags = {job: row.split("│")[4].strip() for job, row in rows.items()}
    assert flags == {"1001": "none", "1002": "input_bound (code)", "1003": "over_allocation (code)",
                     "1004": "hw_throttling (hardware)"}, table
    assert (folder / "reports" / "job-1001.html").read_text().count("data-phase='epoch'") >= 2
    # The input-bound rank's stacks, sampled under its flag, name its own functions.
    assert "next_batch (loader.py) &gt; decode_jpeg (loader.py)" in (folder / "reports" / "job-1002.html").read_text()
    assert "grafana build" in out.stdout and "run with --keep" in out.stdout
    for secret in ("tokens", "tokens.agent"):
        assert (folder / secret).stat().st_mode & 0o077 == 0, f"{secret} is readable by others"
    assert leftovers(folder) == []


def test_demo_stops_everything_on_ctrl_c(folder: Path) -> None:
    env = {**os.environ, "JOBPULSE_DEMO_DIR": str(folder)}
    demo = subprocess.Popen([sys.executable, "-m", "jobpulse.collector.cli", "demo", "--live"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (folder / "node-c" / "agent.sock").exists():
            assert demo.poll() is None and time.monotonic() < deadline, demo.stdout.read() if demo.stdout else ""
            time.sleep(0.5)
        time.sleep(5)
        assert len(leftovers(folder)) >= 4  # agents, ranks, PostgreSQL are running
        demo.send_signal(signal.SIGINT)
        output, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130 and "stopping" in output and "Traceback" not in output
    assert leftovers(folder) == []
