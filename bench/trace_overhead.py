"""Trace consent overhead benchmark (not a test): what `jp.allow_traces()` costs a rank between traces.

A rank that allows traces looks for the agent's requests at each `jp.step()` (one non-blocking recv
on its event socket). Two rank processes in one job alternate windows of calling `jp.step()` as fast
as they can — one that allowed traces, one that did not — against the agent's real event socket and
tracer in this process (which answers their hello), so both see the same machine. The figure is the
steps per second with traces allowed relative to without (min and median over the rounds), and the
cost of one step() call each way. A step of real training takes milliseconds to seconds: the
difference per call is what matters, not the ratio of two empty loops.

    python bench/trace_overhead.py [--rounds 5] [--seconds 3]

Writes bench/results/trace_overhead.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import finish  # noqa: E402

from jobpulse.agent.attribution import Attributor  # noqa: E402
from jobpulse.agent.capture.trace import Tracer  # noqa: E402
from jobpulse.agent.procfs import ProcFs  # noqa: E402
from jobpulse.agent.sources.app_events import EventListener  # noqa: E402

RANK = """
import sys, time
from jobpulse.agent import client as jp
class Never:
    def start(self): raise RuntimeError("not asked in this benchmark")
    def step(self): pass
    def stop(self, path): pass
if sys.argv[1] == "allowed":
    jp.allow_traces(Never())
    time.sleep(0.5)  # the agent's answer to the hello arrives
for line in sys.stdin:  # one window per line: step as fast as possible for that many seconds
    seconds = float(line)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += 1
        jp.step(n)
    print(n / (time.perf_counter() - start), jp.dropped(), flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="jobpulse-trace-bench-"))
    attributor = Attributor(ProcFs(), lambda job: os.getuid())


    listeners: list[EventListener] = []
    tracer = Tracer("bench", attributor.job_of, lambda address, data: listeners[0].send_to(address, data))
    received = [0]
    listeners.append(EventListener(folder / "events.sock", attributor, lambda got: received.__setitem__(
        0, received[0] + len(got)), lambda _r, _n: None, rate=1e9, burst=1e9, on_trace=tracer.on_message))
    listeners[0].start()
    env = {**os.environ, "JOBPULSE_EVENTS_SOCKET": str(folder / "events.sock"), "SLURM_JOB_ID": "1",
           "SLURM_PROCID": "0", "PYTHONPATH": str(ROOT.parent)}
    ranks = {mode: subprocess.Popen([sys.executable, "-c", RANK, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True, env=env) for mode in ("plain", "allowed")}
    rates: dict[str, list[float]] = {"plain": [], "allowed": []}
    try:
        for n in range(args.rounds):
            for mode in ("plain", "allowed") if n % 2 == 0 else ("allowed", "plain"):  # alternated, either first
                rank = ranks[mode]
                assert rank.stdin is not None and rank.stdout is not None
                rank.stdin.write(f"{args.seconds}\n")
                rank.stdin.flush()
                rates[mode].append(float(rank.stdout.readline().split()[0]))
        answered = sorted(tracer._clients)
    finally:
        for rank in ranks.values():
            rank.kill()
        listeners[0].close()
    ratios = [a / p for a, p in zip(rates["allowed"], rates["plain"], strict=True)]
    out = {
        "rounds": args.rounds, "seconds": args.seconds, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "steps_per_s": {mode: {"min": round(min(r)), "median": round(statistics.median(r))} for mode, r in rates.items()},
        "us_per_step": {mode: round(1e6 / statistics.median(r), 2) for mode, r in rates.items()},
        "allowed_ratio_min": round(min(ratios), 3), "allowed_ratio_median": round(statistics.median(ratios), 3),
        "extra_us_per_step_median": round(1e6 / statistics.median(rates["allowed"])
                                          - 1e6 / statistics.median(rates["plain"]), 2),
        "hello_answered": len(answered) == 1, "events_received": received[0],
    }
    print(f"jp.step() as fast as it goes, {args.rounds} alternated rounds of {args.seconds:g} s each way:")
    for mode in rates:
        print(f"  {mode:8} median {out['steps_per_s'][mode]['median']:>9,} steps/s "  # type: ignore[index]
              f"({out['us_per_step'][mode]} us a step; min {out['steps_per_s'][mode]['min']:,})")  # type: ignore[index]
    return finish("trace_overhead.json", out,
                  f"  allowed / plain: median {out['allowed_ratio_median']}, min {out['allowed_ratio_min']}; "
                  f"{out['extra_us_per_step_median']} us more a step")


if __name__ == "__main__":
    sys.exit(main())
