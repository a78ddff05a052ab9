"""The prolog's parsing of what researchers and Slurm hand it (runs without a cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobpulse.agent.slurm import HookError, expand_hostlist, parse_hooks


def test_job_comment_settings() -> None:
    assert parse_hooks("my notes; jobpulse: interval=0.5 tags=project:llm,stage:pre") == {
        "interval_s": 0.5, "tags": {"project": "llm", "stage": "pre"}}
    assert parse_hooks("jobpulse: off; the rest is mine") == {"off": True}
    assert parse_hooks("nothing for us") == {} and parse_hooks(None) == {}
    for bad, field in (("jobpulse: interval=fast", "interval"), ("jobpulse: interval=0.01", "interval"),
                       ("jobpulse: tags=oops", "tags"), ("jobpulse: colour=red", "colour")):
        with pytest.raises(HookError, match=field):
            parse_hooks(bad)


def test_hostlists() -> None:
    assert expand_hostlist("n[1-3,7],gpu01") == ["n1", "n2", "n3", "n7", "gpu01"]
    assert expand_hostlist("node[08-10]") == ["node08", "node09", "node10"]
    assert expand_hostlist("") == []


def test_prolog_never_fails_a_job(tmp_path: Path) -> None:
    """No agent can start (no NVML here) and no collector: exit 0, one line saying why, bounded."""
    env = {**os.environ, "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "nx", "SLURM_JOB_COMMENT": "jobpulse: colour=red",
           "JOBPULSE_RUNTIME_DIR": str(tmp_path / "run"), "JOBPULSE_SPOOL_DIR": str(tmp_path / "spool"),
           "JOBPULSE_LOG_DIR": str(tmp_path / "log"), "LD_LIBRARY_PATH": "/nonexistent"}
    said = {}
    for what in ("prolog", "epilog"):
        r = subprocess.run([sys.executable, "-m", "jobpulse.agent.slurm", what], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0
        assert f"jobpulse {what}:" in r.stderr and "Traceback" not in r.stderr
        said[what] = r.stderr
    assert "ignoring the job comment's jobpulse settings: unknown jobpulse setting 'colour'" in said["prolog"]
    assert "prolog failed for job 42: RuntimeError: the agent exited at start" in said["prolog"]
    assert "NVML is not available" in (tmp_path / "log" / "agent.log").read_text()
    assert "no agent on nx; nothing to unregister" in said["epilog"]
