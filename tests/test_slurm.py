"""jobpulse on a real two-node Slurm cluster (slurmctld + two slurmd from Debian's packages):
the project's prolog, epilog and task prolog start agents on the fake NVML library, jobs run
with srun ranks, and everything lands in PostgreSQL through a real collector."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from jobpulse.agent.slurm.sync import script_hash
from jobpulse.collector.embedded.postgres import free_port

from .agents import Scenario, unprivileged_python
from .conftest import TOKEN, RunningCollector, start_collector, stop_collector
from .slurm_cluster import NODES, SlurmCluster, available

pytestmark = pytest.mark.skipif(available() is not None, reason=f"Slurm cluster: {available()}")

SLURM_DIR = Path(__file__).resolve().parent.parent / "slurm"
RANK = """
import json, os, time
from jobpulse.agent import client as jp
rank = int(os.environ["SLURM_PROCID"])
with jp.phase("work"):
    jp.event(f"rank {rank} on {os.environ['SLURMD_NODENAME']}")
    time.sleep(float(os.environ.get("WORK_S", "3")))
    jp.step(1, samples=8)
print(json.dumps({"rank": rank, "pid": os.getpid(), "node": os.environ["SLURMD_NODENAME"],
                  "socket": os.environ.get("JOBPULSE_EVENTS_SOCKET")}), flush=True)
"""


@pytest.fixture(scope="module")
def cluster(fake_nvml: Path) -> Iterator[SlurmCluster]:
    with running_cluster(fake_nvml, SlurmCluster) as c:
        yield c


@contextmanager
def running_cluster(fake_nvml: Path, kind: type[SlurmCluster], parent: str | None = None,
                    sm: tuple[int, int] = (70, 40)) -> Iterator[SlurmCluster]:
    """A started cluster of ``kind`` with the project's hooks, one scenario per node (its two GPUs at
    ``sm`` % utilization), a token."""
    root = Path(tempfile.mkdtemp(prefix="jobpulse-slurm-", dir=parent))
    os.chmod(root, 0o755)
    hooks = root / "slurm"
    shutil.copytree(SLURM_DIR, hooks, ignore=shutil.ignore_patterns("examples", "__pycache__"))
    for node in NODES:
        (Scenario()
         .add(f"driver {'535.104.05' if node == 'n2' else '550.54.15'}")  # n2 is the odd one out
         .gpu(0, f"GPU-{node}-0", "00000000:17:00.0", minor=0, sm=sm[0], mem=30, fb_total_mib=81_559,
              fb_used_mib=9000, power_mw=300_000)
         .gpu(1, f"GPU-{node}-1", "00000000:65:00.0", minor=1, sm=sm[1], mem=10, fb_total_mib=81_559,
              fb_used_mib=5000, power_mw=200_000)
         .write(root / f"{node}.scn"))
    (root / "rank.py").write_text(RANK)
    (root / "token").write_text(TOKEN + "\n")
    c = kind(root, hooks / "prolog.sh", hooks / "epilog.sh", hooks / "task_prolog.sh")
    c.fake_nvml = fake_nvml  # type: ignore[attr-defined]
    try:
        c.start()
        yield c
    finally:
        c.stop()
        for node in NODES:  # agents the prologs started, if a test left one behind
            agent_pids(root, node, kill=True)
        if not os.environ.get("JOBPULSE_KEEP_SLURM"):
            shutil.rmtree(root, ignore_errors=True)


def configure(c: SlurmCluster, collector_url: str, interval: float = 0.5) -> None:
    """jobpulse.conf beside the hooks (read by every prolog and epilog)."""
    (c.root / "slurm" / "jobpulse.conf").write_text(f"""
