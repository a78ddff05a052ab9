"""jobpulse on each Slurm a site runs: 22.05 (the host's), 24.11 and 26.05 (Debian chroots,
`tests/slurm_chroot.py`), real slurmctld, two slurmd and slurmdbd of that version. The project's
prolog and epilog run inside that version's slurmd; `slurm-sync` reads that version's squeue; the
collector's policy cancels with that version's scancel; slurmctld sends its end mail through the
project's MailProg; `jobpulse watch` starts its other node's agent with that version's `srun
--overlap`; with proctrack/cgroup the agent attributes a job's processes through the cgroup that
version's slurmd made. The rest of the Slurm tier runs on 22.05."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import slurm_chroot
from .agents import Scenario
from .conftest import RunningCollector, start_collector, stop_collector
from .slurm_cluster import NODES, AccountingCluster, ChrootCluster, SlurmCluster, accounting_available
from .test_job_mail import Inbox, smtp  # noqa: F401  (smtp: the fixture, a real SMTP server on loopback)
from .test_slurm import agent_pids, configure, query, running_cluster, wait_until

RULES = Path(__file__).parent / "data" / "rules_fast.toml"

VERSIONS = (SlurmCluster.version, *slurm_chroot.SUITES)


def _why_not(version: str) -> str | None:
    return accounting_available() or (None if version == SlurmCluster.version else slurm_chroot.unavailable(version))


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"slurm-{v}") for v in VERSIONS])
def cluster(request: pytest.FixtureRequest, fake_nvml: Path) -> Iterator[SlurmCluster]:
    version = request.param
    why = _why_not(version)
    if why:
        pytest.skip(f"Slurm {version}: {why}")

    def kind(*paths: Path) -> SlurmCluster:
        return AccountingCluster(*paths) if version == SlurmCluster.version else ChrootCluster(*paths, version=version)

    with running_cluster(fake_nvml, kind) as c:  # type: ignore[arg-type]
        yield c


JOBS = {  # kind -> (sbatch options, script body, (state, exit code) jobpulse records)
    "exit0": (["-N2", "--ntasks-per-node=1", "--gres=gpu:1"], "srun {python} {root}/rank.py\nexit 0", ("COMPLETED", 0)),
    "exit3": (["-N1"], "sleep 2\nexit 3", ("FAILED", 3)),
    "first_second": (["-N1"], "exit 3", ("FAILED", 3)),
    "signal": (["-N1"], "sleep 2\nkill -9 $$", ("FAILED", 137)),
    "failed_step": (["-N1"], "srun false\nsleep 2\nexit 0", ("FAILED", 1)),
    "timeout": (["-N1", "--time=10"], "sleep 600", ("TIMEOUT", 0)),
}
SAID_EITHER = {"timeout": {("TIMEOUT", 0), ("TIMEOUT", 143)}}
"""Where Slurm itself records one of two: a timed-out job's exit code names the SIGTERM that ended its
batch shell (143) or no signal (0); 26.05 gave 143 once under a full suite's load, 0 alone."""


def test_jobs_end_as_each_version_says(cluster: SlurmCluster, collector: RunningCollector, dsn: str) -> None:
    """Prolog registration and epilog end on two nodes; the sync's states and exit codes for jobs
    that exit 0, exit 3, fail in their first second, are killed by a signal, have a failed step or
    time out; the run (Slurm's restart count)."""
    configure(cluster, collector.url)
    jobs = {kind: cluster.sbatch(*opts, f"--job-name={kind}", f"--output={cluster.root}/out-%j.txt",
                                 script="#!/bin/bash\n" + body.format(python=sys.executable, root=cluster.root) + "\n")
            for kind, (opts, body, _) in JOBS.items()}
    wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.jobs WHERE job_id = %s", jobs["timeout"])[0][0], 90,
               "the timeout job to be registered")
    cluster.run("scontrol", "update", f"JobId={jobs['timeout']}", "EndTime=now+10", check=True)
    for job in jobs.values():
        cluster.wait_done(job, timeout=150)
    for node in NODES:
        wait_until(lambda: not agent_pids(cluster.root, node), 30, f"the agent on {node} to exit")
    sync = cluster.run(sys.executable, "-m", "jobpulse.agent", "slurm-sync", "--once", "--collector", collector.url,
                       "--token-file", str(cluster.root / "token"), "--node", "ctld", "--cluster", "jpcluster",
                       "--spool-dir", str(cluster.root / "sync-spool"), timeout=60)
    assert sync.returncode == 0, sync.stderr
    rows = {r[0]: r[1:] for r in query(dsn, "SELECT job_id, state, exit_code, run, nodes FROM jobpulse.jobs")}
    logs = "".join(p.read_text() for p in (cluster.root / "jp").glob("*/log/*.log"))
    got = {kind: rows[job][:2] if job in rows else None for kind, job in jobs.items()}
    wrong = {kind: (got[kind], end) for kind, (_, _, end) in JOBS.items()
             if got[kind] not in SAID_EITHER.get(kind, {end})}
    assert not wrong, f"(stored, expected) {wrong}; the sync said: {sync.stderr[-3000:]}\n{logs}"
    assert rows[jobs["exit0"]][2:] == (0, ["n1", "n2"])
    gpus = query(dsn, "SELECT DISTINCT node FROM jobpulse.gpu_samples WHERE job_id = %s", jobs["exit0"])
    assert sorted(g[0] for g in gpus) == ["n1", "n2"]  # both nodes' agents, started by that version's prolog


