"""Notification latency (not a test): from a flag's first rule cycle (its ``opened_at``) until its
webhook receiver has it, through a real collector on PostgreSQL running its rule loop and its
delivery thread. Jobs arrive a few seconds apart, each with a GPU it never uses beside one it uses
(an ``over_allocation`` flag each), judged with thresholds in seconds so that a run takes a minute.

    python bench/notify_latency.py [--flags 12] [--rules-interval 5] [--spacing 3]

Prints min / median / max and writes bench/results/notify_latency.json. Target: <= 60 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psycopg
from harness import load_note, save, start_collector
from seed import database

from jobpulse.collector.embedded.postgres import free_port
from jobpulse.schema import wire

RULES = """[defaults]
idle_minutes = 0.05
window_minutes = 0.5
evidence_block_seconds = 10
evidence_minutes = 0.3
warmup_minutes = 0.0
warmup_max_minutes = 0.2
min_samples = 4
"""


class Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.got: dict[str, float] = {}  # job -> when it arrived (epoch seconds)
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                got.setdefault(str(body["job_id"]), time.time())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)


def job_batch(job: str, seq: int) -> bytes:
    now = datetime.now(UTC)
    start = now - timedelta(seconds=40)
    agent = wire.AgentInfo(instance="notify-bench", node="n1", cluster="bench", version="0", started_at=start)
    record = wire.JobRecord(job_id=job, user_name="bench", start_time=start, state="RUNNING",
                            gpus=[wire.JobGpu(f"GPU-{job}-a", 0), wire.JobGpu(f"GPU-{job}-b", 1)])
    samples = [wire.GpuSample(ts=start + timedelta(seconds=s), gpu_uuid=f"GPU-{job}-{x}", gpu_index=i, job_id=job,
                              sm_util=util, fb_used_mib=20_000, fb_total_mib=81_559)
               for s in range(40) for i, (x, util) in enumerate((("a", 90), ("b", 0)))]
    return wire.encode(wire.Batch(version=1, agent=agent, seq=seq, created_at=now, gpu_samples=samples,
                                  jobs=[record]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flags", type=int, default=12)
    ap.add_argument("--rules-interval", type=float, default=5.0, help="the collector's rule cycle (default 5 s)")
    ap.add_argument("--spacing", type=float, default=3.0, help="seconds between jobs")
    args = ap.parse_args()
    note = load_note()
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="jobpulse-bench-notify-"))
    (work / "rules.toml").write_text(RULES)
    (work / "notify.toml").write_text(f'[[webhook]]\nname = "bench"\nurl = "http://127.0.0.1:{receiver.server_address[1]}/"\n'
                                      'format = "json"\n')
    jobs = [str(700_000 + i) for i in range(args.flags)]
    with database("notify") as pg:
        proc, port = start_collector(work, pg.dsn, "--rules", str(work / "rules.toml"), "--rules-interval",
                                     str(args.rules_interval), "--notify", str(work / "notify.toml"))
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer bench"}) as http:
                for seq, job in enumerate(jobs):
                    assert http.post("/v1/batches", content=job_batch(job, seq)).status_code == 200
                    time.sleep(args.spacing)
            deadline = time.monotonic() + 120
            while len(receiver.got) < len(jobs) and time.monotonic() < deadline:
                time.sleep(0.2)
            with psycopg.connect(pg.dsn) as conn:
                opened = dict(conn.execute("SELECT job_id, extract(epoch FROM opened_at)::float8 FROM jobpulse.job_flags"
                                           " WHERE rule_id = 'over_allocation'").fetchall())
        finally:
            proc.terminate()
            proc.wait(30)
    seconds = sorted(receiver.got[j] - opened[j] for j in jobs if j in receiver.got and j in opened)
    result = {"flags": len(jobs), "delivered": len(seconds), "min_s": round(seconds[0], 3) if seconds else None,
              "median_s": round(statistics.median(seconds), 3) if seconds else None,
              "max_s": round(seconds[-1], 3) if seconds else None, "rules_interval_s": args.rules_interval,
              "note": note + "; a flag's first cycle is its opened_at (the cycle's transaction time)"}
    print(f"flag opened -> webhook receiver, {result['delivered']} of {len(jobs)} flags: min {result['min_s']} s, "
          f"median {result['median_s']} s, max {result['max_s']} s ({note})")
    print(f"wrote {save('notify_latency.json', result)}")
    return 0 if len(seconds) == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
