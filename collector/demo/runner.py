"""`jobpulse demo`: the whole system on one machine — an embedded PostgreSQL, the collector with
its rules, and three simulated nodes: real agent processes on the fake libnvidia-ml.so.1 (the one
the tests use), real "rank" processes sending events through the client library.

The mix: a healthy 2-node training job with phases and steps, a data-loader-bound job, a job that
leaves a GPU idle, and a job on a node whose GPU throttles. Rule thresholds are scaled down so the
demo's minutes stand for a real job's hours (30 s of idling here = 10 min in production).
Ctrl-C stops everything it started.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from jobpulse.collector.embedded import stack
from jobpulse.collector.embedded.postgres import EmbeddedPostgres
from jobpulse.collector.report import html as report_html
from jobpulse.collector.report import text as report
from jobpulse.collector.store.read import reports

if TYPE_CHECKING:
    from rich.console import Console

FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml.c"  # package data: the demo runs from a wheel
BUSY = ("sm 93 mem 45 power_mw 610000 power_limit_mw 700000 temp 64 memtemp 70 smclk 1980 memclk 2619 "
        "smclk_max 1980 memclk_max 2619 fb_total_mib 81559 fb_used_mib 52000 pcie_rx_kbs 900000 pcie_tx_kbs 300000 "
        "pcie_gen 5 pcie_width 16 pcie_gen_max 5 pcie_width_max 16 nvl_rx_kbs 40000000 nvl_tx_kbs 40000000 clkev 0 "
        "gpm_sm 86 gpm_occ 45 gpm_tensor 38 gpm_dram 52 gpm_fp16 33 gpm_fp32 6 gpm_fp64 0")
IDLE = BUSY.replace("sm 93", "sm 0").replace("gpm_sm 86", "gpm_sm 0").replace("gpm_tensor 38", "gpm_tensor 0") \
    .replace("power_mw 610000", "power_mw 72000").replace("fb_used_mib 52000", "fb_used_mib 31000")
RANKS = Path(__file__).parent / "ranks"
"""Each demo job's ranks run a small script with named functions, so its stacks read as a job's would."""
SCRIPTS = {"1001": RANKS / "train.py", "1002": RANKS / "loader.py"}


@dataclass
class Job:
    job_id: str
    name: str
    user: str
    account: str
    gpus: dict[str, list[int]]  # node -> NVML indices
    story: str


JOBS = [
    Job("1001", "llm-pretrain", "alice", "nlp", {"node-a": [0, 1], "node-b": [0, 1]},
        "healthy 2-node training (4 ranks, phases and steps)"),
    Job("1002", "resnet-dataloader", "bob", "vision", {"node-c": [0]}, "GPU waits for its data loader"),
    Job("1003", "sweep-4gpu", "carol", "rl", {"node-c": [2, 3]}, "asked for 2 GPUs, uses 1"),
    Job("1004", "finetune", "dave", "nlp", {"node-b": [2]}, "runs on a GPU that throttles (node's fault)"),
]


def data_dir() -> Path:
    """A fresh folder for this run, so a second demo (or the test suite) never touches a running
    one; ``$JOBPULSE_DEMO_DIR`` names it instead. As root it lies under /var/tmp: PostgreSQL then
    runs as `postgres`, which cannot enter /root."""
    if os.environ.get("JOBPULSE_DEMO_DIR"):
        folder = Path(os.environ["JOBPULSE_DEMO_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            raise ValueError(f"JOBPULSE_DEMO_DIR {folder} is not empty")
        return folder
    base = Path("/var/tmp") if os.geteuid() == 0 else Path(
        os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "jobpulse"
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="jobpulse-demo-", dir=base))
    folder.chmod(0o711)  # others may pass through (PostgreSQL's user), not list it
    return folder


def _secret(path: Path, text: str) -> None:
    """Write a file only its owner may read (tokens)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def scenario(node: str, start: float, ranks: dict[tuple[str, int], int]) -> str:
    lines = [f"start {start}", "driver 550.54.15", "cuda 12040"]
    for i in range(4):
        lines += [f"gpu {i} GPU-{node}-{i} 00000000:{0x18 + i:02x}:00.0 {i} {i // 2}",
                  f"name {i} NVIDIA H100 80GB HBM3", f"cpus {i} ffffffffffffffff",
                  f"set 0 {i} {IDLE.replace('fb_used_mib 31000', 'fb_used_mib 0')}"]
    lines += ["nvlink 0 0 1", "nvlink 1 0 0", "nvlink 2 0 3", "nvlink 3 0 2"]
    for job in JOBS:
        for i in job.gpus.get(node, []):
            if job.job_id == "1003" and i == 2:
                lines.append(f"set 0 {i} {IDLE}")
            else:
                lines.append(f"set 0 {i} {BUSY}")
            if job.job_id == "1004":
                lines.append(f"set 0 {i} clkev 64 temp 91")  # HW thermal slowdown
            if job.job_id == "1002":  # a batch's work for 4 s, then 4 s waiting for the next one
                lines += [f"set {t} {i} sm {0 if t % 8 >= 4 else 95} gpm_sm {0 if t % 8 >= 4 else 80}"
                          for t in range(0, 3600, 4)]  # the first hour (the fake holds 16k values)
            if (job.job_id, i) in ranks:
                lines.append(f"proc 0 {i} {ranks[(job.job_id, i)]} 48000 90 40")
    return "\n".join(lines) + "\n"


