"""`jobpulse watch` start-up benchmark (not a test): from the command line typed to the researcher's
COMMAND running, with the system's PostgreSQL (or the pgserver wheel where there is none).

Each round runs `jobpulse watch --dir NEW -- python -c 'print(time.time())'` in a new folder (a new
database each time, as a first run in a job would) and takes the time COMMAND printed minus the time
just before `jobpulse` was started; also the whole run (with the summary and report at the end).

    python bench/watch_startup.py [--rounds 5]

Writes bench/results/watch_startup.json (target: start-up <= 10 s on this machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from harness import finish  # noqa: E402

MARK = "jobpulse-watch-started-at"


def one(base: Path) -> tuple[float, float]:
    folder = Path(tempfile.mkdtemp(prefix="watch-", dir=base))
    command = [sys.executable, "-c", f"import time; print('{MARK}', time.time(), flush=True)"]
    started = time.time()
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "watch", "--dir", str(folder), "--",
                          *command], capture_output=True, text=True, timeout=300)
    done = time.time()
    shutil.rmtree(folder, ignore_errors=True)
    if out.returncode != 0:
        raise SystemExit(f"jobpulse watch failed ({out.returncode}): {out.stderr[-2000:]}")
    line = next(line for line in out.stdout.splitlines() if line.startswith(MARK))
    return float(line.split()[1]) - started, done - started


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    # As a user: under /tmp, not a folder only root may enter (as root the database runs as postgres).
    base = Path(tempfile.mkdtemp(prefix="jobpulse-bench-watch-"))
    base.chmod(0o755)
    rounds = []
    try:
        for i in range(args.rounds):
            startup, total = one(base)
            rounds.append({"startup_s": round(startup, 2), "total_s": round(total, 2)})
            print(f"round {i + 1}: COMMAND ran {startup:.2f} s after `jobpulse watch` started; whole run {total:.2f} s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    startups = [r["startup_s"] for r in rounds]
    out = {"rounds": rounds, "startup_s_min": min(startups), "startup_s_median": statistics.median(startups),
           "postgres": shutil.which("initdb") or "system or pgserver", "cpus": os.cpu_count(),
           "load_avg": os.getloadavg()}
    return finish("watch_startup.json", out,
                  f"start-up to COMMAND: median {out['startup_s_median']:.2f} s, min {out['startup_s_min']:.2f} s "
                  f"(target <= 10 s)")


if __name__ == "__main__":
    sys.exit(main())
