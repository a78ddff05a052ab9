"""Capture overhead benchmark (not a test): what sampling a rank's stacks costs the rank.

A pure-Python workload (a decoding loop, as a data loader's) reports how many iterations it does
per window; windows without a capture alternate with windows while the agent's capture runs on it
(`agent.capture.stacks.Capturer`: `py-spy record --nonblocking` at its rate), so both see the same machine
load. The figure is the throughput during a capture relative to the windows around it (min and
median over the rounds), in wall time and per CPU-second the workload got (what reading its memory
costs it, whatever else the machine runs); and how long the capture took beside what was asked.

    python bench/capture_overhead.py [--rounds 5] [--seconds 5]

Writes bench/results/capture_overhead.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import finish  # noqa: E402

from jobpulse.agent.capture.stacks import Capturer, py_spy  # noqa: E402
from jobpulse.schema import wire  # noqa: E402

WORKLOAD = """
import sys, time
def decode(blob):
    out = 0
    for ch in blob:
        out = (out * 31 + ord(ch)) % 1000003
    return out
blob = "x" * 2000
n, mark, cpu_mark = 0, time.monotonic(), time.process_time()
while True:
    decode(blob)
    n += 1
    now = time.monotonic()
    if now - mark >= 0.25:
        cpu = time.process_time()
        print(f"{now} {n / (now - mark)} {n / max(cpu - cpu_mark, 1e-6)}", flush=True)
        n, mark, cpu_mark = 0, now, cpu
"""


def rate_between(lines: list[tuple[float, float, float]], start: float, end: float, per_cpu: bool = False) -> float:
    """Iterations per wall second (or per CPU-second of the workload) over the lines in (start, end]."""
    inside = [(c if per_cpu else r) for t, r, c in lines if start < t <= end]
    return statistics.mean(inside) if inside else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    if py_spy() is None:
        print("py-spy is not installed (make setup installs it with the agent extra)", file=sys.stderr)
        return 1
    work = subprocess.Popen([sys.executable, "-c", WORKLOAD], stdout=subprocess.PIPE, text=True)
    pid = work.pid
    capturer = Capturer("bench", lambda p: "1", lambda _: None)
    lines: list[tuple[float, float, float]] = []

    def read_until(deadline: float) -> None:
        assert work.stdout is not None
        while time.monotonic() < deadline:
            t, r, c = work.stdout.readline().split()
            lines.append((float(t), float(r), float(c)))

    read_until(time.monotonic() + 2)  # warm up
    rounds = []
    try:
        for i in range(args.rounds):
            before = time.monotonic()
            read_until(before + args.seconds)
            started = time.monotonic()
            spy_before = resource.getrusage(resource.RUSAGE_CHILDREN)  # (py-spy's runs are reaped children)
            result = capturer.run(wire.Capture(id=i + 1, job_id="1", pids=[pid], seconds=args.seconds))
            ended = time.monotonic()
            spy_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            spy_cpu = (spy_after.ru_utime + spy_after.ru_stime) - (spy_before.ru_utime + spy_before.ru_stime)
            read_until(ended + args.seconds)
            # (lines arrive every 0.25 s; those of the capture window were read after it)
            first, last = rate_between(lines, before, started), rate_between(lines, ended, ended + args.seconds)
            base = statistics.mean([first, last])
            during = rate_between(lines, started + 0.5, ended - 0.25)
            # Per CPU-second of the workload: what reading its memory costs it, whatever else the
            # machine runs (on a busy 2-core machine the wall figure mostly measures the neighbours).
            cpu_base = statistics.mean([rate_between(lines, before, started, True),
                                        rate_between(lines, ended, ended + args.seconds, True)])
            cpu_during = rate_between(lines, started + 0.5, ended - 0.25, True)
            # The machine's own noise: the two windows without a capture, one against the other.
            rounds.append({"throughput_ratio": during / base, "no_capture_ratio": last / first,
                           "per_cpu_ratio": cpu_during / cpu_base, "py_spy_cpu_s": spy_cpu,
                           "capture_s": ended - started, "samples": result.samples.get("main", 0), "ok": result.ok})
            print(f"round {i + 1}: throughput during the capture {during / base:.3f} of the windows around it "
                  f"(per CPU-second {cpu_during / cpu_base:.3f}), "
                  f"capture {ended - started:.2f} s for {args.seconds:.0f} s asked, {result.samples} samples, "
                  f"py-spy used {spy_cpu:.2f} CPU-s")
    finally:
        work.kill()
    ratios = [r["throughput_ratio"] for r in rounds]
    noise = [abs(1 - r["no_capture_ratio"]) for r in rounds]
    per_cpu = [r["per_cpu_ratio"] for r in rounds]
    out = {"rounds": rounds, "throughput_ratio_min": min(ratios), "throughput_ratio_median": statistics.median(ratios),
           "noise_percent_median": round(100 * statistics.median(noise), 2),
           "per_cpu_ratio_min": min(per_cpu), "per_cpu_ratio_median": statistics.median(per_cpu),
           "py_spy_cpu_percent_of_one_core": round(100 * statistics.median(r["py_spy_cpu_s"] for r in rounds)
                                                   / args.seconds, 2),
           "loss_percent_median": round(100 * (1 - statistics.median(ratios)), 2),
           "rate_hz": 50, "cpus": os.cpu_count(), "load_avg": os.getloadavg()}
    return finish("capture_overhead.json", out,
                  f"throughput during a capture: median {out['throughput_ratio_median']:.3f}, "
                  f"min {out['throughput_ratio_min']:.3f} (loss {out['loss_percent_median']} % median; two windows without "
                  f"a capture differ by {out['noise_percent_median']} % median on this machine); per CPU-second of the "
                  f"workload: median {out['per_cpu_ratio_median']:.3f}, min {out['per_cpu_ratio_min']:.3f}; py-spy itself: "
                  f"{out['py_spy_cpu_percent_of_one_core']} % of one core while it samples")


if __name__ == "__main__":
    sys.exit(main())
