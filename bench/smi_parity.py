"""On a real GPU node: run the agent beside `nvidia-smi dmon` under a known workload, then compare.

The fake NVML is what the tests have; this is how a site (or a developer lent a GPU) checks that the
agent reads a real card as nvidia-smi does. `collect` runs, for the workload's phases:

- a PyTorch workload on GPU 0 in phases (idle holding memory, dense bf16 matrix products, short
  kernels with gaps, device-to-device copies), started with a Slurm job's environment so the agent
  ties its process to the job;
- `nvidia-smi dmon` (every column group) and `nvidia-smi --query-gpu` at 1 s;
- `jobpulse-agent run` at 1 s with an unreachable collector, so every batch stays in its spool;
- one scrape of the agent's dcgm-exporter exposition a second;

and keeps `nvidia-smi -q -x`, `nvidia-smi topo -m`, `jobpulse-agent probe` and `validate` beside
them. `compare DIR` lines each agent sample up with the dmon row of the same second and prints, per
field, how many seconds agree within the field's tolerance.

    python bench/smi_parity.py collect --out /tmp/parity [--phases matmul:120,starved:240,idle:120]
    python bench/smi_parity.py compare /tmp/parity
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

JOB = "77"
QUERY = ("timestamp,index,utilization.gpu,utilization.memory,power.draw,power.draw.average,power.draw.instant,"
         "enforced.power.limit,temperature.gpu,temperature.memory,clocks.sm,clocks.mem,clocks.max.sm,"
         "clocks.max.mem,memory.used,memory.total,memory.reserved,pcie.link.gen.current,pcie.link.width.current,"
         "pcie.link.gen.max,pcie.link.width.max,clocks_event_reasons.active,"
         "ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total")

# The workload's phases, run in the order given for the seconds given (`--phases`): what the GPU of
# a job does in each is known by construction, so a recording made with them is labelled by it.
PHASES = "idle:15,matmul:30,gaps:20,copy:20,idle:12"
WORKLOAD = r"""
import sys, time, torch
hold = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")  # 2 GiB held all along
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
s = torch.randn(1024, 1024, device="cuda")
src = torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
def matmul(): c = a @ b; torch.cuda.synchronize()  # dense bf16 products, the tensor cores busy
def starved():  # 50 ms of products, then 200 ms waiting for the next batch (a loader that cannot keep up)
    t = time.time()
    while time.time() - t < 0.05: c = a @ b; torch.cuda.synchronize()
    time.sleep(0.2)
def gaps():  # tiny kernels with gaps: the SMs nearly idle, the GPU "in use"
    for _ in range(50): s.mul_(1.0001)
    torch.cuda.synchronize(); time.sleep(0.02)
def copy(): dst.copy_(src); torch.cuda.synchronize()  # memory bandwidth bound
def idle(): time.sleep(0.1)
for spec in sys.argv[1].split(","):
    name, seconds = spec.split(":")
    print("phase", name, time.time(), flush=True)
    end = time.time() + float(seconds)
    while time.time() < end: globals()[name]()
