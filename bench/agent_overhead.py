"""Agent overhead benchmark (not a test): CPU time of the real agent process at 1 Hz with 8 fake
GPUs and 32 job processes (4 per GPU), shipping gzip batches over HTTP to a sink that answers
200 (on one kept-alive connection, as the collector keeps it), measured from /proc/PID/stat over a steady window; then a cProfile of the sampling path to
show what dominates.

    python bench/agent_overhead.py [--seconds 60] [--gpus 8] [--procs 32]

Prints a table and writes bench/results/agent_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, Sink, build_fake_nvml, register, scenario, start_agent, stop

JOB = "900"


def cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    fields = raw[raw.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile(ticks: int) -> None:
    """Run the sampling path in this process (started with the fake library) under cProfile."""
    import cProfile
    import pstats
    from datetime import datetime, timezone

    from jobpulse.agent.attribution import Attributor
    from jobpulse.agent.batch import Batcher
    from jobpulse.agent.jobs import JobRegistry
    from jobpulse.agent.nvml import Nvml
    from jobpulse.agent.procfs import ProcFs
    from jobpulse.agent.ship import compress
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
        ts = datetime.now(timezone.utc)
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=32)
    ap.add_argument("--profile-ticks", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.profile_ticks:
        profile(args.profile_ticks)
        return 0

    work = Path(tempfile.mkdtemp(prefix="jobpulse-agent-bench-"))
    ranks, agent = [], None
    sink = Sink()
    try:
        build_fake_nvml(work)
        for n in range(args.procs):
            env = {**os.environ, "SLURM_JOB_ID": JOB, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(n),
                   "SLURM_LOCALID": str(n % args.gpus)}
            ranks.append(subprocess.Popen(["sleep", "3600"], env=env))
        scenario(work / "s.scn", args.gpus, [p.pid for p in ranks])
        agent, env = start_agent(work, work / "s.scn", sink.url, "--interval", "1")
        register(work, JOB, args.gpus)
        time.sleep(5)  # warm-up: imports, topology snapshot, first rates
        c0, t0 = cpu_seconds(agent.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = cpu_seconds(agent.pid), time.monotonic()
        cpu, wall = c1 - c0, t1 - t0
        result = {"gpus": args.gpus, "processes": args.procs, "interval_s": 1.0, "wall_s": round(wall, 1),
                  "cpu_s": round(cpu, 3), "cpu_percent_of_one_core": round(cpu / wall * 100, 3),
                  "cpu_s_per_gpu_second": round(cpu / (wall * args.gpus), 6)}
        print(f"\njobpulse agent overhead — {os.cpu_count()} cores, Python {sys.version.split()[0]}")
        print(f"{'GPUs':>5} {'procs':>6} {'wall s':>7} {'CPU s':>7} {'CPU %':>7} {'CPU s per GPU-s':>16}")
        print(f"{args.gpus:>5} {args.procs:>6} {wall:>7.1f} {cpu:>7.3f} {result['cpu_percent_of_one_core']:>7.3f} "
              f"{result['cpu_s_per_gpu_second']:>16.6f}")
        out = ROOT / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / "agent_overhead.json").write_text(json.dumps(result, indent=2))
        subprocess.run([sys.executable, __file__, "--profile-ticks", "200"], env=env, check=True)
        return 0
    finally:
        stop(agent)
        for p in ranks:
            p.kill()
        sink.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
