"""Run the real agent process on the fake libnvidia-ml.so.1, and real 'rank' processes."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from jobpulse.schema.fields import Field

FAKE_SOURCE = Path(__file__).resolve().parent.parent / "collector" / "demo" / "fake_nvml.c"


def build_fake_nvml(out_dir: Path) -> Path:
    """Compile the fake NVML library; returns the folder to put first on LD_LIBRARY_PATH."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(out_dir / "libnvidia-ml.so.1"), str(FAKE_SOURCE), "-lm"],
                   check=True)
    return out_dir


@dataclass
class Scenario:
    """Builds a scenario file for the fake library (see the comment at the top of fake_nvml.c)."""

    start: float = field(default_factory=time.time)
    lines: list[str] = field(default_factory=list)

    def gpu(self, index: int, uuid: str, bus: str, minor: int | None = None, numa: int = 0,
            name: str = "NVIDIA H100 80GB HBM3", cpus: str = "ffff", **values: float) -> Scenario:
        self.lines += [f"gpu {index} {uuid} {bus} {index if minor is None else minor} {numa}", f"name {index} {name}",
                       f"cpus {index} {cpus}"]
        return self.set(0, index, **values) if values else self

    def mig(self, parent: int, instance: int, slot: int, uuid: str, gi: int, ci: int = 0,
            profile: str = "1g.10gb", **values: float) -> Scenario:
        """A MIG instance of GPU ``parent`` (which this puts in MIG mode); ``instance`` (not a GPU
        index) names it in set/proc/xid lines."""
        if f"mig {parent} 1" not in self.lines:
            self.lines.append(f"mig {parent} 1")
        self.lines.append(f"migdev {instance} {parent} {slot} {uuid} {gi} {ci} {profile}")
        return self.set(0, instance, **values) if values else self

    def set(self, t: float, index: int, **values: float) -> Scenario:
        self.lines.append(f"set {t} {index} " + " ".join(f"{k} {v}" for k, v in values.items()))
        return self

    def add(self, line: str) -> Scenario:
        self.lines.append(line)
        return self

    def write(self, path: Path) -> Path:
        path.write_text("\n".join([f"start {self.start}", *self.lines]) + "\n")
        return path


# The fake serves a field value that is also a call's reading (power, energy, ECC, remapped rows, PCIe
# replays, memory temperature) from that call's key, which FULL_H100 sets; every other one by its id.
FROM_KEYS = {"mem_temp_c", "power_w", "energy_mj", "pcie_replay", "ecc_sbe_total", "ecc_dbe_total",
             "remapped_correctable", "remapped_uncorrectable", "remap_pending", "remap_failure"}


def by_id(fields: Iterable[Field]) -> list[str]:
    """Scenario keys (``fi.<id>``) of the fields among ``fields`` the fake serves by field id."""
    return [f"fi.{getattr(pynvml, f.nvml_field)}" for f in fields if f.nvml_field and f.name not in FROM_KEYS]


FULL_H100 = dict(sm=87, mem=41, enc=3, dec=4, jpg=5, ofa=6, power_mw=312_500, power_limit_mw=700_000, temp=61,
                 memtemp=72, smclk=1980, memclk=2619, smclk_max=1980, memclk_max=2619, fb_total_mib=81_559,
                 fb_used_mib=40_123, pcie_rx_kbs=1_234_567, pcie_tx_kbs=765_432, pcie_gen=5, pcie_width=16,
                 pcie_gen_max=5, pcie_width_max=16, replay=7, nvl_rx_kbs=2_000_000, nvl_tx_kbs=1_000_000, clkev=4,
                 ecc_sbe=2, ecc_dbe=0, remap_corr=1, remap_unc=0, remap_pending=0, remap_fail=0, gpm_sm=71.5,
                 gpm_occ=33.25, gpm_tensor=40, gpm_dram=55, gpm_fp16=30, gpm_fp32=5, gpm_fp64=0, gpm_gr=90,
                 fb_reserved_mib=555)


@dataclass
class RunningAgent:
    proc: subprocess.Popen[bytes]
    socket: Path
    spool: Path
    log: Path

    @property
    def events_socket(self) -> Path:
        return self.socket.parent / "events.sock"

    def control(self, *args: str) -> dict[str, object]:
        out = subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", *args, "--control-socket", str(self.socket)],
                             capture_output=True, text=True, timeout=30)
        return json.loads(out.stdout) if out.stdout.strip() else {"ok": False, "error": out.stderr}

    def end_jobs(self, *jobs: str) -> None:
        """Each job ends as its epilog would end it (exit code 0), and the agent's last batch leaves."""
        for job in jobs:
            assert self.control("unregister", job, "--exit-code", "0")["ok"], job
        time.sleep(2)

    def wait_drained(self, timeout_s: float = 40) -> None:
        """Until the agent's spool is empty (every batch acknowledged)."""
        deadline = time.monotonic() + timeout_s
        while self.control("status")["spooled"] != 0:
            assert time.monotonic() < deadline, "the spool did not drain"
            time.sleep(0.3)

    def stop(self) -> dict[str, int]:
        """SIGTERM, wait, and return what it reported producing."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        return self.produced()

    def kill_if_running(self) -> None:
        """After a failed test: no agent outlives it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def produced(self) -> dict[str, int]:
        for line in reversed(self.log.read_text().splitlines()):
            if line.startswith("{") and json.loads(line).get("event") == "agent stopped":
                return json.loads(line)["produced"]
        raise AssertionError(f"no 'agent stopped' line in {self.log}")


