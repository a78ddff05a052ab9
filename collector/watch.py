"""`jobpulse watch -- COMMAND`: one job watched without an admin. A private PostgreSQL in a folder the
user chooses, a collector on a free loopback port and an agent on this node, all of the user's own;
COMMAND runs with the events socket in its environment; at its end the job's summary is printed
(stderr: COMMAND's own output stays its own) and its HTML report written. The exit status is
COMMAND's. The same code path as a site's deployment: only who starts the parts differs.

It stays out of a site deployment's way (its own ports, sockets and agent lock), and when NVML is
missing it says so and runs COMMAND anyway.

In a job of several nodes it watches them all: the collector listens on this node's name (the token
in the folder, which must be on a file system every node sees), and one `srun --overlap` task per
other node runs an agent there (`python -m jobpulse.collector.watch node ...`) until COMMAND
ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import hostlist
import psycopg

from jobpulse.collector.embedded import stack
from jobpulse.collector.embedded.postgres import EmbeddedPostgres
from jobpulse.collector.report import html as report_html
from jobpulse.collector.report import summary
from jobpulse.collector.report import text as report
from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.schema import control
from jobpulse.schema.control import request


def say(message: str) -> None:
    print(f"jobpulse watch: {message}", file=sys.stderr, flush=True)


class UnsafeFolder(RuntimeError):
    """A folder another user could change under us (the reason says how)."""


def own_folder(folder: Path, hops: int = 0) -> Path:
    """``folder`` made (mode 0700) or found as this user's own, where no other user can plant a link:
    the folder is a real directory owned by us and writable by no one else, and every folder above
    it is owned by us or root and writable by others only with the sticky bit (as /tmp), so nobody
    can swap it. Root running the database (as its own user) in it follows no one's links."""
    me = os.geteuid()
    parent = Path(os.path.realpath(folder.parent))
    for above in (parent, *parent.parents):
        st = os.stat(above)
        if st.st_uid not in (0, me):
            raise UnsafeFolder(f"{above} belongs to uid {st.st_uid}: choose a folder of your own with --dir")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise UnsafeFolder(f"others may write in {above}: choose a folder of your own with --dir")
    path = parent / folder.name
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) and st.st_uid == me and not hops:  # a link of our own: where it leads, checked
        return own_folder(Path(os.path.realpath(path)), hops + 1)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"{path} is not a folder of yours (a link another user made, or a file)")
    if st.st_uid != me:
        raise UnsafeFolder(f"{path} belongs to uid {st.st_uid}, not to you: choose a folder of your own with --dir")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFolder(f"others may write in {path} (mode {stat.S_IMODE(st.st_mode):o}): chmod go-w it")
    return path


class NodeAgent:
    """An agent of this user's on one node, with the job registered on it; ``spawn`` keeps the
    process for whoever stops it."""

    def __init__(self, job_id: str, node: str, nodes: list[str], folder: Path, run_dir: Path, interval: float,
                 command: str, remote: bool = False) -> None:
        self.job_id, self.node, self.nodes, self.folder, self.run_dir = job_id, node, nodes, folder, run_dir
        self.interval, self.command, self.remote = interval, command, remote
        self.sock = run_dir / "agent.sock"

    def start(self, spawn: stack.Spawn, url: str, token_file: Path) -> bool:
        """False (said why) when the agent cannot sample here (no NVML) or refused the job."""
        alone = len(self.nodes) == 1
        log = self.folder / ("agent.log" if alone else f"agent-{self.node}.log")
        agent = spawn([sys.executable, "-m", "jobpulse.agent.cli", "run", "--node", self.node, "--cluster",
                       "watch", "--collector", url, "--token-file", str(token_file), "--interval", str(self.interval),
                       "--flush-interval", "1", "--control-socket", str(self.sock),
                       "--events-socket", str(self.run_dir / "events.sock"),
                       "--spool-dir", str(self.folder / ("spool" if alone else f"spool-{self.node}"))], log)
        status = control.wait_answering(self.sock, 60, lambda: agent.poll() is None)
        if status is None:
            reason = next((line for line in reversed(log.read_text(errors="replace").splitlines())
                           if "nvml" in line.lower() or "error" in line.lower()),
                          "it exited" if agent.poll() is not None else "it did not answer within 60 s")
            say(f"no GPU monitoring on this node ({self.node}: {reason[:200]})")
            return False
        visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
        # the batch's SLURM_JOB_GPUS are the first node's: another node asks slurmctld for its own
        given = job_gpus_on(self.node, self.job_id) if self.remote else \
            [g for g in os.environ.get("SLURM_JOB_GPUS", "").split(",") if g.strip()]
        gpus = given or visible or list(status.gpus or [])
        reply = request(self.sock, control.Register(job=control.job_spec(
            job_id=self.job_id, uid=os.getuid(), user_name=_user(), job_name=Path(self.command).name[:200],
            nodes=self.nodes, gpus_total=len(gpus) if alone else None, gpus=[g.strip() for g in gpus if g.strip()],
            interval_s=self.interval, shared=True)))
        if not reply.ok:
            say(f"the agent on {self.node} refused the job ({reply.error})")
            return False
        say(f"watching job {self.job_id} on {self.node} ({len(reply.gpus or [])} GPUs); data in {self.folder}")
        return True

    def end(self, state: str, code: int, wait_s: float = 20.0) -> None:
        """The job's end on this node, and its last batches delivered (the agent's spool empty)."""
        request(self.sock, control.Unregister(job_id=self.job_id, state=state, exit_code=code))
        deadline = time.monotonic() + wait_s
        time.sleep(1.5)  # the next flush carries the end
        while time.monotonic() < deadline and (request(self.sock, control.Status()).spooled or 0) > 0:
            time.sleep(0.3)