JOBPULSE_PYTHON={sys.executable}
JOBPULSE_COLLECTOR={collector_url}
JOBPULSE_TOKEN_FILE={c.root}/token
JOBPULSE_INTERVAL={interval}
JOBPULSE_RUNTIME_DIR={c.root}/jp/%n/run
JOBPULSE_SPOOL_DIR={c.root}/jp/%n/spool
JOBPULSE_LOG_DIR={c.root}/jp/%n/log
JOBPULSE_AGENT_ARGS="--flush-interval 0.5"
LD_LIBRARY_PATH={c.fake_nvml}
FAKE_NVML_SCENARIO={c.root}/%n.scn
JOBPULSE_GRES_CONF={c.conf.parent}/gres.conf
JOBPULSE_MIG_MINORS={c.root}/mig-minors
JOBPULSE_ADMIN_COMMENT_WAIT=0
""")


def agent_pids(root: Path, node: str, kill: bool = False) -> list[int]:
    """Agents serving ``node`` (found by their control socket path on the command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"jobpulse.agent.cli" in cmd and f"{root}/jp/{node}/run/agent.sock".encode() in cmd:
            found.append(int(entry))
            if kill:
                os.kill(int(entry), 9)
    return found


def query(dsn: str, sql: str, *params: object) -> list[tuple]:  # type: ignore[type-arg]
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def batch_script(c: SlurmCluster, *lines: str, srun: str = "srun") -> str:
    return "\n".join(["#!/bin/bash", *lines, f"{srun} {sys.executable} {c.root}/rank.py", "exit 3", ""])


def ranks_of(c: SlurmCluster, job: str) -> list[dict[str, object]]:
    out = (c.root / f"out-{job}.txt").read_text()
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def slurm_sync(c: SlurmCluster, collector: RunningCollector) -> None:
    """One run of the cluster-wide `jobpulse-agent slurm-sync` (as on the controller's host)."""
    subprocess.run([sys.executable, "-m", "jobpulse.agent", "slurm-sync", "--once", "--collector", collector.url,
                    "--token-file", str(c.root / "token"), "--node", "ctld", "--cluster", "jpcluster",
                    "--spool-dir", str(c.root / "sync-spool")], env=c.env, check=True, capture_output=True, timeout=60)


def prolog_ms(c: SlurmCluster, node: str) -> list[float]:
    text = (c.root / "jp" / node / "log" / "prolog.log").read_text()
    return [float(ms) for ms in re.findall(r"\((\d+) ms\)", text)]


def test_two_node_job_with_ranks_events_and_hooks(cluster: SlurmCluster, collector: RunningCollector,
                                                  dsn: str) -> None:
    configure(cluster, collector.url)
    script = batch_script(cluster)
    job = cluster.sbatch("-N2", "--ntasks-per-node=2", "--gres=gpu:2", "--job-name=llm-train",
                         "--comment=jobpulse: interval=0.25 tags=project:llm,stage:pretrain",
                         f"--output={cluster.root}/out-%j.txt", "--mem=500M", script=script)
    cluster.wait_done(job)
    # After the epilog the agents send what is left and stop by themselves.
    for node in NODES:
        wait_until(lambda: not agent_pids(cluster.root, node), 30, f"the agent on {node} to exit")

    slurm_sync(cluster, collector)  # what only slurmctld knows: job name, time limit, submit time
    ranks = ranks_of(cluster, job)
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    assert all(r["socket"] == f"{cluster.root}/jp/{r['node']}/run/events.sock" for r in ranks)  # task prolog
    row = query(dsn, "SELECT user_name, partition, job_name, nodes, state, exit_code, end_time IS NOT NULL, tags,"
                     " submit_time IS NOT NULL, time_limit_s FROM jobpulse.jobs WHERE job_id = %s", job)
    assert row and row[0][:7] == ("root", "gpu", "llm-train", ["n1", "n2"], "FAILED", 3, True)
    assert row[0][7] == {"project": "llm", "stage": "pretrain"} and row[0][8] is True  # hook tags; slurm-sync
    # slurm-sync: what the job was given (4 tasks of one CPU, 500 MB on each of 2 nodes) and its script's hash
    assert query(dsn, "SELECT cpus, mem_mib, script_hash FROM jobpulse.jobs WHERE job_id = %s", job) == [
        (4, 1000, script_hash(script))]
    gpus = dict(query(dsn, "SELECT gpu_uuid, count(*) FROM jobpulse.gpu_samples WHERE job_id = %s GROUP BY 1", job))
    assert set(gpus) == {"GPU-n1-0", "GPU-n1-1", "GPU-n2-0", "GPU-n2-1"}
    # The hook's 0.25 s interval (the default in this configuration is 0.5 s).
    gaps = [r[0] for r in query(dsn, "SELECT extract(epoch from ts - lag(ts) OVER (ORDER BY ts))::float8"
                                     " FROM jobpulse.gpu_samples WHERE job_id = %s AND gpu_uuid = 'GPU-n1-0'", job)
            if r[0] is not None]
    assert gaps and sorted(gaps)[len(gaps) // 2] == pytest.approx(0.25, abs=0.06)
    procs = {(r[0], r[1]): r[2:] for r in query(
        dsn, "SELECT DISTINCT node, pid, rank, step FROM jobpulse.process_samples WHERE job_id = %s", job)}
    for r in ranks:
        assert procs[(r["node"], r["pid"])] == (r["rank"], "0")
    events = query(dsn, "SELECT node, pid, rank, message FROM jobpulse.events WHERE job_id = %s AND kind = 'log'", job)
    assert sorted((e[0], e[1], e[2]) for e in events) == sorted((r["node"], r["pid"], r["rank"]) for r in ranks)
    phases = query(dsn, "SELECT rank, phase FROM jobpulse.job_phases WHERE job_id = %s", job)
    assert sorted(phases) == [(r, "work") for r in range(4)]


def test_two_jobs_sharing_a_node_keep_their_gpus(cluster: SlurmCluster, collector: RunningCollector,
                                                 dsn: str) -> None:
    configure(cluster, collector.url)
    jobs = [cluster.sbatch("-N1", "-w", "n1", "-n1", "--gres=gpu:1", f"--output={cluster.root}/out-%j.txt",
                           script=batch_script(cluster)) for _ in range(2)]
    for job in jobs:
        cluster.wait_done(job)
    wait_until(lambda: not agent_pids(cluster.root, "n1"), 30, "the agent on n1 to exit")
    owner = dict(query(dsn, "SELECT gpu_uuid, array_agg(DISTINCT job_id) FROM jobpulse.job_gpus GROUP BY 1"))
    assert sorted(map(tuple, owner.values())) == [(jobs[0],), (jobs[1],)], owner  # one GPU each
    for gpu, (job,) in owner.items():
        others = query(dsn, "SELECT count(*) FROM jobpulse.gpu_samples WHERE gpu_uuid = %s AND job_id IS NOT NULL"
                            " AND job_id <> %s", gpu, job)[0][0]
        assert others == 0
        assert query(dsn, "SELECT count(*) FROM jobpulse.gpu_samples WHERE gpu_uuid = %s AND job_id = %s",
                     gpu, job)[0][0] > 0
    for job in jobs:
        (rank,) = ranks_of(cluster, job)
        assert query(dsn, "SELECT DISTINCT job_id FROM jobpulse.process_samples WHERE pid = %s", rank["pid"]) == [(job,)]


def test_collector_down_for_the_whole_job(cluster: SlurmCluster, dsn: str, tmp_path: Path) -> None:
    port = free_port()  # nothing listens here while the job runs
    configure(cluster, f"http://127.0.0.1:{port}")
    before = {node: len(prolog_ms(cluster, node)) if (cluster.root / "jp" / node / "log" / "prolog.log").exists()
              else 0 for node in NODES}
    job = cluster.sbatch("-N1", "-w", "n2", "-n1", "--gres=gpu:2", f"--output={cluster.root}/out-%j.txt",
                         "--export=ALL,WORK_S=2", script=batch_script(cluster))
    state = cluster.wait_done(job)
    assert state.get("job_state") in (None, "FAILED", "COMPLETED")  # ran to its end (exit 3), not held up
    (rank,) = ranks_of(cluster, job)
    spent = prolog_ms(cluster, "n2")[before["n2"]:]
    assert spent and max(spent) < 10_000  # within the hook's hard bound, even with no collector
    assert agent_pids(cluster.root, "n2"), "the agent must wait for the collector with data in its spool"
    collector: RunningCollector | None = None
    try:
        collector = start_collector(dsn, tmp_path, port=port)
        wait_until(lambda: not agent_pids(cluster.root, "n2"), 60, "the spool to drain and the agent to exit")
    finally:
        stop_collector(collector)
    assert query(dsn, "SELECT state, exit_code FROM jobpulse.jobs WHERE job_id = %s", job) == [("FAILED", 3)]
    assert query(dsn, "SELECT count(*) FROM jobpulse.gpu_samples WHERE job_id = %s", job)[0][0] > 0
    assert query(dsn, "SELECT count(*) FROM jobpulse.events WHERE job_id = %s AND pid = %s", job,
                 rank["pid"])[0][0] >= 1


def test_validation_job_on_both_nodes_reports_the_odd_one(cluster: SlurmCluster, collector: RunningCollector,
                                                          dsn: str) -> None:
    configure(cluster, collector.url)
    env = {**os.environ, "LD_LIBRARY_PATH": str(cluster.fake_nvml), "FAKE_NVML_SCENARIO": f"{cluster.root}/n1.scn"}
    expect = cluster.root / "expect.toml"  # recorded on a known-good node, as an admin would
    subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", "validate", "--record", str(expect)], env=env,
                   check=True, capture_output=True, timeout=60)
    validate = (f"LD_LIBRARY_PATH={cluster.fake_nvml} FAKE_NVML_SCENARIO={cluster.root}/$SLURMD_NODENAME.scn "
                f"{sys.executable} -m jobpulse.agent.cli validate --expect {expect} --node $SLURMD_NODENAME "
                f"--cluster jpcluster --collector {collector.url} --token-file {cluster.root}/token")
    job = cluster.sbatch("-N2", "--ntasks-per-node=1", "--gres=gpu:2", f"--output={cluster.root}/out-%j.txt",
                         "--comment=jobpulse: off", script=f"#!/bin/bash\nsrun bash -c '{validate}'\nexit 0\n")
    cluster.wait_done(job)
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "validate", "report", "--dsn", dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "jpcluster/n1: ok" in out.stdout
    assert "jpcluster/n2: FAIL" in out.stdout
    assert "fail driver_version: observed 535.104.05, expected 550.54.15" in out.stdout


# What task/cgroup does on a cluster that limits memory: the job's processes in the job's own memory
# cgroup (Slurm's v1 layout) with a limit, here 64 MiB against a 512 MiB allocation; the kernel kills.
OOM_SCRIPT = """#!/bin/bash
cg=/sys/fs/cgroup/memory/slurm_$SLURMD_NODENAME/uid_$(id -u)/job_$SLURM_JOB_ID
mkdir -p $cg && echo 67108864 > $cg/memory.limit_in_bytes && echo $$ > $cg/cgroup.procs
{python} -c 'bytearray(512 * 1024 * 1024)'
"""


def test_jobpulse_watch_inside_a_job_beside_the_sites_agent(cluster: SlurmCluster, collector: RunningCollector,
                                                            dsn: str) -> None:
    """A researcher's `jobpulse watch` in a batch script on a node where the site's prolog already
    started an agent: both watch the job, each into its own database, and nothing clashes."""
    configure(cluster, collector.url)
    script = "\n".join([
        "#!/bin/bash", f"export LD_LIBRARY_PATH={cluster.fake_nvml} FAKE_NVML_SCENARIO={cluster.root}/n1.scn",  # type: ignore[attr-defined]
        f"{sys.executable} -m jobpulse.collector.cli watch --dir {cluster.root}/watch-$SLURM_JOB_ID -- "
        f"{sys.executable} {cluster.root}/rank.py", ""])
    job = cluster.sbatch("-N1", "-w", "n1", "-n1", "--gres=gpu:1", f"--output={cluster.root}/out-%j.txt",
                         script=script)
    done = cluster.wait_done(job, timeout=180)
    out = (cluster.root / f"out-{job}.txt").read_text()
    assert done["job_state"] == "COMPLETED", out
    assert f"jobpulse watch: watching job {job} on n1 (1 GPUs)" in out, out
    assert f"jobpulse: job {job} (watch)" in out and "COMPLETED after" in out and "n1/GPU" in out, out
    assert list((cluster.root / f"watch-{job}").glob("report-*.html"))
    rank = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert rank["socket"].startswith("/tmp/jpw-"), "the watch's events socket, not the site's"
    wait_until(lambda: query(dsn, "SELECT 1 FROM jobpulse.gpu_samples WHERE job_id = %s", job), 30,
               "the site's agent's samples of the same job")
    wait_until(lambda: not agent_pids(cluster.root, "n1"), 30, "the site's agent on n1 to exit")  # as jobs find it


def test_jobpulse_watch_of_a_users_two_node_job(cluster: SlurmCluster, collector: RunningCollector) -> None:
    """The two lines a researcher adds, in a two-node job of an unprivileged user (nobody): one
    `jobpulse watch` on the first node starts the database and collector there and, with `srun
    --overlap`, an agent on the other node; the summary at the end covers both nodes' GPUs. (The
    site's prologs watch the job too, into the site's collector.)"""
    import pwd

    configure(cluster, collector.url)
    user = pwd.getpwnam("nobody")
    folder = cluster.root / "watch-nobody"
    folder.mkdir()
    os.chown(folder, user.pw_uid, user.pw_gid)
    nvml = cluster.root / "nvml"  # the fake library where the user may read it (pytest's folders are root's)
    shutil.copytree(cluster.fake_nvml, nvml)  # type: ignore[attr-defined]
    nvml.chmod(0o755)
    found = unprivileged_python("nobody")
    assert found, "nobody can run neither this Python nor the system's of its version"
    python, path = found
    script = "\n".join([
        "#!/bin/bash",
        f"export LD_LIBRARY_PATH={nvml} FAKE_NVML_SCENARIO={cluster.root}/n1.scn HOME={folder} WORK_S=8",
        f"export PYTHONPATH={path}" if path else "",
        f"{python} -m jobpulse.collector.cli watch --dir {folder}/jp-$SLURM_JOB_ID -- "
        f"srun {python} {cluster.root}/rank.py", ""])
    job = cluster.sbatch("-N2", "--ntasks-per-node=1", "--gres=gpu:1", "--uid=nobody",
                         f"--output={folder}/out-%j.txt", script=script)
    done = cluster.wait_done(job, timeout=240)
    out = (folder / f"out-{job}.txt").read_text()
    nodes = (folder / f"jp-{job}" / "nodes.log").read_text()
    assert done["job_state"] == "COMPLETED", out + nodes
    # each node watches the GPU Slurm gave the job there (n2's from slurmctld: the batch's are n1's)
    assert f"jobpulse watch: watching job {job} on n1 (1 GPUs)" in out, out
    assert f"jobpulse watch: watching job {job} on n2 (1 GPUs)" in nodes, nodes
    assert f"jobpulse: job {job} (watch)" in out and "COMPLETED after" in out and "on 2 GPUs (n1, n2)" in out, out
    assert "n2/GPU" in out and list((folder / f"jp-{job}").glob("report-*.html"))
    assert (folder / f"jp-{job}" / "postgres").stat().st_uid == user.pw_uid  # the user's own database
    for node in NODES:  # the site's agents deliver the job to the site's collector and leave
        wait_until(lambda: not agent_pids(cluster.root, node), 30, f"the site's agent on {node} to exit")


def test_how_jobs_end_as_slurm_names_it(cluster: SlurmCluster, collector: RunningCollector, dsn: str) -> None:
    """A failed step in a job whose script exits 0, an OOM kill, a cancel, a timeout and a node
    failure: the epilog records what the node can know, `slurm-sync` what only slurmctld knows."""
    configure(cluster, collector.url)
    out = f"--output={cluster.root}/out-%j.txt"
    # The step's end reaches slurmctld apart from the script's; the epilog's SLURM_JOB_DERIVED_EC holds
    # it only if it came first (a loaded machine once had it 0): the script gives it two seconds.
    jobs = {"step": cluster.sbatch("-N1", out, script="#!/bin/bash\nsrun false\nsleep 2\nexit 0\n"),
            "timeout": cluster.sbatch("-N1", "--time=10", out, script="#!/bin/bash\nsleep 600\n"),
            "cancel": cluster.sbatch("-N1", "-w", "n1", out, script="#!/bin/bash\nsleep 600\n"),
            "node_fail": cluster.sbatch("-N1", "-w", "n2", "--no-requeue", out, script="#!/bin/bash\nsleep 600\n")}
    cgroups = Path("/sys/fs/cgroup/memory")
    if cgroups.is_dir() and os.access(cgroups, os.W_OK):  # a v1 memory hierarchy to put the job in
        jobs["oom"] = cluster.sbatch("-N1", out, script=OOM_SCRIPT.format(python=sys.executable))
    # Registered: running (a sched_interval, 60 s, when the nodes were still busy at submission). The
    # timeout job too: slurmctld refuses an EndTime for a job still pending (a loaded CI machine).
    wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.jobs WHERE job_id = ANY(%s)",
                             [jobs["timeout"], jobs["cancel"], jobs["node_fail"]])[0][0] == 3, 90,
               "the jobs to be registered")
    subprocess.run(["scancel", jobs["cancel"]], env=cluster.env, check=True, timeout=30)
    scontrol = ["scontrol", "update", "NodeName=n2"]
    subprocess.run([*scontrol, "State=DOWN", "Reason=jobpulse-test"], env=cluster.env, check=True, timeout=30)
    # Its limit ends in 10 s (slurmctld enforces limits every 30 s; a one-minute wait spared). Not "now":
    # scontrol reads that on its side, and slurmctld refuses an EndTime already past when it handles the
    # request ("Invalid time specified"), as a loaded machine's slurmctld once did a second later.
    subprocess.run(["scontrol", "update", f"JobId={jobs['timeout']}", "EndTime=now+10"], env=cluster.env, check=True,
                   timeout=30)
    try:
        for job in jobs.values():
            cluster.wait_done(job, timeout=150)
    finally:
        subprocess.run([*scontrol, "State=RESUME"], env=cluster.env, capture_output=True, timeout=30)  # refused if back
        for cg in sorted(cgroups.glob("slurm_n*/uid_*/job_*"), reverse=True):
            for d in (cg, cg.parent, cg.parent.parent):
                with contextlib.suppress(OSError):  # in use: another cluster's (the chroot versions run beside)
                    d.rmdir() if d.is_dir() and not any(d.glob("*/")) else None
    for node in NODES:
        wait_until(lambda: not agent_pids(cluster.root, node), 30, f"the agent on {node} to exit")

    def states() -> dict[str, tuple[str | None, int | None, bool]]:
        rows = query(dsn, "SELECT job_id, state, exit_code, end_time IS NOT NULL FROM jobpulse.jobs"
                          " WHERE job_id = ANY(%s)", list(jobs.values()))
        return {what: next(r[1:] for r in rows if r[0] == job) for what, job in jobs.items()}

    # The epilog: the step's exit code; the kernel's OOM kill; the node cannot tell a cancel or a
    # timeout from a clean end (Slurm 22.05 hands it status 0), so it leaves the state to slurmctld.
    by_epilog = states()
    assert by_epilog["step"] == ("FAILED", 1, True)
    assert by_epilog["cancel"] == (None, 0, True) and by_epilog["timeout"] == (None, 0, True)
    assert by_epilog["node_fail"] == (None, 0, True)
    if "oom" in jobs:
        assert by_epilog["oom"] == ("OUT_OF_MEMORY", 137, True)
    slurm_sync(cluster, collector)
    by_controller = states()
    assert by_controller["step"] == ("FAILED", 1, True)
    assert by_controller["cancel"][0] == "CANCELLED" and by_controller["timeout"][0] == "TIMEOUT"
    assert by_controller["node_fail"][0] == "NODE_FAIL"


