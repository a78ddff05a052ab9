"""Agent overhead benchmark (not a test): CPU time of the real agent process at 1 Hz with 8 fake
GPUs and 32 job processes (4 per GPU), shipping gzip batches over HTTP to a sink that answers
200 (on one kept-alive connection, as the collector keeps it), measured from /proc/PID/stat over a steady window; then a cProfile of the sampling path to
show what dominates.

    python bench/agent_overhead.py [--seconds 60] [--gpus 8] [--procs 32] [--rounds 1] [--baseline DIR]
                                   [--fabric PORTS] [--cgroup] [--others N] [--churn R]

``--baseline DIR``: also run the agent of another version (DIR on PYTHONPATH holds its ``jobpulse``
package, e.g. ``git archive main`` unpacked into DIR/jobpulse), alternated with this one (baseline,
this, baseline, this, ...) on the same fake library and set-up, so both see the same machine load.
``--fabric PORTS``: alternate this version without the fabric source (``--no-fabric``) and with it
reading a sysfs tree of PORTS InfiniBand ports (`tests/sysfs_tree.py`) whose counters move every
second, to measure what reading the fabric adds.
``--cgroup``: alternate the job's processes in no cgroup of the job's (the agent lists /proc every
tick, as under proctrack/linuxproc) and in a cgroup v2 tree in Slurm's layout
(``job_ID/step_0/user/task_N``, one task a GPU; root and a writable cgroup2 mount), from which the
agent then takes them. ``--others N`` starts N more processes that are no job's and ``--churn R``
starts R short-lived ones a second, as a busy node has (what the /proc listing has to look at).
Prints a table (with the load average around each run) and writes bench/results/agent_overhead.json:
``cpu_percent_of_one_core`` is the median of this version's runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC
from pathlib import Path
from typing import Any

from harness import ROOT, Sink, build_fake_nvml, register, scenario, start_agent, stop

sys.path.insert(0, str(ROOT))
from tests.sysfs_tree import SysfsTree  # the tests' sysfs tree, from the checkout

JOB = "900"


def cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    fields = raw[raw.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile(ticks: int) -> None:
    """Run the sampling path in this process (started with the fake library) under cProfile."""
    import cProfile
    import pstats
    from datetime import datetime

    from jobpulse.agent.attribution import Attributor
    from jobpulse.agent.control.jobs import JobRegistry
    from jobpulse.agent.nvml import Nvml
    from jobpulse.agent.procfs import ProcFs
    from jobpulse.agent.shipping.batch import Batcher
    from jobpulse.agent.shipping.send import compress
    from jobpulse.agent.sources.gpu import GpuSampler
    from jobpulse.agent.sources.processes import ProcessSampler

    nvml = Nvml()
    jobs = JobRegistry(nvml.gpus)
    jobs.register({"job_id": JOB, "uid": os.getuid(), "gpus": [str(g.index) for g in nvml.gpus]})
    proc = ProcFs()
    gpus = GpuSampler(nvml, jobs.job_of_gpu)
    procs = ProcessSampler(nvml, proc, Attributor(proc, jobs.uid_of), jobs.job_ids)
    batcher = Batcher("bench", "bench")

    def tick() -> None:
        ts = datetime.now(UTC)
        batcher.add("gpu_samples", gpus.sample(ts))
        batcher.add("process_samples", procs.sample(ts))
        ready = batcher.take()
        if ready:
            compress(ready)

    tick()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(ticks):
        tick()
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"\ncProfile of {ticks} sampling ticks (sample + attribute + batch + validate + gzip): "
          f"{total / ticks * 1000:.2f} ms per tick")
    stats.sort_stats("tottime").print_stats(12)


def fabric_tree(root: Path, ports: int, stop_moving: threading.Event) -> list[str]:
    """``ports`` 4X EDR ports under ``root`` and a thread moving their data counters each second:
    the agent's options that read them (none: ``--no-fabric``)."""
    if not ports:
        return ["--no-fabric"]
    tree = SysfsTree(root)
    for d in range(ports):
        tree.add_port(f"mlx5_{d}", 1)

    def move() -> None:
        while not stop_moving.wait(1.0):
            for d in range(ports):
                tree.add_bytes(f"mlx5_{d}", 1, rx=3 * 10**9, tx=3 * 10**9)
    threading.Thread(target=move, daemon=True).start()
    return ["--sysfs-root", str(root)]