def job_gpus_on(node: str, job_id: str) -> list[str]:
    """The GRES indices of the job's GPUs on ``node`` as slurmctld lists them (`scontrol show job -d`:
    ``Nodes=n2 CPU_IDs=1 Mem=0 GRES=gpu:1(IDX:1)``); [] where it cannot tell."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-d", "-o", job_id], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    here = False
    for word in out.split():
        if word.startswith("Nodes="):
            try:
                here = node in hostlist.expand_hostlist(word.removeprefix("Nodes="))
            except hostlist.BadHostlist:
                here = False
        elif word.startswith("GRES=") and here:
            found = re.search(r"gpu(?::[^:(]+)?:\d+\(IDX:([0-9,-]+)\)", word)
            return [str(i) for i in hostlist.expand_hostlist(f"[{found.group(1)}]")] if found else []
    return []


class Watch:
    def __init__(self, command: list[str], folder: Path, interval: float, rules: Path | None) -> None:
        # not resolved: a link in it is `own_folder`'s to judge, not to follow blindly
        self.command, self.folder, self.interval, self.rules = command, Path(os.path.abspath(folder)), interval, rules
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pg: EmbeddedPostgres | None = None
        # Unix socket paths are short (108 bytes): the sockets live in a short folder of their own.
        self.run_dir = Path(tempfile.mkdtemp(prefix="jpw-"))
        self.run_dir.chmod(0o711)  # traversable (the database's own user, as root), not listable
        self.job_id = os.environ.get("SLURM_JOB_ID") or str(int(time.time()) % 1_000_000_000)
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        listed = os.environ.get("SLURM_JOB_NODELIST") if os.environ.get("SLURM_JOB_ID") else None
        try:  # the job's nodes, as `scontrol show hostnames` gives them
            self.nodes = list(dict.fromkeys(hostlist.expand_hostlist(listed))) if listed else []
        except hostlist.BadHostlist:
            self.nodes = []
        if self.node not in self.nodes:
            self.nodes = [self.node]
        self.others = [n for n in self.nodes if n != self.node] if shutil.which("srun") else []
        self.agent = NodeAgent(self.job_id, self.node, self.nodes if self.others else [self.node], self.folder,
                               self.run_dir, interval, command[0])
        self.remote: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            self.folder = own_folder(self.folder)
        except (OSError, UnsafeFolder) as exc:
            say(f"cannot watch ({exc}); running the command unwatched")
            self._stop()
            return self._run_command({})
        try:
            url, token_file = self._start_backend()
            watched = self.agent.start(self._spawn, url, token_file)
            if self.others:
                self._start_remote(url, token_file)
        except (OSError, RuntimeError, psycopg.Error) as exc:
            say(f"cannot watch ({exc}); running the command unwatched")
            self._stop()
            return self._run_command({})
        if not watched:
            say("running the command unwatched on this node")
        env = {"JOBPULSE_EVENTS_SOCKET": str(self.run_dir / "events.sock"), "SLURM_JOB_ID": self.job_id}
        code = self._run_command(env if watched else {})
        try:
            if watched or self.remote:
                self._finish(code, watched)
        except Exception as exc:  # noqa: BLE001 - the command's status is what counts, whatever broke here
            say(f"no summary: {type(exc).__name__}: {exc}")
        finally:
            self._stop()
        return code

    def _run_command(self, env: dict[str, str]) -> int:
        """COMMAND in the foreground: Ctrl-C reaches it (same process group); this process waits."""
        try:
            child = subprocess.Popen(self.command, env={**os.environ, **env})
        except OSError as exc:
            say(f"cannot run {self.command[0]!r}: {exc.strerror}")
            return 127
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
        forward = signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.signal(signal.SIGTERM, forward)
        return 128 - code if code < 0 else code  # killed by a signal: the shell's convention

    def _start_backend(self) -> tuple[str, Path]:
        # Reachable only through a socket in this user's private folder: a node's other users cannot
        # connect to a server that trusts local connections.
        self.pg = stack.database(self.folder / "postgres", private_socket=self.run_dir / "pg")
        # The other nodes' agents read the token from the folder they share; alone, it stays private.
        tokens = (self.folder if self.others else self.run_dir) / "token"
        tokens.write_text(secrets.token_hex(16) + "\n")
        tokens.chmod(0o600)
        url = stack.collector(self._spawn, self.pg.dsn, tokens, self.folder / "collector.log", "--log-level",
                              "warning", *(["--rules", str(self.rules)] if self.rules else []),
                              host=socket.gethostname() if self.others else None)
        return url, tokens

    def _start_remote(self, url: str, token_file: Path) -> None:
        """One agent on each other node of the job: an `srun --overlap` task each, until the stop file."""
        (self.folder / "stop").unlink(missing_ok=True)
        self.remote = self._spawn(
            ["srun", "--overlap", f"--nodes={len(self.others)}", f"--ntasks={len(self.others)}", "--ntasks-per-node=1",
             "--cpus-per-task=1",
             f"--nodelist={','.join(self.others)}", "--kill-on-bad-exit=0", sys.executable, "-m",
             "jobpulse.collector.watch", "node", url, str(token_file), str(self.folder), self.job_id,
             str(self.interval), ",".join(self.nodes), self.command[0]], self.folder / "nodes.log")
        say(f"starting agents on {', '.join(self.others)} (srun)")

    def _finish(self, code: int, watched: bool) -> None:
        """The job's end: every node's last batch stored, its rules final, its summary and report."""
        state = "COMPLETED" if code == 0 else "CANCELLED" if code in (130, 143) else "FAILED"
        if self.remote is not None:  # the other nodes first: their last batches before the final cycle
            (self.folder / "stop").write_text(f"{state} {code}\n")
            try:
                self.remote.wait(60)
            except subprocess.TimeoutExpired:
                say("the other nodes' agents did not stop in time: their last seconds may be missing")
        if watched:
            self.agent.end(state, code)
        assert self.pg is not None
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 30  # the agent's next flush carries the job's end
            while time.monotonic() < deadline and not conn.execute(
                    "SELECT 1 FROM jobpulse.jobs WHERE cluster = 'watch' AND job_id = %s AND end_time IS NOT NULL",
                    (self.job_id,)).fetchone():
                time.sleep(0.3)
            conn.autocommit = False
            evaluate(conn, Thresholds(self.rules))  # the job's final cycle (its flags close at its end)
            summary.write_pending(conn)
            conn.commit()
            try:
                data = report.gather(conn, self.job_id, "watch")
            except report.JobNotFound:
                say("no samples of the job reached the database (see agent.log)")
                return
            page = self.folder / f"report-{self.job_id}.html"
            page.write_text(report_html.render(data, report_html.series(conn, data)))
            found = summary.build(data) if data["gpus"] else None
        print(found["text"] if found else "jobpulse watch: no GPU samples of the job", file=sys.stderr)
        say(f"HTML report: {page}; the database: {self.folder / 'postgres'} "
            f"(start it with pg_ctl to run jobpulse report {self.job_id} --cluster watch on it)")

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def _stop(self) -> None:
        """Everything this watch started is stopped, whatever became of its folder."""
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if self.pg is not None:
            try:
                self.pg.stop()
            except Exception as exc:  # noqa: BLE001 - said, and the rest is still cleaned up
                say(f"the database did not stop: {exc}")
        for leftover in self.run_dir.glob("*"):
            with contextlib.suppress(OSError):
                leftover.unlink()
        with contextlib.suppress(OSError):
            self.run_dir.rmdir()


def _user() -> str | None:
    import pwd

    with contextlib.suppress(KeyError):
        return pwd.getpwuid(os.getuid()).pw_name
    return None


def node(url: str, token_file: Path, folder: Path, job_id: str, interval: float, nodes: list[str],
         command: str) -> int:
    """An agent on one of the job's other nodes (an srun task of `Watch`), until the stop file says
    how the job ended."""
    here = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    run_dir = Path(tempfile.mkdtemp(prefix="jpw-"))
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        return p

    agent = NodeAgent(job_id, here, nodes, folder, run_dir, interval, command, remote=True)
    stop = folder / "stop"
    try:
        if not agent.start(spawn, url, token_file):
            return 0
        stopping = False

        def asked(*_: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, asked)
        while not stop.exists() and not stopping:
            time.sleep(0.5)
        said = stop.read_text().split() if stop.exists() else ["CANCELLED", "143"]  # SIGTERM: srun stopped
        agent.end(said[0] if said else "ENDED", int(said[1]) if len(said) > 1 and said[1].lstrip("-").isdigit() else 0)
        return 0
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(15)
        shutil.rmtree(run_dir, ignore_errors=True)


def default_folder() -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Path.cwd() / f"jobpulse-watch-{os.environ.get('SLURM_JOB_ID') or stamp}"


def main(command: list[str], folder: Path | None, interval: float, rules: Path | None) -> int:
    return Watch(command, folder or default_folder(), interval, rules).run()



if __name__ == "__main__" and sys.argv[1:2] == ["node"] and len(sys.argv) == 9:
    _, _, url_, token_, folder_, job_, interval_, nodes_, command_ = sys.argv
    sys.exit(node(url_, Path(token_), Path(folder_), job_, float(interval_), nodes_.split(","), command_))