class ContainedCluster(SlurmCluster):
    """Slurm as sites that contain jobs run it: proctrack/cgroup and task/cgroup (cgroup v1),
    PrologFlags=Contain, and job_container/tmpfs (each job its own mount namespace and /tmp)."""

    def write_config(self) -> None:
        super().write_config()
        conf = self.conf.read_text().replace("ProctrackType=proctrack/linuxproc", "ProctrackType=proctrack/cgroup")
        conf = conf.replace("TaskPlugin=task/none", "TaskPlugin=task/cgroup")
        conf = conf.replace("PrologFlags=Alloc", "PrologFlags=Alloc,Contain")
        self.conf.write_text(conf + "JobContainerType=job_container/tmpfs\n")
        (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
        (self.conf.parent / "job_container.conf").write_text(f"AutoBasePath=true\nBasePath={self.root}/containers\n")


@pytest.mark.skipif(not all(os.access(f"/sys/fs/cgroup/{c}", os.W_OK) for c in ("freezer", "memory", "devices")),
                    reason="needs writable cgroup v1 freezer, memory and devices hierarchies (task/cgroup v1)")
def test_an_agent_the_prolog_starts_stays_outside_the_jobs_cgroup_and_namespace(
        fake_nvml: Path, collector: RunningCollector, dsn: str) -> None:
    """With the job containment sites use, the prolog still runs in slurmd's cgroup and mount
    namespace, so the agent it starts is not the first job's: not killed with it, not charged
    for its memory, not inside its private /tmp. (job_container/tmpfs refuses a base under /tmp.)"""
    with running_cluster(fake_nvml, ContainedCluster, parent="/var/tmp") as c:
        configure(c, collector.url)
        job = c.sbatch("-N1", "-w", "n1", "--gres=gpu:1", f"--output={c.root}/out-%j.txt", script=(
            f"#!/bin/bash\ncat /proc/self/cgroup > {c.root}/job.cgroup\n"
            f"readlink /proc/self/ns/mnt > {c.root}/job.ns\nsleep 3\n"))
        wait_until(lambda: agent_pids(c.root, "n1") and (c.root / "job.ns").exists(), 30, "the job and its agent")
        (agent,) = agent_pids(c.root, "n1")
        agent_cgroup, agent_ns = Path(f"/proc/{agent}/cgroup").read_text(), os.readlink(f"/proc/{agent}/ns/mnt")
        job_cgroup, job_ns = (c.root / "job.cgroup").read_text(), (c.root / "job.ns").read_text().strip()
        c.wait_done(job)
    for left in Path("/sys/fs/cgroup").glob("*/slurm_n[12]"):  # what slurmd leaves behind, once empty
        try:
            left.rmdir()
        except OSError:
            pass
    assert f"/job_{job}/" in job_cgroup and job_ns != os.readlink("/proc/self/ns/mnt"), "containment is on"
    assert "/job_" not in agent_cgroup and agent_ns == os.readlink("/proc/self/ns/mnt")
    assert query(dsn, "SELECT count(*) FROM jobpulse.gpu_samples WHERE job_id = %s", job)[0][0] > 0

