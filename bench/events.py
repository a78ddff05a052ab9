"""Application-event throughput (not a test): how many events per second one process can send
with the client, and how many the agent accepts and forwards (datagram socket -> attribution ->
batch -> gzip HTTP) to a collector stand-in that counts them.

    python bench/events.py [--events 100000] [--senders 1,4]

Prints a table and writes bench/results/events.json.
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

from harness import ROOT, Sink, build_fake_nvml, register, start_agent, stop

JOB = "901"
SENDER = """
import json, sys, time
from jobpulse.agent import client as jp
n = int(sys.argv[1])
t = time.perf_counter()
for i in range(n):
    jp.event("step done", level="info", i=i, loss=0.25)
jp.flush(30)
print(json.dumps({"seconds": time.perf_counter() - t, "sent": jp.sent(), "dropped": jp.dropped()}))
"""


def run(work: Path, sink: Sink, events: int, senders: int) -> dict[str, float]:
    before = sink.counts["events"]
    env = {**os.environ, "JOBPULSE_EVENTS_SOCKET": str(work / "events.sock"), "SLURM_JOB_ID": JOB,
           "SLURM_STEP_ID": "0"}
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", SENDER, str(events // senders)], stdout=subprocess.PIPE,
                              env={**env, "SLURM_PROCID": str(r)}) for r in range(senders)]
    results = [json.loads(p.communicate()[0]) for p in procs]
    sent = sum(r["sent"] for r in results)
    deadline = time.monotonic() + 60
    while sink.counts["events"] - before < sent and time.monotonic() < deadline:
        time.sleep(0.1)
    forwarded = sink.counts["events"] - before
    return {"senders": senders, "events": events, "sent": sent, "client_dropped": sum(r["dropped"] for r in results),
            "send_rate_per_process": round(min(r["sent"] / r["seconds"] for r in results)),
            "forwarded": forwarded, "forward_rate": round(forwarded / (sink.last_event_at - start))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--senders", default="1,4")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jobpulse-events-bench-"))
    sink = Sink()
    agent = None
    try:
        build_fake_nvml(work)
        (work / "s.scn").write_text(f"start {time.time()}\ngpu 0 GPU-ev 00000000:17:00.0 0 0\nset 0 0 sm 50 mem 5\n")
        agent, _ = start_agent(work, work / "s.scn", sink.url, "--event-rate", "1e9", "--event-burst", "1e9")
        register(work, JOB, 1)
        rows = [run(work, sink, args.events, int(s)) for s in args.senders.split(",")]
        print(f"\njobpulse application events — {os.cpu_count()} cores, Python {sys.version.split()[0]}")
        print(f"{'senders':>7} {'events':>8} {'sent':>8} {'client drop':>11} {'send/s/proc':>11} "
              f"{'forwarded':>9} {'agent fwd/s':>11}")
        for r in rows:
            print(f"{r['senders']:>7} {r['events']:>8,} {r['sent']:>8,} {r['client_dropped']:>11,} "
                  f"{r['send_rate_per_process']:>11,} {r['forwarded']:>9,} {r['forward_rate']:>11,}")
        out = ROOT / "bench" / "results"
        out.mkdir(exist_ok=True)
        (out / "events.json").write_text(json.dumps(rows, indent=2))
        return 0
    finally:
        stop(agent)
        sink.shutdown()
        if os.environ.get("KEEP"):
            print(work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