print("phase done", time.time(), flush=True)
"""


def _agent(*args: str) -> list[str]:
    return [sys.executable, "-m", "jobpulse.agent", *args]


def collect(out: Path, phases: str) -> None:
    seconds = sum(float(p.split(":")[1]) for p in phases.split(","))
    out.mkdir(parents=True, exist_ok=True)
    run = out / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    sock, events, spool = run / "agent.sock", run / "events.sock", run / "spool"
    (run / "token").write_text("unused\n")
    for name, cmd in {"smi-q.xml": ["nvidia-smi", "-q", "-x"], "topo.txt": ["nvidia-smi", "topo", "-m"],
                      "smi-L.txt": ["nvidia-smi", "-L"], "probe.txt": _agent("probe"),
                      "validate.json": _agent("validate", "--format", "json"),
                      "record.txt": _agent("validate", "--record", str(out / "expect.toml")),
                      "smi-help-query.txt": ["nvidia-smi", "--help-query-gpu"]}.items():
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            text = res.stdout + (f"\n# stderr (rc {res.returncode}):\n{res.stderr}" if res.returncode else "")
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"# {cmd[0]} failed: {e}\n"
        (out / name).write_text(text)
    logs = {n: open(out / n, "w") for n in ("dmon.txt", "query.csv", "agent.log", "workload.log", "metrics.txt")}
    procs = [subprocess.Popen(cmd, stdout=logs[name], stderr=subprocess.STDOUT) for name, cmd in (
        ("dmon.txt", ["nvidia-smi", "dmon", "-s", "pucvmet", "-o", "T", "-d", "1"]),
        ("query.csv", ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,nounits", "-lms", "1000"]))
        if shutil.which(cmd[0])]
    agent = subprocess.Popen(_agent("run", "--collector", "http://127.0.0.1:9", "--token-file", str(run / "token"),
                                    "--control-socket", str(sock), "--events-socket", str(events),
                                    "--spool-dir", str(spool), "--prometheus-listen", "127.0.0.1:9499",
                                    "--interval", "1", "--node", "gpu1", "--log-level", "info"),
                             stdout=logs["agent.log"], stderr=subprocess.STDOUT)
    for _ in range(100):
        if sock.exists():
            break
        time.sleep(0.1)
    reg = subprocess.run(_agent("register", JOB, "--uid", str(os.getuid()), "--user", "root", "--gpus", "0",
                                "--nodes", "gpu1", "--control-socket", str(sock)), capture_output=True, text=True)
    logs["agent.log"].write(f"# register rc {reg.returncode}: {reg.stdout}{reg.stderr}\n")
    env = dict(os.environ, SLURM_JOB_ID=JOB, SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_LOCALID="0",
               SLURMD_NODENAME="gpu1")
    env.pop("PYTHONPATH", None)
    work = subprocess.Popen([sys.executable, "-c", WORKLOAD, phases], env=env, stdout=logs["workload.log"],
                            stderr=subprocess.STDOUT)
    end = time.time() + seconds + 5
    while time.time() < end and work.poll() is None or time.time() < end - seconds:
        try:
            body = urllib.request.urlopen("http://127.0.0.1:9499/metrics", timeout=2).read().decode()
            logs["metrics.txt"].write(f"# scrape {time.time():.3f}\n{body}")
        except OSError as e:
            logs["metrics.txt"].write(f"# scrape {time.time():.3f} failed: {e}\n")
        time.sleep(1)
    work.wait(timeout=60)
    time.sleep(3)
    subprocess.run(_agent("unregister", JOB, "--control-socket", str(sock)), capture_output=True, timeout=30)
    time.sleep(2)
    for p in (agent, *procs):
        p.send_signal(signal.SIGTERM)
    for p in (agent, *procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
    for f in logs.values():
        f.close()
    with gzip.open(out / "batches.jsonl.gz", "wt") as f:
        for path in sorted(spool.glob("*.json.gz")):
            f.write(gzip.decompress(path.read_bytes()).decode() + "\n")


# dmon column -> (agent field, tolerance as (absolute, relative)); dmon prints whole units.
DMON = {"pwr": ("power_w", 15, 0.10), "gtemp": ("gpu_temp_c", 1, 0), "mtemp": ("mem_temp_c", 1, 0),
        "sm": ("sm_util", 5, 0), "mem": ("mem_util", 5, 0), "enc": ("enc_util", 0, 0), "dec": ("dec_util", 0, 0),
        "jpg": ("jpg_util", 0, 0), "ofa": ("ofa_util", 0, 0), "mclk": ("mem_clock_mhz", 1, 0),
        "pclk": ("sm_clock_mhz", 30, 0.03), "fb": ("fb_used_mib", 0, 0),
        "sbecc": ("ecc_sbe_total", 0, 0), "dbecc": ("ecc_dbe_total", 0, 0), "pci": ("pcie_replay", 0, 0),
        "rxpci": ("pcie_rx_kbs", 1000, 0.25), "txpci": ("pcie_tx_kbs", 1000, 0.25)}
# dmon prints MB/s cut to whole numbers, the agent KB/s; NVML measures PCIe over 20 ms, so two
# readers in the same second see different windows.
DMON_SCALE = {"rxpci": 1000.0, "txpci": 1000.0}


def _dmon(path: Path) -> dict[str, dict[str, float | None]]:
    """Rows of `dmon -o T` by wall-clock second (HH:MM:SS)."""
    header: list[str] = []
    rows: dict[str, dict[str, float | None]] = {}
    for line in path.read_text().splitlines():
        if line.startswith("# Time") or line.startswith("#Time"):
            header = line.lstrip("#").split()
        elif header and line.strip() and not line.startswith("#"):
            cells = line.split()
            row = dict(zip(header, cells))
            rows[row["Time"]] = {k: None if v in ("-", "N/A") else float(v) for k, v in row.items()
                                 if k not in ("Time", "gpu") and (v.replace(".", "", 1).isdigit() or v in ("-", "N/A"))}
    return rows


def _records(path: Path, kind: str) -> list[dict]:
    """Every record of one kind in the agent's batches, as `collect` kept them."""
    with gzip.open(path, "rt") as f:
        return [r for line in f for r in json.loads(line).get(kind, [])]


