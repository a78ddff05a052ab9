"""What the benchmarks share: the fake NVML library, an HTTP sink standing in for the collector
(it counts what arrives), a real agent process, a real collector process, simulated nodes that
build their batches with the agent's own code, and a light HTTP sender for them."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

from jobpulse.agent.shipping.batch import Batcher
from jobpulse.agent.shipping.send import compress
from jobpulse.agent.sources.processes import ChangeOnly
from jobpulse.collector.embedded.postgres import free_port
from jobpulse.schema import wire

ROOT = Path(__file__).resolve().parent.parent
FAKE_SOURCE = ROOT / "collector" / "demo" / "fake_nvml.c"


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
    """HTTP/1.1: the agent's connection stays open between batches, as the collector (uvicorn) keeps it."""

    server: Sink
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
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


def start_agent(work: Path, scenario: Path, url: str, *extra: str, node: str = "bench",
                pythonpath: str | None = None) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """A real agent on the fake library shipping to `url`; returns it and the environment that
    reaches the fake. ``pythonpath``: run another version's agent (a copy of it) on the same set-up."""
    (work / "token").write_text("bench\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(work), "FAKE_NVML_SCENARIO": str(scenario),
           **({"PYTHONPATH": pythonpath} if pythonpath else {})}
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


def tree_cpu_s(root: int) -> float:
    """CPU seconds used so far by a process and its children (PostgreSQL: the postmaster and its
    backends; children that exited count through the parent's cumulative times)."""
    return trees_cpu_s([root])[root]


def trees_cpu_s(roots: list[int]) -> dict[int, float]:
    """`tree_cpu_s` of several processes from one pass over /proc (a pass takes long on a loaded
    machine: one for all keeps their readings at one moment)."""
    tick = os.sysconf("SC_CLK_TCK")
    totals = dict.fromkeys(roots, 0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid in totals:
            totals[pid] += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])  # with cutime, cstime
        elif ppid in totals:
            totals[ppid] += int(fields[11]) + int(fields[12])  # utime, stime
    return {root: total / tick for root, total in totals.items()}


def load_note() -> str:
    """What else ran on the machine (a shared machine's figures are contended: say so)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores at the start"


def start_collector(work: Path, dsn: str, *extra: str, pythonpath: str | None = None
                    ) -> tuple[subprocess.Popen[bytes], int]:
    """`jobpulse collector serve` as its own process (token "bench"); returns it and its port.
    ``pythonpath``: run another version's collector (an installed copy of it) on the same set-up."""
    (work / "tokens").write_text("bench\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobpulse.collector.cli", "collector", "serve", "--dsn", dsn,
         "--listen", f"127.0.0.1:{port}", "--token-file", str(work / "tokens"), "--log-level", "warning", *extra],
        stderr=(work / "collector.log").open("wb"), env={**os.environ, **({"PYTHONPATH": pythonpath} if pythonpath else {})})
    wait_ready(proc, lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz"),
               work / "collector.log", "the collector")
    return proc, port


def wait_ready(proc: subprocess.Popen[bytes], probe: Callable[[], object], log: Path, what: str) -> None:
    """Until ``probe`` stops raising OSError (30 s at most); ``log`` is the error when ``proc`` exits first."""
    for _ in range(300):
        try:
            probe()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text()) from None
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not start")


GPUS_PER_NODE = 8
PROCESSES_PER_NODE = 32  # a rank per GPU and three data-loader workers per rank


