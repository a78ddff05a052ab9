"""`jobpulse watch -- COMMAND`: one job watched without an admin. A private PostgreSQL in a folder the
user chooses, a collector on a free loopback port and an agent on this node, all of the user's own;
COMMAND runs with the events socket in its environment; at its end the job's summary is printed
(stderr: COMMAND's own output stays its own) and its HTML report written. The exit status is
COMMAND's. The same code path as a site's deployment: only who starts the parts differs.

It stays out of a site deployment's way (its own ports, sockets and agent lock), and when NVML is
missing it says so and runs COMMAND anyway.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from jobpulse.collector.demo import stack
from jobpulse.collector.demo.embedded_postgres import EmbeddedPostgres
from jobpulse.collector.report import html as report_html
from jobpulse.collector.report import summary
from jobpulse.collector.report import text as report
from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.schema import control
from jobpulse.schema.control import request


def say(message: str) -> None:
    print(f"jobpulse watch: {message}", file=sys.stderr, flush=True)


class Watch:
    def __init__(self, command: list[str], folder: Path, interval: float, rules: Path | None) -> None:
        self.command, self.folder, self.interval, self.rules = command, folder.resolve(), interval, rules
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pg: EmbeddedPostgres | None = None
        # Unix socket paths are short (108 bytes): the sockets live in a short folder of their own.
        self.run_dir = Path(tempfile.mkdtemp(prefix="jpw-"))
        self.run_dir.chmod(0o711)  # traversable (the database's own user, as root), not listable
        self.job_id = os.environ.get("SLURM_JOB_ID") or str(int(time.time()) % 1_000_000_000)
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]

    def run(self) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            url, token_file = self._start_backend()
            watched = self._start_agent(url, token_file)
        except (OSError, RuntimeError, psycopg.Error) as exc:
            say(f"cannot watch ({exc}); running the command unwatched")
            self._stop()
            return self._run_command({})
        env = {"JOBPULSE_EVENTS_SOCKET": str(self.run_dir / "events.sock"), "SLURM_JOB_ID": self.job_id}
        code = self._run_command(env if watched else {})
        try:
            if watched:
                self._finish(code)
        except (OSError, RuntimeError, psycopg.Error) as exc:  # the command's status is what counts
            say(f"no summary: {exc}")
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
        tokens = self.run_dir / "token"
        tokens.write_text(secrets.token_hex(16) + "\n")
        tokens.chmod(0o600)
        url = stack.collector(self._spawn, self.pg.dsn, tokens, self.folder / "collector.log", "--log-level",
                              "warning", *(["--rules", str(self.rules)] if self.rules else []))
        return url, tokens

    def _start_agent(self, url: str, token_file: Path) -> bool:
        """An agent of this user's on this node, with the job registered; False (said why) when it
        cannot sample (no NVML)."""
        sock = self.run_dir / "agent.sock"
        log = self.folder / "agent.log"
        agent = self._spawn([sys.executable, "-m", "jobpulse.agent.cli", "run", "--node", self.node, "--cluster",
                             "watch", "--collector", url, "--token-file", str(token_file), "--interval",
                             str(self.interval), "--flush-interval", "1", "--control-socket", str(sock),
                             "--events-socket",
                             str(self.run_dir / "events.sock"), "--spool-dir", str(self.folder / "spool")], log)
        deadline = time.monotonic() + 30
        while not sock.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                reason = next((line for line in reversed(log.read_text(errors="replace").splitlines())
                               if "nvml" in line.lower() or "error" in line.lower()), "it exited")
                say(f"no GPU monitoring on this node ({reason[:200]}); running the command unwatched")
                return False
            time.sleep(0.1)
        status = request(sock, control.Status())
        visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
        gpus = os.environ.get("SLURM_JOB_GPUS", "").split(",") if os.environ.get("SLURM_JOB_GPUS") else \
            visible or list(status.gpus or [])
        reply = request(sock, control.Register(job=control.job_spec(
            job_id=self.job_id, uid=os.getuid(), user_name=_user(), job_name=Path(self.command[0]).name[:200],
            nodes=[self.node], gpus_total=len(gpus), gpus=[g.strip() for g in gpus if g.strip()],
            interval_s=self.interval, shared=True)))
        if not reply.ok:
            say(f"the agent refused the job ({reply.error}); running the command unwatched")
            return False
        say(f"watching job {self.job_id} on {self.node} ({len(reply.gpus or [])} GPUs); data in {self.folder}")
        return True

    def _finish(self, code: int) -> None:
        """The job's end: its last batch stored, its rules final, its summary and report."""
        sock = self.run_dir / "agent.sock"
        state = "COMPLETED" if code == 0 else "CANCELLED" if code in (130, 143) else "FAILED"
        request(sock, control.Unregister(job_id=self.job_id, state=state, exit_code=code))
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
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.stop()
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


def default_folder() -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Path.cwd() / f"jobpulse-watch-{os.environ.get('SLURM_JOB_ID') or stamp}"


def main(command: list[str], folder: Path | None, interval: float, rules: Path | None) -> int:
    return Watch(command, folder or default_folder(), interval, rules).run()