def test_an_admin_comment_reads_back_as_written(cluster: SlurmCluster) -> None:
    """What the idle-GPU policy writes (with quotes, which accounting stores as backticks) reads
    back through the reader as written (22.05 lower-cases it)."""
    job = cluster.sbatch("-N1", f"--output={cluster.root}/out-%j.txt", script="#!/bin/bash\nsleep 1\n")
    cluster.wait_done(job)
    written = 'jobpulse: Warned, "idle" GPUs'
    wait_until(lambda: cluster.run("sacctmgr", "-i", "update", "job", "where", f"jobid={job}", "set",
                                   f"AdminComment={written}").returncode == 0
               and job in cluster.run("sacct", "-n", "-X", "-j", job, "-o", "JobID").stdout, 30, "accounting's job")
    read = "from jobpulse.agent.slurm.admin_comment import current; import sys; print(current(sys.argv[1]))"
    got = cluster.run(sys.executable, "-c", read, job, check=True).stdout.strip()
    assert got == (written.lower() if cluster.version == SlurmCluster.version else written)


def state(record: dict[str, object]) -> str:
    """A job's state in its squeue --json record (a list from 23.02: its first)."""
    found = record["job_state"]
    return str(found[0] if isinstance(found, list) else found)


def admin_comment(c: SlurmCluster, job: str) -> str:
    """The AdminComment `scontrol show job` of the cluster's version prints."""
    out = c.run("scontrol", "show", "job", job, check=True).stdout
    found = re.search(r"\bAdminComment=(.*?)(?=\s+[A-Z][A-Za-z]*=|\n|$)", out)
    return found.group(1) if found else ""


