"""A real two-node Slurm cluster on this machine, from Debian's packages: munge, slurmctld and
two slurmd (`slurmd -N n1`, `-N n2`) with fake GPU character devices, the project's own
prolog, epilog and task prolog. Daemons are stopped by PID (docs/testing.md)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

NODES = ("n1", "n2")
GPUS_PER_NODE = 2
_NOT_DONE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"}


class SlurmUnavailable(RuntimeError):
    pass


def available() -> str | None:
    """Why a cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd runs jobs as other users); CI runs as root"
    for tool in ("slurmctld", "slurmd", "munged", "sbatch"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} not installed (make test installs slurmctld, slurmd, slurm-client, munge)"
    return None


def _tool(name: str) -> str:
    """Daemons live in /usr/sbin, which a non-login PATH may lack."""
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


SLOTS = 3
"""Clusters that may run at once on this machine (pytest-xdist workers queue for a slot,
/tmp/jobpulse-slurm-cluster.N.lock). They share only munged, which the first cluster starts and none
stops (a machine's daemon, as on a real node), and each slot numbers its jobs from its own range
(`FirstJobId`), so no cluster's jobs, cgroups or agents mistake another's. Within one process a test
may start a cluster beside its module's: it shares the process's slot (the slot is counted)."""
JOB_IDS_PER_SLOT = 100_000
_held: list[tuple[int, IO[bytes]]] = []


def _acquire() -> int:
    """A free slot's number, held until `_release`."""
    if _held:
        _held.append(_held[0])
        return _held[0][0]
    while True:
        for slot in range(SLOTS):
            lock = Path(f"/tmp/jobpulse-slurm-cluster.{slot}.lock").open("ab")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            _held.append((slot, lock))
            return slot
        time.sleep(1)


def _release() -> None:
    _, lock = _held.pop()
    if not _held:
        lock.close()