def cgroup2() -> Path | None:
    """A cgroup2 mount this process may make directories in (None: none, or not root)."""
    from jobpulse.agent.procfs import cgroup_mounts

    if os.geteuid() != 0:
        return None
    mounts = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    found = next((Path(point) for options, root, point in mounts if options is None and root == "/"), None)
    return found if found and os.access(found, os.W_OK) else None


def job_cgroup(ranks: list[subprocess.Popen[bytes]], gpus: int) -> Path:
    """The ranks moved into a job cgroup in Slurm's v2 layout (a task directory a GPU); its top folder."""
    top = cgroup2()
    if top is None:
        raise SystemExit("--cgroup needs root and a writable cgroup2 mount")
    base = Path(tempfile.mkdtemp(prefix="jobpulse-bench-", dir=top))
    job = base / "system.slice" / "slurmstepd.scope" / f"job_{JOB}"
    for n, rank in enumerate(ranks):
        task = job / "step_0" / "user" / f"task_{n % gpus}"
        task.mkdir(parents=True, exist_ok=True)
        (task / "cgroup.procs").write_text(str(rank.pid))
    return base


def remove_cgroup(base: Path) -> None:
    """Once its processes are gone (reaped), the tree, deepest first."""
    for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [base]:
        deadline = time.monotonic() + 10
        while d.exists():
            try:
                d.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def churn(rate: float, stop_churning: threading.Event) -> None:
    """``rate`` short-lived processes a second (each lives a tenth of a second), until told to stop."""
    def spawn() -> None:
        while not stop_churning.wait(1.0 / rate):
            subprocess.Popen(["sleep", "0.1"]).wait()
    threading.Thread(target=spawn, daemon=True).start()


