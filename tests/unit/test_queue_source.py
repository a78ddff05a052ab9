"""Where the Slurm sync reads what waits in each partition: slurmctld's OpenMetrics endpoint while it
answers, squeue's jobs while it refuses or is gone."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from jobpulse.agent.slurm import dialect, queue

from ..batches import now


def test_the_sync_reads_openmetrics_where_it_answers_and_squeue_where_not() -> None:
    """slurmctld's endpoint over real HTTP (the recorded 26.05 answer): its count; refused (as with
    PrivateData) or gone: squeue's, and back to OpenMetrics once it answers again."""
    data = Path(__file__).resolve().parent.parent / "data" / "slurm"
    body = (data / "openmetrics-partitions-26.05.txt").read_bytes()
    status = [200]

    class Ctld(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == queue.PATH and status[0] == 200
            self.send_response(status[0] if self.path == queue.PATH else 404)
            self.end_headers()
            self.wfile.write(body if ok else b"denied")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ctld)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    jobs = dialect.squeue_jobs(json.loads((data / "squeue-queue-26.05.json").read_text()))
    try:
        q = queue.Queue(["false"], f"http://127.0.0.1:{server.server_address[1]}{queue.PATH}")

        def read() -> list[tuple[str, int, str]]:
            return [(r.partition, r.jobs_pending, r.source) for r in q.read(jobs, now(), timeout_s=5)]
        assert read() == [("debug", 1, "openmetrics"), ("gpu", 4, "openmetrics")]
        status[0] = 403
        assert read() == [("debug", 2, "squeue"), ("gpu", 4, "squeue")]
        status[0] = 200
        assert read() == [("debug", 1, "openmetrics"), ("gpu", 4, "openmetrics")]
    finally:
        server.shutdown()
        server.server_close()