class Demo:
    def __init__(self, duration: float, live: bool, keep: bool) -> None:
        self.duration, self.live, self.keep = duration, live, keep
        self.dir = data_dir()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pg: EmbeddedPostgres | None = None
        # Ctrl-C sets this instead of raising inside a psycopg call: psycopg answers an interrupted
        # query by cancelling it and waiting, and that wait could hang (psycopg issue #1335).
        self.stopping = threading.Event()

    def _interrupted(self) -> None:
        """Between steps: leave through the Ctrl-C path once it was pressed."""
        if self.stopping.is_set():
            raise KeyboardInterrupt

    def run(self) -> int:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console()
        if shutil.which("gcc") is None:
            console.print("[red]jobpulse demo compiles the simulated GPU library: install a C compiler (gcc)")
            return 2
        console.print(f"demo folder: [cyan]{self.dir}[/] (logs, reports, the database)")
        # Ctrl-C, and a `kill` or a timeout's SIGTERM, stop everything the demo started.
        previous = {sig: signal.signal(sig, lambda *_: self.stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            with console.status("starting PostgreSQL, the collector and three simulated nodes..."):
                url, token = self._start_backend()
                self._interrupted()
                self._start_nodes(url, token)
                self._interrupted()
            assert self.pg is not None  # _start_backend set it
            console.print(f"[bold]jobpulse demo[/]: PostgreSQL [cyan]{self.pg.dsn}[/], collector [cyan]{url}[/], "
                          f"agents on node-a, node-b, node-c (4 simulated H100 each)")
            for job in JOBS:
                console.print(f"  job {job.job_id} [bold]{job.name}[/] ({job.user}): {job.story}")
            columns = [TextColumn("{task.description}"), BarColumn(),
                       TextColumn("{task.fields[samples]:>7} GPU samples · {task.fields[flags]} open flags")]
            if not self.live:
                columns.append(TimeRemainingColumn())
            with Progress(*columns, console=console) as progress:
                task = progress.add_task("live (Ctrl-C to stop)" if self.live else "running the jobs",
                                         total=None if self.live else self.duration, samples=0, flags=0)
                began = time.monotonic()
                while self.live or time.monotonic() - began < self.duration:
                    self.stopping.wait(1)
                    self._interrupted()
                    samples, flags = self._counts()
                    progress.update(task, completed=time.monotonic() - began, samples=samples, flags=flags)
            self._finish(console)
            if self.keep:
                console.print("PostgreSQL and the collector keep running: Ctrl-C to stop.")
                self.stopping.wait()
                self._interrupted()
            return 0
        except KeyboardInterrupt:
            console.print("\n[yellow]stopping...")
            return 130
        finally:
            self._stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _start_backend(self) -> tuple[str, str]:
        self.pg = stack.database(self.dir / "postgres")
        token = secrets.token_hex(16)
        _secret(self.dir / "tokens", token + "\n")
        rules = resources.files("jobpulse.collector.rules").joinpath("rules_demo.toml")
        url = stack.collector(self._spawn, self.pg.dsn, self.dir / "tokens", self.dir / "collector.log", "--rules",
                              str(rules), "--rules-interval", "2", "--log-level", "warning")
        return url, token

    def _start_nodes(self, url: str, token: str) -> None:
        from jobpulse.schema import control
        from jobpulse.schema.control import request

        lib = self.dir / "fake-nvml"
        lib.mkdir()
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib / "libnvidia-ml.so.1"), str(FAKE_NVML), "-lm"],
                       check=True)
        start = time.time()
        ranks: dict[str, dict[tuple[str, int], int]] = {}
        for job in JOBS:
            rank = 0
            for node, gpus in job.gpus.items():
                for local, gpu in enumerate(gpus):
                    if job.job_id == "1003" and gpu == 2:
                        continue  # nothing runs on the idle GPU
                    env = {**os.environ, "SLURM_JOB_ID": job.job_id, "SLURM_STEP_ID": "0",
                           "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURMD_NODENAME": node,
                           "JOBPULSE_EVENTS_SOCKET": str(self.dir / node / "events.sock")}
                    script = SCRIPTS.get(job.job_id, RANKS / "idle_rank.py")
                    p = self._spawn([sys.executable, str(script)], self.dir / f"rank-{job.job_id}-{rank}.log", env)
                    ranks.setdefault(node, {})[(job.job_id, gpu)] = p.pid
                    rank += 1
        _secret(self.dir / "tokens.agent", token + "\n")
        for node in ("node-a", "node-b", "node-c"):
            work = self.dir / node
            work.mkdir()
            (work / "scenario").write_text(scenario(node, start, ranks.get(node, {})))
            env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "FAKE_NVML_SCENARIO": str(work / "scenario")}
            self._spawn([sys.executable, "-m", "jobpulse.agent.cli", "run", "--node", node, "--cluster", "demo",
                         "--collector", url, "--token-file", str(self.dir / "tokens.agent"), "--interval", "1",
                         "--control-socket", str(work / "agent.sock"), "--events-socket", str(work / "events.sock"),
                         "--spool-dir", str(work / "spool")], work / "agent.log", env)
        for node in ("node-a", "node-b", "node-c"):
            sock = self.dir / node / "agent.sock"
            if control.wait_answering(sock, 120) is None:
                raise RuntimeError(f"the agent of {node} did not start: see {self.dir / node / 'agent.log'}")
            for job in JOBS:
                if node in job.gpus:
                    request(sock, control.Register(job=control.job_spec(
                        job_id=job.job_id, uid=os.getuid(), user_name=job.user, account=job.account,
                        partition="gpu", job_name=job.name, nodes=list(job.gpus),
                        gpus_total=sum(map(len, job.gpus.values())), gpus=[str(g) for g in job.gpus[node]])))

    def _spawn(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def _counts(self) -> tuple[int, int]:
        assert self.pg is not None
        try:
            with psycopg.connect(self.pg.dsn, connect_timeout=2) as conn:
                return reports.progress(conn)
        except psycopg.Error:
            return 0, 0

    def _finish(self, console: Console) -> None:
        from rich.table import Table

        from jobpulse.schema import control
        from jobpulse.schema.control import request

        assert self.pg is not None
        for node in ("node-a", "node-b", "node-c"):
            for job in JOBS:
                if node in job.gpus:
                    request(self.dir / node / "agent.sock",
                            control.Unregister(job_id=job.job_id, state="COMPLETED", exit_code=0))
        time.sleep(5)  # the agents ship the job ends; the rules make their last evaluation
        with psycopg.connect(self.pg.dsn) as conn:
            rows = reports.flags_by_job(conn)
            table = Table(title="Flagged jobs")
            for col in ("job", "name", "user", "flags raised while it ran"):
                table.add_column(col)
            for job_id, name, user, flags in rows:
                table.add_row(job_id, name or "", user or "", flags or "[green]none")
            console.print(table)
            data = report.gather(conn, "1003", None)
            console.print(report.text(data), markup=False, highlight=False)
            out = self.dir / "reports"
            out.mkdir()
            for job in JOBS:
                d = report.gather(conn, job.job_id, None)
                (out / f"job-{job.job_id}.html").write_text(report_html.render(d, report_html.series(conn, d)))
        console.print(f"\nHTML reports: [cyan]{out}[/] (open job-1003.html in a browser)")
        cli = "jobpulse" if shutil.which("jobpulse") else str(Path(sys.executable).parent / "jobpulse")
        console.print(f"Grafana: [cyan]{cli} grafana build --out DIR[/] writes the dashboards and the provisioning"
                      " (datasource, dashboards, alert rules)")
        if self.keep:
            console.print(f"PostgreSQL DSN: [cyan]{self.pg.dsn}[/] (left running: --keep)")
            console.print(f"Text report of any job: {cli} report 1001 --dsn {self.pg.dsn}")
        else:
            console.print("PostgreSQL DSN: stopped with the demo; run with --keep to query it with "
                          f"`{cli} report` or Grafana")

    def _stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if self.pg is not None:
            self.pg.stop()


def main(duration: float, live: bool, keep: bool) -> int:
    return Demo(duration, live, keep).run()
