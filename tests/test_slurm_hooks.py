"""The prolog's parsing of what researchers and Slurm hand it (runs without a cluster)."""

from __future__ import annotations

import os
import shutil
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


HOSTLISTS = ["n[1-3,7],gpu01", "node[08-10]", "rack[1-2]-n[1-2]", "rack[1-2]-n[01-02],login1", "x[009-011]",
             "n[8-11]", "n[01-3]", "a-[1-2]", "n[2,1]", "n1,n1", "n[1-2],m[1]", "r[1-2]c[3-4]n[5-6]"]


def test_hostlists_expand_as_scontrol_does(tmp_path: Path) -> None:
    """Against Slurm's own `scontrol show hostnames` (a minimal slurm.conf; no daemon needed)."""
    assert expand_hostlist("") == []
    with pytest.raises(ValueError, match="bad host list"):
        expand_hostlist("n[3-1]")
    if not shutil.which("scontrol"):
        pytest.skip("scontrol is not installed")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    for spec in HOSTLISTS:
        out = subprocess.run(["scontrol", "show", "hostnames", spec], env={**os.environ, "SLURM_CONF": str(conf)},
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, (spec, out.stderr)
        slurm = out.stdout.split()
        if spec.count("[") - spec.count(",") > 2:  # three bracket groups in one name: Slurm's own order
            assert sorted(expand_hostlist(spec)) == sorted(slurm), spec
        else:
            assert expand_hostlist(spec) == slurm, spec


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