@dataclass
class SlurmCluster:
    root: Path
    prolog: Path
    epilog: Path
    task_prolog: Path
    pids: list[int] = field(default_factory=list)
    _locked: bool = False
    slot: int = 0

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    version = "22.05"
    """The Slurm this cluster runs: the host's own (Debian 12's)."""

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` as it runs against this cluster's Slurm (its clients, its daemons)."""
        return argv

    @property
    def client_path(self) -> str:
        """A PATH whose Slurm commands are this cluster's version (for a process the test starts that
        calls them itself, as the collector's policy calls scancel and scontrol)."""
        return os.environ.get("PATH", "/usr/bin:/bin")

    def run(self, *argv: str, timeout: float = 30, check: bool = False,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """A Slurm client command of this cluster's version (squeue, scontrol, sacct, ...)."""
        return subprocess.run(self.command(list(argv)), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=check, input=input)

    def write_config(self) -> None:
        etc, spool = self.root / "etc", self.root / "spool"
        for d in (etc, spool / "ctld", *(spool / n for n in NODES), self.root / "run", self.root / "log",
                  self.root / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        for n in range(GPUS_PER_NODE):
            dev = self.root / "dev" / f"nvidia{n}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, n))
        ctl_port, n1, n2 = _free_ports(3)
        host = socket.gethostname()
        self.conf.write_text(f"""
ClusterName=jpcluster
FirstJobId={1 + self.slot * JOB_IDS_PER_SLOT}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={spool}/ctld
SlurmdSpoolDir={spool}/%n
SlurmctldPidFile={self.root}/run/slurmctld.pid
SlurmdPidFile={self.root}/run/slurmd-%n.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
GresTypes=gpu
Prolog={self.prolog}
Epilog={self.epilog}
EpilogSlurmctld={self.epilog.parent / "epilog_slurmctld.sh"}
TaskProlog={self.task_prolog}
MailProg={self.prolog.parent / "mail.sh"}
PrologFlags=Alloc
PrologEpilogTimeout=30
KillWait=2
MinJobAge=300
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1} CPUs=4 RealMemory=2000 Gres=gpu:{GPUS_PER_NODE}
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2} CPUs=4 RealMemory=2000 Gres=gpu:{GPUS_PER_NODE}
PartitionName=gpu Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
PartitionName=debug Nodes=n1,n2 MaxTime=INFINITE State=UP
""")
        (etc / "gres.conf").write_text("AutoDetect=off\n" + "".join(
            f"NodeName={node} Name=gpu File={self.root}/dev/nvidia[0-{GPUS_PER_NODE - 1}]\n" for node in NODES))

    def start(self) -> None:
        self.slot = _acquire()  # released by stop (or this process's exit)
        self._locked = True
        self.write_config()
        if not Path("/etc/munge/munge.key").exists():
            subprocess.run([_tool("mungekey"), "-c"], check=True)
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
            # The machine's, not this cluster's: a cluster of the other lock may be using it when this
            # one stops, so it is left running (in the background, as a system's munged runs).
            subprocess.Popen([_tool("runuser"), "-u", "munge", "--", _tool("munged"), "-F"], start_new_session=True,
                             stdout=(self.root / "log" / "munged.out").open("wb"), stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 20
            while subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    raise SlurmUnavailable(f"munged did not start: {self.logs()}")
                time.sleep(0.2)
        self.before_controller()
        self._spawn([_tool("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for node in NODES:
            self._spawn([_tool("slurmd"), "-D", "-N", node, "-f", str(self.conf)], f"slurmd-{node}")
        deadline = time.monotonic() + 60
        while True:
            self.check_alive()
            out = self.run("sinfo", "-N", "-h", "-o", "%N %t", timeout=20)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if len(states) == 2 and all(s.startswith("idle") for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"nodes not idle: {out.stdout} {out.stderr} {self.logs()}")
            time.sleep(0.5)

    def before_controller(self) -> None:
        """What must run before slurmctld starts (munge is up): nothing here."""

    def _spawn(self, argv: list[str], name: str, slurm: bool = True) -> None:
        """Start a daemon (``slurm``: one of this cluster's Slurm version, else the host's own)."""
        out = (self.root / "log" / f"{name}.out").open("wb")
        proc = subprocess.Popen(self.command(argv) if slurm else argv, env=self.env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.pids.append(proc.pid)

    def check_alive(self) -> None:
        for pid in self.pids:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                raise SlurmUnavailable(f"a Slurm daemon exited: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.root / "log").glob("*")) if p.is_file())

    def sbatch(self, *args: str, script: str) -> str:
        out = self.run("sbatch", "--parsable", *args, input=script, check=True)
        return out.stdout.strip().split(";")[0]

    def wait_done(self, job_id: str, timeout: float = 120) -> dict[str, object]:
        """Wait until the job has ended and its epilogs ran; returns its last squeue --json record."""
        deadline = time.monotonic() + timeout
        last: dict[str, object] = {}
        while time.monotonic() < deadline:
            self.check_alive()
            out = self.run("squeue", "--json", "--states=all", "--jobs", job_id, timeout=20)
            if out.returncode == 0:
                jobs = [j for j in json.loads(out.stdout or "{}").get("jobs", []) if str(j.get("job_id")) == job_id]
                if jobs:
                    last = jobs[0]
                    states = last.get("job_state")
                    if not set(states if isinstance(states, list) else [states]) & _NOT_DONE:  # a list from 23.02
                        return last
            time.sleep(0.3)
        raise TimeoutError(f"job {job_id} did not finish (last {last.get('job_state')}): {self.logs()}")

    def stop(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        for pid in self.pids:
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.killpg(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
        if self._locked:
            _release()
            self._locked = False


def accounting_available() -> str | None:
    """Why a cluster with accounting cannot run here, or None."""
    for tool in ("slurmdbd", "mariadbd", "mariadb-install-db", "sacctmgr", "sacct"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} not installed (make test installs slurmdbd and mariadb-server)"
    return available()


class AccountingCluster(SlurmCluster):
    """The cluster with Slurm's accounting as sites run it: slurmdbd on a MariaDB of its own (on
    loopback, grant tables off: nothing else can reach it), the cluster registered before slurmctld
    starts; sacct and sacctmgr work."""

    def write_config(self) -> None:
        if not hasattr(self, "db_ports"):
            self.db_ports = _free_ports(2)  # MariaDB, slurmdbd: the same across rewrites
        super().write_config()
        db, dbd = self.db_ports
        conf = self.conf.read_text().replace("AccountingStorageType=accounting_storage/none",
                                             "AccountingStorageType=accounting_storage/slurmdbd\n"
                                             f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={dbd}")
        self.conf.write_text(conf)
        dbd_conf = self.conf.parent / "slurmdbd.conf"
        dbd_conf.write_text(f"""AuthType=auth/munge
DbdAddr=127.0.0.1
DbdHost={socket.gethostname()}
DbdPort={dbd}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db}
StorageUser=root
StorageLoc=slurm_acct_db
PidFile={self.root}/run/slurmdbd.pid
LogFile={self.root}/log/slurmdbd.log
""")
        dbd_conf.chmod(0o600)

    def before_controller(self) -> None:
        db, dbd = self.db_ports
        data = self.root / "mariadb"
        if not data.exists():
            subprocess.run([_tool("mariadb-install-db"), "--no-defaults", f"--datadir={data}", "--user=root",
                            "--skip-test-db", "--auth-root-authentication-method=normal"], check=True,
                           capture_output=True, timeout=120)
        self._spawn([_tool("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=root", "--skip-grant-tables",
                     f"--socket={data}/mysqld.sock", f"--pid-file={data}/mysqld.pid", "--bind-address=127.0.0.1",
                     f"--port={db}", "--skip-log-bin", "--innodb-buffer-pool-size=32M"], "mariadbd", slurm=False)
        self._wait_port(db, "mariadbd")
        self._spawn([_tool("slurmdbd"), "-D"], "slurmdbd")
        self._wait_port(dbd, "slurmdbd")
        deadline = time.monotonic() + 30
        while self.run("sacctmgr", "-i", "add", "cluster", "jpcluster").returncode != 0 \
                and "jpcluster" not in self.sacctmgr("show", "cluster"):
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"slurmdbd did not take the cluster: {self.logs()}")
            time.sleep(0.5)

    def sacctmgr(self, *args: str) -> str:
        return self.run("sacctmgr", "-n", "-P", *args).stdout

    def _wait_port(self, port: int, name: str) -> None:
        deadline = time.monotonic() + 60
        while True:
            self.check_alive()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SlurmUnavailable(f"{name} did not listen on {port}: {self.logs()}") from None
                time.sleep(0.2)


REPO = Path(__file__).resolve().parent.parent


def _python_paths() -> list[str]:
    """What the suite's Python needs inside a chroot, at the same paths: the checkout, the virtual
    environment and the interpreter's own prefix (its files only where the prefix is the system's
    /usr, which the chroot has of its own)."""
    prefix = Path(sys.base_prefix)
    if prefix == Path("/usr"):
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        found = [f"/usr/lib/{version}", f"/usr/bin/{version}"]
    else:
        found = [str(prefix)]
    return [str(REPO), *found, *([sys.prefix] if not Path(sys.prefix).is_relative_to(REPO) else [])]


CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sacct", "sacctmgr", "sinfo")


class ChrootCluster(AccountingCluster):
    """The same cluster with accounting, run by another Slurm version: slurmctld, slurmd, slurmdbd
    and the client commands of a Debian chroot (`tests/slurm_chroot.py`), each in a mount namespace of
    its own over the chroot (the host's /proc, /dev, /sys, /tmp, munged and hosts file, and jobpulse's
    Python bound in), so nothing stays mounted once its process ends. MariaDB and munged are the
    host's; jobs, prologs and epilogs run inside that version's slurmd."""

    def __init__(self, root: Path, prolog: Path, epilog: Path, task_prolog: Path, version: str) -> None:
        from . import slurm_chroot

        super().__init__(root, prolog, epilog, task_prolog)
        self.version = version
        self.chroot = slurm_chroot.path(version)

    def command(self, argv: list[str]) -> list[str]:
        return ["/bin/sh", str(self.root / "enter"), *argv]

    @property
    def client_path(self) -> str:
        return f"{self.root / 'bin'}:{super().client_path}"

    def write_config(self) -> None:
        super().write_config()
        (self.conf.parent / "cgroup.conf").write_text("CgroupPlugin=disabled\n")  # 24.11+ wants one
        folders = {"/run/munge"}  # a folder even before start() makes it (a file there would stay in the cache)
        binds = ["/proc", "/dev", "/sys", "/tmp", "/run/munge", *_python_paths()]
        lines = [f'mkdir -p "$C{p}" 2>/dev/null; mount --rbind {p} "$C{p}"' if p in folders or Path(p).is_dir() else
                 f'touch "$C{p}" 2>/dev/null; mount --bind {p} "$C{p}"' for p in binds]
        (self.root / "enter").write_text(
            "# runs a command of this cluster's Slurm: in a private mount namespace over its chroot\n"
            f'C={self.chroot}\n'
            'if [ -z "$JOBPULSE_IN_CHROOT" ]; then\n'
            '  export JOBPULSE_IN_CHROOT=1\n'
            '  exec unshare --mount --propagation private /bin/sh "$0" "$@"\n'
            'fi\n'
            + "\n".join(lines) + '\nmount --bind /etc/hosts "$C/etc/hosts"\nexec chroot "$C" "$@"\n')
        (self.root / "bin").mkdir(exist_ok=True)
        for client in CLIENTS:  # this version's commands for the host's processes (`client_path`)
            wrapper = self.root / "bin" / client
            wrapper.write_text(f'#!/bin/sh\n[ -n "$JOBPULSE_IN_CHROOT" ] && exec /usr/bin/{client} "$@"  # inside already\n'
                               f'exec /bin/sh {self.root / "enter"} {client} "$@"\n')
            wrapper.chmod(0o755)