def compare(out: Path) -> int:
    dmon = _dmon(out / "dmon.txt")
    samples = _records(out / "batches.jsonl.gz", "gpu_samples")
    procs = _records(out / "batches.jsonl.gz", "process_samples")
    print(f"{len(samples)} agent GPU samples, {len(procs)} process samples, {len(dmon)} dmon rows")
    if samples:
        print("agent sample keys:", ", ".join(sorted(samples[0])))
    agree: dict[str, list[int]] = {}
    diffs: dict[str, list[float]] = {}
    nulls: dict[str, int] = {}
    for s in samples:
        second = time.strftime("%H:%M:%S", time.localtime(datetime.fromisoformat(s["ts"]).timestamp()))
        row = dmon.get(second)
        if row is None:
            continue
        for col, (field, tol_abs, tol_rel) in DMON.items():
            if col not in row:
                continue
            want, got = row[col], s.get(field)
            if want is None or got is None:
                nulls[col] = nulls.get(col, 0) + (want is None) * 10 + (got is None)
                continue
            want *= DMON_SCALE.get(col, 1.0)
            ok = abs(got - want) <= max(tol_abs, tol_rel * abs(want))
            agree.setdefault(col, [0, 0])[0 if ok else 1] += 1
            diffs.setdefault(col, []).append(got - want)
    print(f"{'dmon':>6} {'agent field':<16} {'agree':>6} {'differ':>6} {'median diff':>12}  nulls(dmon*10+agent)")
    for col, (field, *_tol) in DMON.items():
        a = agree.get(col, [0, 0])
        d = diffs.get(col)
        print(f"{col:>6} {field:<16} {a[0]:>6} {a[1]:>6} {statistics.median(d) if d else float('nan'):>12.1f}  {nulls.get(col, 0)}")
    mine = [p for p in procs if str(p.get("job_id")) == JOB]
    print(f"process samples tied to job {JOB}: {len(mine)} of {len(procs)}; "
          f"ranks {sorted({p.get('rank') for p in mine}, key=str)}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--phases", default=PHASES, help=f"NAME:SECONDS,... of idle, matmul, starved, gaps, copy "
                                                   f"(default {PHASES})")
    m = sub.add_parser("compare")
    m.add_argument("dir", type=Path)
    args = p.parse_args()
    if args.cmd == "collect":
        collect(args.out, args.phases)
        return compare(args.out)
    return compare(args.dir)


if __name__ == "__main__":
    raise SystemExit(main())