def test_the_idle_and_hang_policies_warn_then_cancel(cluster: SlurmCluster, dsn: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A job holding idle GPUs on n2 and a hung one on n1 (both GPUs at 600 W for 45 s, then spinning
    at 80 W with no traffic past the site's collective timeout, 18 s here: the strong claim), one
    collector with both policies, which calls this version's scontrol and scancel: each job warned,
    then cancelled with its reason in its AdminComment."""
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # the collector's host is a client of this cluster
    monkeypatch.setenv("PATH", cluster.client_path)
    work = dict(sm=95, mem=40, power_mw=600_000, power_limit_mw=700_000, fb_total_mib=81_559, fb_used_mib=50_000,
                pcie_rx_kbs=90_000, pcie_tx_kbs=30_000)
    spin = dict(sm=100, mem=0, power_mw=80_000, pcie_rx_kbs=10, pcie_tx_kbs=10)
    idle = dict(sm=0, mem=0, power_mw=60_000, fb_total_mib=81_559, fb_used_mib=500)
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES.read_text() + "hang_minutes = 0.3\nhang_timeout_minutes = 0.3\n")  # strong past 18 s
    policy = tmp_path / "policy.toml"
    policy.write_text("""
[idle_gpu]
warn_after_minutes = 0.1
cancel_after_minutes = 0.2
action = "cancel"
cluster = "jpcluster"

[hung]
warn_after_minutes = 0
cancel_after_minutes = 0.1
action = "cancel"
cluster = "jpcluster"
""")
    scenarios = {node: (cluster.root / f"{node}.scn", (cluster.root / f"{node}.scn").read_text()) for node in NODES}
    for node in NODES:
        agent_pids(cluster.root, node, kill=True)  # an agent left from an earlier job plays the scenario it read
    collector = start_collector(dsn, tmp_path, "--rules", str(rules), "--rules-interval", "1", "--policy", str(policy))
    jobs: dict[str, str] = {}
    try:
        configure(cluster, collector.url)
        hung, idling = Scenario().add("driver 550.54.15"), Scenario().add("driver 550.54.15")
        for i, bus in enumerate(("00000000:17:00.0", "00000000:65:00.0")):
            hung.gpu(i, f"GPU-n1-{i}", bus, minor=i, **work).set(45, i, **spin)
            idling.gpu(i, f"GPU-n2-{i}", bus, minor=i, **idle)
        hung.write(scenarios["n1"][0])
        idling.write(scenarios["n2"][0])
        out = f"--output={cluster.root}/out-%j.txt"
        jobs = {"hung": cluster.sbatch("-N1", "-w", "n1", "--gres=gpu:2", out, script="#!/bin/bash\nsleep 400\n"),
                "idle": cluster.sbatch("-N1", "-w", "n2", "--gres=gpu:1", out, script="#!/bin/bash\nsleep 400\n")}
        started = time.monotonic()
        ended = {kind: state(cluster.wait_done(job, timeout=240)) for kind, job in jobs.items()}
        print(f"\nSlurm {cluster.version}: both jobs cancelled {time.monotonic() - started:.0f} s after submission")
        assert ended == {"hung": "CANCELLED", "idle": "CANCELLED"}, ended
        for kind, reason in (("hung", "hung since"), ("idle", "idle for")):
            comment = admin_comment(cluster, jobs[kind])
            assert comment.startswith("jobpulse: cancelled,") and reason in comment, (kind, comment)
        actions = query(dsn, "SELECT job_id, policy, action FROM jobpulse.policy_actions ORDER BY at")
        assert [(p, a) for j, p, a in actions if j == jobs["hung"]] == [("hung", "warned"), ("hung", "cancelled")]
        assert [a for j, p, a in actions if j == jobs["idle"] and p == "idle_gpu"] == ["warned", "cancelled"]
    finally:
        for job in jobs.values():
            cluster.run("scancel", job)
        stop_collector(collector)
        for path, text in scenarios.values():
            path.write_text(text)
        for node in NODES:  # they ship to this test's collector, gone: the next job's prolog starts its own
            agent_pids(cluster.root, node, kill=True)


def test_the_end_mail_through_mailprog(cluster: SlurmCluster, dsn: str, tmp_path: Path,
                                       smtp: tuple[Inbox, int]) -> None:  # noqa: F811
    """This version's slurmctld calls the project's MailProg (slurm.conf) with its own subject for a
    job that asked `--mail-type=END`: the mail goes out through SMTP with the job's summary."""
    inbox, port = smtp
    for node in NODES:  # an agent left from an earlier job ships to that test's collector
        agent_pids(cluster.root, node, kill=True)
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1")
    try:
        configure(cluster, collector.url)
        sent = cluster.root / "fallback.log"
        fallback = cluster.root / "mail-fallback"
        fallback.write_text(f"#!/bin/bash\n{{ printf '%s|' \"$@\"; echo; }} >> {sent}\n")
        fallback.chmod(0o755)
        with (cluster.root / "slurm" / "jobpulse.conf").open("a") as conf:
            conf.write(f"JOBPULSE_SMTP=127.0.0.1:{port}\nJOBPULSE_MAIL_FROM=slurm@test\n"
                       f"JOBPULSE_MAIL_FALLBACK={fallback}\nJOBPULSE_MAIL_WAIT=90\n")
        job = cluster.sbatch("-N1", "--gres=gpu:1", "--mail-type=END", "--mail-user=ann@example.org",
                             f"--output={cluster.root}/out-%j.txt", script="#!/bin/bash\nsleep 3\n")
        cluster.wait_done(job)
        wait_until(lambda: inbox.mails or sent.exists(), 120, "the end mail")
        assert not sent.exists(), f"sent unchanged: {sent.read_text()}"
        [(rcpt, message)] = inbox.mails
        subject = " ".join(message["Subject"].split())  # type: ignore[index]
        body = message.get_payload(decode=True).decode()  # type: ignore[union-attr]
        assert rcpt == ["ann@example.org"] and subject.startswith(f"Slurm Job_id={job} ") and " Ended" in subject
        assert body.startswith(f"jobpulse: job {job} (jpcluster)") and "GPU-hours:" in body, body
    finally:
        stop_collector(collector)
        for node in NODES:
            agent_pids(cluster.root, node, kill=True)


def test_watch_of_a_two_node_job_through_srun_overlap(cluster: SlurmCluster, collector: RunningCollector) -> None:
    """`jobpulse watch` in a two-node batch job: this version's `srun --overlap` starts the agent on
    the other node; the summary covers both nodes' GPUs. (As root: the 22.05 tier runs it as an
    unprivileged user.)"""
    pg = [p for p in (Path(getattr(cluster, "chroot", "/")) / "usr/lib/postgresql").glob("*/bin/pg_ctl")]
    if not pg:
        pytest.skip(f"Slurm {cluster.version}: no PostgreSQL server where its jobs run (the watch's database)")
    for node in NODES:  # an agent left from an earlier job ships to that test's collector
        agent_pids(cluster.root, node, kill=True)
    configure(cluster, collector.url)
    folder = cluster.root / "watch-root"
    folder.mkdir()
    folder.chmod(0o755)  # the database folder under it is handed to the postgres user
    script = "\n".join([
        "#!/bin/bash",
        f"export LD_LIBRARY_PATH={cluster.fake_nvml} FAKE_NVML_SCENARIO={cluster.root}/n1.scn WORK_S=8",  # type: ignore[attr-defined]
        f"{sys.executable} -m jobpulse.collector.cli watch --dir {folder}/jp-$SLURM_JOB_ID -- "
        f"srun {sys.executable} {cluster.root}/rank.py", ""])
    job = cluster.sbatch("-N2", "--ntasks-per-node=1", "--gres=gpu:1", f"--output={folder}/out-%j.txt",
                         script=script)
    done = cluster.wait_done(job, timeout=240)
    out = (folder / f"out-{job}.txt").read_text()
    nodes = (folder / f"jp-{job}" / "nodes.log").read_text() if (folder / f"jp-{job}" / "nodes.log").exists() else ""
    assert state(done) == "COMPLETED", out + nodes
    assert f"jobpulse watch: watching job {job} on n1 (1 GPUs)" in out, out
    assert f"jobpulse watch: watching job {job} on n2 (1 GPUs)" in nodes, nodes
    assert f"jobpulse: job {job} (watch)" in out and "on 2 GPUs (n1, n2)" in out and "n2/GPU" in out, out
    for node in NODES:
        wait_until(lambda: not agent_pids(cluster.root, node), 30, f"the site's agent on {node} to exit")


class CgroupChroot(ChrootCluster):
    """A chroot version's cluster that contains jobs in cgroups as sites do: proctrack/cgroup and
    task/cgroup on the cgroup v1 plugin (this kind of machine mounts v1 controllers beside a cgroup2
    hierarchy, a hybrid that Slurm's cgroup/v2 plugin refuses)."""

    def write_config(self) -> None:
        super().write_config()
        conf = self.conf.read_text().replace("ProctrackType=proctrack/linuxproc", "ProctrackType=proctrack/cgroup")
        self.conf.write_text(conf.replace("TaskPlugin=task/none", "TaskPlugin=task/cgroup"))
        (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")


@pytest.mark.parametrize("version", [pytest.param(v, id=f"slurm-{v}") for v in slurm_chroot.SUITES])
def test_a_jobs_processes_through_the_cgroup_its_slurmd_made(version: str, fake_nvml: Path,
                                                             collector: RunningCollector, dsn: str) -> None:
    """The agent attributes a process with no Slurm environment at all (`env -i`) to its job, step
    and node through the cgroup that version's slurmd made, and reads the job's processes from it.
    The directory is named by the job id on every version (26.05 too: its SLUID is in the job's
    environment, not in the cgroup's name). 22.05: `test_slurm.py`'s contained cluster."""
    why = _why_not(version) or (None if all(os.access(f"/sys/fs/cgroup/{c}", os.W_OK) for c in ("freezer", "memory"))
                                else "needs writable cgroup v1 freezer and memory hierarchies (Slurm's cgroup/v1)")
    if why:
        pytest.skip(f"Slurm {version}: {why}")
    with running_cluster(fake_nvml, lambda *paths: CgroupChroot(*paths, version=version)) as c:  # type: ignore[arg-type]
        configure(c, collector.url)
        script = (f"#!/bin/bash\ncat /proc/self/cgroup > {c.root}/job.cgroup\nenv | grep ^SLURM_JOB_SLUID= > "
                  f"{c.root}/job.sluid\nenv -i /bin/sleep 6 & echo $! > {c.root}/bare.pid\nwait\n")
        job = c.sbatch("-N1", "-w", "n1", "--gres=gpu:1", f"--output={c.root}/out-%j.txt", script=script)
        assert state(c.wait_done(job, timeout=120)) == "COMPLETED", c.logs()
        wait_until(lambda: not agent_pids(c.root, "n1"), 30, "the agent on n1 to exit")
        cgroup = (c.root / "job.cgroup").read_text()
        sluid = (c.root / "job.sluid").read_text().strip().partition("=")[2]
        bare = int((c.root / "bare.pid").read_text())
    for left in sorted(Path("/sys/fs/cgroup").glob("*/slurm_n[12]/**/"), key=lambda d: len(d.parts), reverse=True):
        try:
            left.rmdir()  # what slurmd leaves behind, once empty
        except OSError:
            pass
    assert re.search(rf"/job_{job}/step_batch", cgroup), cgroup
    assert bool(sluid) == (version == "26.05") and (not sluid or sluid not in cgroup), (sluid, cgroup)
    rows = query(dsn, "SELECT DISTINCT job_id, step, node FROM jobpulse.process_samples WHERE pid = %s", bare)
    assert rows == [(job, "batch", "n1")], rows
