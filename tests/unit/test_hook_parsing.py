"""The prolog's parsing of what researchers and Slurm hand it, and the sync's of squeue --json (runs
without a cluster)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobpulse.agent.slurm.env import HookError, end_state, gpu_share, job_gpus, job_metadata, parse_hooks, shares_gpus
from jobpulse.agent.slurm.gres_conf import GresConfError, GresGpu, mig_minors, node_gpus
from jobpulse.agent.slurm.hooks import expand_hostlist
from jobpulse.agent.slurm.sync import job_records


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
    assert not list((tmp_path / "run" / "agent.sock.queue").iterdir())  # nothing left for an agent that never came


def test_end_state_from_the_epilog_environment() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    limit = str(int(now.timestamp()) - 1)
    cases = [({"SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_DERIVED_EC": "0"}, False, (None, 0)),  # slurmctld knows
             ({"SLURM_JOB_EXIT_CODE": "768", "SLURM_JOB_DERIVED_EC": "0"}, False, ("FAILED", 3)),
             ({"SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_DERIVED_EC": "256"}, False, ("FAILED", 1)),  # a step failed
             ({"SLURM_JOB_EXIT_CODE": "9"}, False, ("FAILED", 137)),  # the script killed itself: 128 + 9
             ({"SLURM_JOB_EXIT_CODE": "35072"}, True, ("OUT_OF_MEMORY", 137)),
             ({"SLURM_JOB_EXIT_CODE": "253", "SLURM_JOB_DERIVED_EC": "0"}, False, ("OUT_OF_MEMORY", 0)),  # task/cgroup
             # the epilog's end time is the job's end (24.11, 26.05), not its limit: slurmctld names a timeout
             ({"SLURM_JOB_EXIT_CODE": "0", "SLURM_JOB_END_TIME": limit}, False, (None, 0)),
             ({}, False, (None, 0))]
    for env, oom, expected in cases:
        assert end_state(env, oom) == expected, env


def test_a_jobs_gpus_from_the_prolog_environment_mig_slices_by_name() -> None:
    assert job_gpus({"SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "1,3"}) == ["1", "3"]
    assert job_gpus({"SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "MIG-5c1f, MIG-GPU-9a/7/0"}) == [
        "MIG-5c1f", "MIG-GPU-9a/7/0"]
    assert job_gpus({}) == []
    mps = {"SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    assert gpu_share(mps) == 0.25 and gpu_share({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1250"}) == 1.0
    assert gpu_share({"SLURM_JOB_GPUS": "0"}) is None and gpu_share({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "0"}) is None
    assert shares_gpus({"SLURM_SHARDS_ON_NODE": "2"}) and not shares_gpus({"SLURM_JOB_GPUS": "0"})


GRES_CONF = """
AutoDetect=off  # as slurmd reads it: keys any case, `#` comments
NodeName=n[1-2] Name=gpu Type=a100 File=/dev/nvidia1
nodename=n1 name=gpu type=1g.10gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/nvidia-cap84,\\
/dev/nvidia-caps/nvidia-cap85
NodeName=n1 Name=shard Count=8 File=/dev/nvidia0
NodeName=n3 Name=gpu File=/dev/nvidia[0-3]
NodeName=n4 Name=gpu AutoDetect=nvml
Name=gpu Type=h100 File=/dev/nvidia[2-3]
"""


def test_gres_indices_follow_gres_conf_lines_in_slurms_order() -> None:
    """A File= range is one index per file, a MultipleFiles= line (a MIG slice) one index; other
    GRES and other nodes' lines count for nothing; AutoDetect leaves the order to slurmd."""
    caps = ("/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap84", "/dev/nvidia-caps/nvidia-cap85")
    assert node_gpus(GRES_CONF, "n1") == [GresGpu(0, "a100", ("/dev/nvidia1",)), GresGpu(1, "1g.10gb", caps),
                                         GresGpu(2, "h100", ("/dev/nvidia2",)), GresGpu(3, "h100", ("/dev/nvidia3",))]
    assert [g.files for g in node_gpus(GRES_CONF, "n3") or []] == [(f"/dev/nvidia{i}",) for i in (0, 1, 2, 3, 2, 3)]
    assert node_gpus(GRES_CONF, "n4") is None and node_gpus("AutoDetect=nvml\n" + GRES_CONF, "n1") is None
    assert node_gpus("NodeName=n1 Name=gpu Count=2\n", "n1") is None  # no files: indices are all Slurm has
    with pytest.raises(GresConfError, match="Type"):
        node_gpus("NodeName=n1 Name=gpu Type\n", "n1")