class SimulatedNode:
    """A node's agent as the benchmarks drive it: one job on 8 busy H100s, 32 of its processes;
    each batch built by the agent's own `Batcher` (wire-checked, encoded) and gzipped as it ships."""

    def __init__(self, n: int, cluster: str = "bench", change_only: bool = False) -> None:
        self.node = f"node{n:05d}"
        self.job = str(100_000 + n)
        self.batcher = Batcher(self.node, cluster)
        self.uuids = [f"GPU-{self.node}-{g}" for g in range(GPUS_PER_NODE)]
        self.tick = 0
        # as the agent sends them (`ChangeOnly`): these processes do not change, so a row a process
        # every ten seconds; without it every tick's 32 rows, as an agent whose processes all change
        self.changes = ChangeOnly(numa={}) if change_only else None

    def batch(self, ts: datetime, processes: bool = True) -> tuple[wire.Batch, bytes]:
        """One second of this node sampled at ``ts``: 8 GPU samples and (``processes``) 32 process samples."""
        i = self.tick = self.tick + 1
        self.batcher.add("gpu_samples", [wire.GpuSample(
            ts=ts, gpu_uuid=uuid, gpu_index=g, job_id=self.job, sm_util=(i + g) % 101, mem_util=(i * 7) % 101,
            enc_util=0, dec_util=0, jpg_util=0, ofa_util=0, power_w=300.0 + (i % 400), power_limit_w=700.0,
            energy_mj=10**9 + i * 300, gpu_temp_c=60, mem_temp_c=68, sm_clock_mhz=1980, mem_clock_mhz=2619,
            sm_clock_max_mhz=1980, mem_clock_max_mhz=2619, fb_used_mib=40_000 + i % 1000, fb_total_mib=81_559,
            pcie_rx_kbs=1_000_000, pcie_tx_kbs=500_000, pcie_gen=5, pcie_width=16, pcie_gen_max=5, pcie_width_max=16,
            pcie_replay=0, nvlink_rx_kbs=10**8, nvlink_tx_kbs=10**8, clock_event_reasons=0, ecc_sbe_total=0,
            ecc_dbe_total=0, remapped_correctable=0, remapped_uncorrectable=0, remap_pending=False,
            remap_failure=False, gpm_sm_active=70.5, gpm_sm_occupancy=30.25, gpm_tensor_active=40.0, gpm_dram_bw=55.0,
            gpm_fp16_active=30.0, gpm_fp32_active=5.0, gpm_fp64_active=0.0, nvlink_crc_flit_errors=0,
            nvlink_crc_data_errors=0, nvlink_replay_errors=0, nvlink_recovery_errors=0)
            for g, uuid in enumerate(self.uuids)])
        procs = []
        for p in range(PROCESSES_PER_NODE if processes else 0):
            rank = p % GPUS_PER_NODE
            main = p < GPUS_PER_NODE  # the rank itself holds the GPU; its loaders only CPU
            procs.append(wire.ProcessSample(
                ts=ts, pid=10_000 + p, gpu_uuid=self.uuids[rank] if main else None, job_id=self.job, step="0",
                rank=rank, local_rank=rank, gpu_mem_mib=39_000 if main else None, sm_util=80 if main else None,
                mem_util=35 if main else None, cpu_percent=99.5 if main else 40.0 + p, rss_mib=12_000 if main else 2_000,
                command="python" if main else "pt_data_worker", cpu=p))
        if self.changes is not None:
            procs = self.changes(procs, ts)
        if procs:
            self.batcher.add("process_samples", procs)
        ready = self.batcher.take()
        assert ready is not None
        return ready.batch, compress(ready)[0]


def request(port: int, body: bytes) -> bytes:
    """The bytes of one agent POST (bearer token "bench", gzip JSON)."""
    return (f"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer bench\r\n"
            f"Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


class _Connection:
    """One keep-alive connection to the collector, opened again when the collector closed it while
    it was idle (as uvicorn does, and as an agent's HTTP client copes with)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, data: bytes) -> bool:
        """One request and its answer; False when it must go again: the connection was closed, or
        the collector answered 503 (an agent keeps the batch and sends it again)."""
        if self.stream is None:
            self.stream = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.stream
        try:
            writer.write(data)
            status = await reader.readline()
        except ConnectionError:
            status = b""
        if not status:
            writer.close()
            self.stream = None
            return False
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        answer = await reader.readexactly(length)
        if b" 503 " in status:
            await asyncio.sleep(0.05)
            return False
        if b" 200 " not in status:
            raise RuntimeError(f"collector answered {status.decode().strip()}: {answer[:200]!r}")
        return True

    def close(self) -> None:
        if self.stream is not None:
            self.stream[1].close()


async def post_all(port: int, requests: Iterable[tuple[float, bytes]], connections: int,
                   retries: list[float] | None = None) -> list[tuple[float, float]]:
    """Send each request (monotonic time not before which it goes, its bytes) over ``connections``
    keep-alive connections, in order; returns (due, answered) monotonic times per request. A 503 is
    sent again 50 ms later, a request on a connection the collector closed on a new one (both
    counted in ``retries``). Costs the machine little: the bytes are built beforehand, no HTTP library parses anything."""
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=connections)
    done: list[tuple[float, float]] = []
    retries = [] if retries is None else retries

    async def connection() -> None:
        conn = _Connection(port)
        while (item := await queue.get()) is not None:
            while not await conn.post(item[1]):
                retries.append(item[0])
            done.append((item[0], time.monotonic()))
        conn.close()

    async def feed() -> None:
        for at, data in requests:
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await queue.put((at, data))
        for _ in range(connections):
            await queue.put(None)

    await asyncio.gather(feed(), *(connection() for _ in range(connections)))
    return done


def finish(name: str, result: object, headline: str) -> int:
    """A benchmark's last step: its figures saved (`save`), its headline printed; its exit status."""
    save(name, result)
    print(headline)
    return 0


def save(name: str, result: object) -> Path:
    """Write a benchmark's figures to bench/results/<name> (JSON), where the summary reads them."""
    out = ROOT / "bench" / "results" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return out
