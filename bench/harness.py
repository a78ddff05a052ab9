"""What the agent benchmarks share: the fake NVML library, an HTTP sink standing in for the
collector (it counts what arrives), and a real agent process."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAKE_SOURCE = ROOT / "tests" / "fake_nvml" / "fake_nvml.c"


def build_fake_nvml(work: Path) -> Path:
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(work / "libnvidia-ml.so.1"), str(FAKE_SOURCE), "-lm"],
                   check=True)
    return work


class Sink(http.server.ThreadingHTTPServer):
    """Answers every batch 200 and counts the records it carried."""

    def __init__(self) -> None:
        self.counts = {"batches": 0, "events": 0, "gpu_samples": 0}
        self.last_event_at = 0.0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _SinkHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _SinkHandler(http.server.BaseHTTPRequestHandler):
    server: Sink

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        batch = json.loads(gzip.decompress(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        with self.server.lock:
            self.server.counts["batches"] += 1
            for kind in ("events", "gpu_samples"):
                self.server.counts[kind] += len(batch.get(kind, []))
            if batch.get("events"):
                self.server.last_event_at = time.monotonic()
        body = b'{"status":"stored","seq":0,"rows":{}}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def scenario(path: Path, gpus: int, pids: list[int], uuid: str = "GPU-bench") -> None:
    """A node of busy H100s with NVLink, `pids` spread over them (fake NVML scenario format)."""
    lines = [f"start {time.time()}"]
    for i in range(gpus):
        lines += [f"gpu {i} {uuid}-{i} 00000000:{0x17 + i:02x}:00.0 {i} {i // 4}", f"name {i} NVIDIA H100 80GB HBM3",
                  f"cpus {i} ffff", f"set 0 {i} sm 80 mem 40 enc 0 dec 0 jpg 0 ofa 0 power_mw 400000 "
                  f"power_limit_mw 700000 temp 60 memtemp 70 smclk 1980 memclk 2619 smclk_max 1980 memclk_max 2619 "
                  f"fb_total_mib 81559 fb_used_mib 40000 pcie_rx_kbs 100000 pcie_tx_kbs 100000 pcie_gen 5 "
                  f"pcie_width 16 pcie_gen_max 5 pcie_width_max 16 replay 0 nvl_rx_kbs 1000000 nvl_tx_kbs 1000000 "
                  f"clkev 0 ecc_sbe 0 ecc_dbe 0 remap_corr 0 remap_unc 0 remap_pending 0 remap_fail 0 gpm_sm 70 "
                  f"gpm_occ 30 gpm_tensor 40 gpm_dram 50 gpm_fp16 30 gpm_fp32 5 gpm_fp64 0"]
        lines += [f"nvlink {i} {link} {(i + 1 + link) % gpus}" for link in range(4)]
    for n, pid in enumerate(pids):
        lines.append(f"proc 0 {n % gpus} {pid} 4000 20 10")
    path.write_text("\n".join(lines) + "\n")


def start_agent(work: Path, scenario: Path, url: str, *extra: str,
                node: str = "bench") -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A real agent on the fake library shipping to `url`; returns it and the environment that
    reaches the fake."""
    (work / "token").write_text("bench\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(work), "FAKE_NVML_SCENARIO": str(scenario)}
    sock = work / "agent.sock"
    agent = subprocess.Popen(
        [sys.executable, "-m", "jobpulse.agent.cli", "run", "--node", node, "--control-socket", str(sock),
         "--spool-dir", str(work / "spool"), "--events-socket", str(work / "events.sock"), "--log-level", "warning",
         "--collector", url, "--token-file", str(work / "token"), *extra],
        env=env, stderr=(work / "agent.log").open("wb"))
    while not sock.exists():
        if agent.poll() is not None:
            raise RuntimeError((work / "agent.log").read_text())
        time.sleep(0.1)
    return agent, env


def register(work: Path, job: str, gpus: int) -> None:
    subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", "register", job, "--uid", str(os.getuid()),
                    "--gpus", ",".join(map(str, range(gpus))), "--control-socket", str(work / "agent.sock")],
                   check=True, capture_output=True)


def stop(agent: subprocess.Popen[bytes] | None) -> None:
    if agent and agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