def run_once(seconds: float, gpus: int, procs: int, pythonpath: str | None, profile_ticks: int = 0,
             fabric_ports: int = -1, in_cgroup: bool = False, others: int = 0, churn_rate: float = 0) -> dict[str, float]:
    """One agent (this version, or the one on ``pythonpath``) measured over a steady window; then,
    with ``profile_ticks``, this version's sampling path profiled on the same set-up."""
    work = Path(tempfile.mkdtemp(prefix="jobpulse-agent-bench-"))
    ranks: list[subprocess.Popen[bytes]] = []
    bystanders: list[subprocess.Popen[bytes]] = []
    agent = None
    sink = Sink()
    stop_moving = threading.Event()
    cgroup = None
    try:
        fabric = [] if fabric_ports < 0 else fabric_tree(work / "sys", fabric_ports, stop_moving)
        build_fake_nvml(work)
        for n in range(procs):
            env = {**os.environ, "SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(n),
                   "SLURM_LOCALID": str(n % gpus)}
            ranks.append(subprocess.Popen(["sleep", "3600"], env=env))
        bystanders = [subprocess.Popen(["sleep", "3600"]) for _ in range(others)]
        if churn_rate:
            churn(churn_rate, stop_moving)
        if in_cgroup:
            cgroup = job_cgroup(ranks, gpus)
        scenario(work / "s.scn", gpus, [p.pid for p in ranks])
        agent, env = start_agent(work, work / "s.scn", sink.url, "--interval", "1", *fabric, pythonpath=pythonpath)
        register(work, JOB, gpus)
        time.sleep(5)  # warm-up: imports, topology snapshot, first rates
        load0 = os.getloadavg()[0]
        c0, t0 = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu_seconds(agent.pid), time.monotonic()
        cpu, wall = c1 - c0, t1 - t0
        result = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 3),
                  "cpu_percent_of_one_core": round(cpu / wall * 100, 3), "cpu_ms_per_tick": round(cpu / wall * 1000, 3),
                  "processes_on_machine": sum(1 for e in os.listdir("/proc") if e.isdigit()),
                  "cpu_s_per_gpu_second": round(cpu / (wall * gpus), 6), "load_average_1min_start": load0,
                  "load_average_1min_end": os.getloadavg()[0]}
        stop(agent)
        if profile_ticks:
            subprocess.run([sys.executable, __file__, "--profile-ticks", str(profile_ticks)], env=env, check=True)
        return result
    finally:
        stop_moving.set()
        stop(agent)
        for p in ranks + bystanders:
            p.kill()
            p.wait()
        if cgroup is not None:
            remove_cgroup(cgroup)
        sink.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1, help="runs of each version")
    ap.add_argument("--baseline", metavar="DIR", help="PYTHONPATH holding the version to alternate with")
    ap.add_argument("--fabric", type=int, default=0, metavar="PORTS",
                    help="alternate without the fabric source and with it reading PORTS InfiniBand ports")
    ap.add_argument("--cgroup", action="store_true",
                    help="alternate the job's processes listed from /proc and taken from their cgroup v2 tree")
    ap.add_argument("--others", type=int, default=0, metavar="N", help="N more processes that are no job's")
    ap.add_argument("--churn", type=float, default=0, metavar="R", help="R short-lived processes a second")
    ap.add_argument("--profile-ticks", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.profile_ticks:
        profile(args.profile_ticks)
        return 0
    if args.baseline and not (Path(args.baseline) / "jobpulse" / "agent" / "run.py").is_file():
        ap.error(f"--baseline {args.baseline}: no jobpulse/agent/run.py under it")

    versions = [("baseline", args.baseline, -1), ("this", None, -1)] if args.baseline else [("this", None, -1)]
    if args.fabric:
        versions = [("nofabric", None, 0), ("fabric", None, args.fabric)]
    if args.cgroup:
        versions = [("proc", None, -1), ("cgroup", None, -1)]
    runs: list[dict[str, Any]] = []
    print(f"\njobpulse agent overhead — {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"{'version':>8} {'GPUs':>5} {'procs':>6} {'wall s':>7} {'CPU s':>7} {'CPU %':>7} {'CPU s per GPU-s':>16} "
          f"{'load 1 min':>11} {'ms/tick':>8} {'on host':>8}")
    for _ in range(args.rounds):
        for name, path, ports in versions:
            r = run_once(args.seconds, args.gpus, args.procs, path, fabric_ports=ports, in_cgroup=name == "cgroup",
                         others=args.others, churn_rate=args.churn)
            runs.append({"version": name, **r})
            print(f"{name:>8} {args.gpus:>5} {args.procs:>6} {r['wall_s']:>7.1f} {r['cpu_s']:>7.3f} "
                  f"{r['cpu_percent_of_one_core']:>7.3f} {r['cpu_s_per_gpu_second']:>16.6f} "
                  f"{r['load_average_1min_start']:>5.1f}-{r['load_average_1min_end']:.1f} "
                  f"{r['cpu_ms_per_tick']:>8.3f} {r['processes_on_machine']:>8}", flush=True)
    result: dict[str, Any] = {"gpus": args.gpus, "processes": args.procs, "interval_s": 1.0, "window_s": args.seconds,
                              "fabric_ports": args.fabric, "others": args.others, "churn_per_s": args.churn}
    for name, _, _ in versions:
        pct = [r["cpu_percent_of_one_core"] for r in runs if r["version"] == name]
        prefix = "" if name in ("this", "fabric", "cgroup") else f"{name}_" if name in ("nofabric", "proc") \
            else "baseline_"
        result |= {f"{prefix}cpu_percent_of_one_core": round(statistics.median(pct), 3),
                   f"{prefix}cpu_percent_min": min(pct)}
        print(f"{name}: min {min(pct):.3f} %, median {statistics.median(pct):.3f} % of one core ({len(pct)} runs)")
    result["baseline"] = args.baseline
    result["runs"] = runs
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "agent_overhead.json").write_text(json.dumps(result, indent=2))
    run_once(1, args.gpus, args.procs, None, profile_ticks=200)  # where this version's time goes
    return 0


if __name__ == "__main__":
    sys.exit(main())