def test_a_gres_conf_the_prolog_cannot_read_leaves_the_indices_as_slurm_gave_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "gres.conf"
    broken.write_text("NodeName=n1 Name=gpu Type\n")
    env = {"SLURM_JOB_GPUS": "1,3", "SLURMD_NODENAME": "n1"}
    assert job_gpus(env, broken) == ["1", "3"]
    assert "Type" in capsys.readouterr().err


def test_mig_minors_table_names_gpu_and_compute_instances() -> None:
    table = "config 1\nmonitor 2\ngpu0/gi9/access 84\ngpu0/gi9/ci0/access 85\ngpu1/gi0/access 138\n"
    assert mig_minors(table) == {84: "gpu0/gi9", 85: "gpu0/gi9/ci0", 138: "gpu1/gi0"}


def test_job_metadata_comes_from_the_prolog_environment() -> None:
    env = {"SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000", "SLURM_JOB_ACCOUNT": "ml", "SLURM_JOB_PARTITION": "gpu",
           "SLURM_JOB_START_TIME": "1767268800", "SLURM_JOB_END_TIME": "1767272400", "SLURM_JOB_NAME": "(null)"}
    assert job_metadata(env) == {"user_name": "alice", "uid": "1000", "account": "ml", "partition": "gpu",
                                 "start_time": "2026-01-01T12:00:00+00:00", "time_limit_s": 3600}


def test_the_controllers_view_from_squeue_json_of_two_slurm_versions() -> None:
    ran = {"start_time": 1767268810}
    old = {"jobs": [{"job_id": 5, "job_state": "CANCELLED", "exit_code": 15, "derived_exit_code": 0, "name": "a",
                     "account": "ml", "time_limit": 10, "submit_time": 1767268800, "end_time": 1767268900, **ran},
                    {"job_id": 6, "job_state": "COMPLETED", "exit_code": 0, "derived_exit_code": 256, **ran},
                    {"job_id": 7, "job_state": "RUNNING", "name": "b", "time_limit": {"set": True, "infinite": True,
                                                                                      "number": 0}, **ran},
                    {"job_id": 9, "job_state": "PENDING", "start_time": 1767270000},  # an estimate: not ours
                    {"job_id": 10, "job_state": "CANCELLED", "start_time": 1767268900, "end_time": 1767268900},
                    {"job_id": 11, "job_state": "COMPLETED", "comment": "jobpulse: off", **ran}]}
    new = {"jobs": [{"job_id": 8, "job_state": ["TIMEOUT"], "name": "c",
                     "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "number": 0}},
                     "time_limit": {"set": True, "infinite": False, "number": 1},
                     "submit_time": {"set": True, "number": 1767268800},
                     "start_time": {"set": True, "number": 1767268810}}]}
    got = {r.job_id: r for r in job_records(json.dumps(old)) + job_records(json.dumps(new))}
    assert (got["5"].state, got["5"].exit_code, got["5"].job_name, got["5"].time_limit_s) == ("CANCELLED", 0, "a", 600)
    assert got["5"].end_time is not None and got["5"].submit_time is not None
    assert (got["6"].state, got["6"].exit_code) == ("FAILED", 1)  # as the epilog names a failed step
    assert (got["7"].state, got["7"].time_limit_s, got["7"].end_time) == ("RUNNING", None, None)  # still running
    assert (got["8"].state, got["8"].time_limit_s) == ("TIMEOUT", 60)
    assert not {"9", "10", "11"} & set(got)  # pending, cancelled while pending, monitoring off