def start_agent(fake_dir: Path, scenario: Path, workdir: Path, node: str, *extra: str,
                collector: str | None = None, token: str | None = None) -> RunningAgent:
    workdir.mkdir(parents=True, exist_ok=True)
    sock, spool, log = workdir / "agent.sock", workdir / "spool", workdir / f"agent-{time.time_ns()}.log"
    args = [sys.executable, "-m", "jobpulse.agent.cli", "run", "--node", node, "--cluster", "testcluster",
            "--control-socket", str(sock), "--spool-dir", str(spool), "--interval", "0.5", "--flush-interval", "0.5",
            "--events-socket", str(workdir / "events.sock"), *extra]
    if collector:
        tokfile = workdir / "token"
        tokfile.write_text(f"{token}\n")
        args += ["--collector", collector, "--token-file", str(tokfile)]
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_dir), "FAKE_NVML_SCENARIO": str(scenario)}
    proc = subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"agent did not start: {log.read_text()}")
        time.sleep(0.05)
    return RunningAgent(proc, sock, spool, log)


def spawn_rank(job_id: str, rank: int, local_rank: int, step: str = "0", command: list[str] | None = None,
               **popen: object) -> subprocess.Popen[bytes]:
    """A process with the environment slurmstepd gives a task (by default one that sleeps)."""
    env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_STEP_ID": step, "SLURM_PROCID": str(rank),
           "SLURM_LOCALID": str(local_rank)}
    return subprocess.Popen(command or ["sleep", "300"], env=env, **popen)  # type: ignore[arg-type]


# Run in a child process: pynvml loads libnvidia-ml.so.1 once, from LD_LIBRARY_PATH.
_SAMPLE_TWICE = """
import json, time
from datetime import datetime, timezone
from prometheus_client import CollectorRegistry, generate_latest
from jobpulse.agent.nvml import Nvml
from jobpulse.agent.sources.gpu import GpuSampler
from jobpulse.agent.exporter import DcgmCompatible
nvml = Nvml()
sampler = GpuSampler(nvml, lambda uuid: "42")
sampler.sample(datetime.now(timezone.utc))
time.sleep(0.3)  # rates and GPM metrics need two samples
samples = sampler.sample(datetime.now(timezone.utc))
registry = CollectorRegistry()
registry.register(DcgmCompatible(nvml.gpus, lambda: sampler.latest, lambda: {}, sampler.nvlink_kib, hostname="n1"))
print(json.dumps({"samples": {s.gpu_uuid: {f: getattr(s, f) for f in s.__struct_fields__ if f != "ts"} for s in samples},
                  "metrics": generate_latest(registry).decode()}))
"""


def sample_twice(fake_nvml: Path, scenario: Path) -> dict[str, Any]:
    """The GPU sampler's second sample of each GPU (field -> value) and the agent's exposition."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_SCENARIO": str(scenario)}
    out = subprocess.run([sys.executable, "-c", _SAMPLE_TWICE], env=env, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout.splitlines()[-1])  # after the log lines of unsupported fields


@functools.cache
def unprivileged_python(user: str) -> tuple[str, str | None] | None:
    """A Python ``user`` can run jobpulse with, and the PYTHONPATH it needs: this interpreter where
    they may run it, else the system's Python of the same version over this checkout and the
    virtual environment's packages (a pyenv Python under /root is root's alone); None where there
    is none, or this process is not root (only root can run things as another user)."""
    if os.geteuid() != 0:
        return None
    runs = ["runuser", "-u", user, "--"]
    if subprocess.run([*runs, sys.executable, "-c", "import jobpulse"], capture_output=True, timeout=30).returncode == 0:
        return sys.executable, None
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    site = next((p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix)), None)
    if not os.access(system, os.X_OK) or site is None:
        return None
    farm = Path(tempfile.mkdtemp(prefix="jobpulse-py-"))
    atexit.register(shutil.rmtree, farm, True)
    farm.chmod(0o755)
    (farm / "jobpulse").symlink_to(Path(__file__).resolve().parents[1])
    path = f"{farm}:{site}"
    ok = subprocess.run([*runs, "env", f"PYTHONPATH={path}", system, "-c", "import jobpulse.collector.cli"],
                        capture_output=True, timeout=60).returncode == 0
    return (system, path) if ok else None

