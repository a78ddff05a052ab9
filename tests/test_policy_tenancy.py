"""A co-tenant cannot turn the policy on another user's job (issue 64), on the real two-node Slurm
cluster: user nobody's job shares node n1 with another user's busy job, holds its own GPU idle and,
from inside its job and from a process outside any job, sends steps, phases and events that name the
other job (SLURM_JOB_ID forged in the sender's environment, which the agent reads from /proc). The
idle policy warns and cancels nobody's job only; the other job runs on, with no policy action, no
flag and none of the forged events stored as its own."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .agents import unprivileged_python
from .conftest import start_collector, stop_collector
from .slurm_cluster import SlurmCluster, available
from .test_slurm import configure, query, running_cluster, wait_until
from .test_slurm_policy import RULES, job_state

pytestmark = [pytest.mark.skipif(available() is not None, reason=f"Slurm cluster: {available()}"),
              pytest.mark.skipif(os.geteuid() != 0, reason="a co-tenant job of user nobody needs root")]

SENDER = """
import time
from jobpulse.agent import client as jp
end = time.monotonic() + 240
while time.monotonic() < end:  # the other job's "progress", as an impostor would send it
    jp.step(1, samples=8)
    with jp.phase("checkpoint"):
        jp.event("the other job is fine, keep it")
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def shared_node(fake_nvml: Path) -> Iterator[SlurmCluster]:
    with running_cluster(fake_nvml, SlurmCluster, sm=(90, 0)) as c:  # GPU 0 busy, GPU 1 idle on each node
        yield c


def test_a_co_tenant_cannot_make_the_policy_act_on_another_users_job(shared_node: SlurmCluster, dsn: str,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    c = shared_node
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    found = unprivileged_python("nobody")
    assert found, "nobody can run neither this Python nor the system's of its version"
    python, path = found
    nobody = pwd.getpwnam("nobody")
    home = c.root / "tenant"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    (home / "sender.py").write_text(SENDER)
    policy = tmp_path / "policy.toml"
    policy.write_text('[idle_gpu]\nwarn_after_minutes = 0.1\ncancel_after_minutes = 0.2\naction = "cancel"\n'
                      'cluster = "jpcluster"\n')
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1", "--policy", str(policy))
    outside = None
    try:
        configure(c, collector.url)
        victim = c.sbatch("-N1", "-w", "n1", "--gres=gpu:1", f"--output={c.root}/out-%j.txt",
                          script="#!/bin/bash\nsleep 300\n")  # root's job: GPU 0, busy
        wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.jobs WHERE job_id = %s", victim)[0][0] == 1,
                   90, "the victim's registration")
        env = f"env SLURM_JOB_ID={victim} SLURM_PROCID=0" + (f" PYTHONPATH={path}" if path else "")
        tenant = c.sbatch("-N1", "-w", "n1", "--gres=gpu:1", "--uid=nobody", f"--output={home}/out-%j.txt",
                          script=f"#!/bin/bash\ncd {home}\n{env} {python} {home}/sender.py\n")  # GPU 1, idle
        wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.jobs WHERE job_id = %s", tenant)[0][0] == 1,
                   90, "the co-tenant's registration")
        socket = next((c.root / "jp").glob("n1/run/events.sock"))
        outside = subprocess.Popen(  # a process of nobody outside any job, on the node, naming the victim
            [python, str(home / "sender.py")], cwd=home, user=nobody.pw_uid, group=nobody.pw_gid,
            env={"SLURM_JOB_ID": victim, "SLURM_PROCID": "0", "JOBPULSE_EVENTS_SOCKET": str(socket),
                 "PATH": "/usr/bin:/bin", **({"PYTHONPATH": path} if path else {})})
        done = c.wait_done(tenant, timeout=180)
        assert done["job_state"] == "CANCELLED", done  # its own idle GPU: warned, then cancelled
        assert [a for (a,) in query(dsn, "SELECT action FROM jobpulse.policy_actions WHERE job_id = %s ORDER BY at",
                                    tenant)] == ["warned", "cancelled"]
        time.sleep(5)  # rule cycles after the co-tenant's end, the outside sender still sending
        assert job_state(c, victim)["JobState"] == "RUNNING"
        assert query(dsn, "SELECT count(*) FROM jobpulse.policy_actions WHERE job_id = %s", victim) == [(0,)]
        assert query(dsn, "SELECT rule_id FROM jobpulse.job_flags WHERE job_id = %s AND rule_id IN ('idle_gpu', 'hung',"
                          " 'low_utilization')", victim) == []
        assert query(dsn, "SELECT count(*) FROM jobpulse.events WHERE job_id = %s AND uid = %s",
                     victim, nobody.pw_uid) == [(0,)]
        subprocess.run(["scancel", victim], env=c.env, check=True, timeout=30)
        c.wait_done(victim, timeout=120)
    finally:
        if outside is not None:
            outside.kill()
            outside.wait()
        stop_collector(collector)
        shutil.rmtree(home, ignore_errors=True)
