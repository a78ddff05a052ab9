"""PostgreSQL dies mid-stream and comes back: 503s meanwhile, then every acknowledged batch
is present exactly once, and the collector recovered by itself."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import psycopg

from jobpulse.collector.embedded.postgres import EmbeddedPostgres
from jobpulse.schema import wire

from .batches import gpu_batch
from .conftest import start_collector, stop_collector

BATCHES = 120


def test_database_restart_mid_stream(private_postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    pg = private_postgres
    collector = start_collector(pg.dsn, tmp_path)
    acked: list[int] = []
    unavailable: list[httpx.Response] = []
    stop_sending = threading.Event()

    def agent() -> None:
        """Sends in order, retrying a batch until it is acknowledged, as the agent's spool does."""
        with collector.client(timeout=10) as http:
            for seq in range(BATCHES):
                body = wire.encode(gpu_batch(seq))
                while not stop_sending.is_set():
                    try:
                        r = http.post("/v1/batches", content=body)
                    except httpx.TransportError:
                        time.sleep(0.2)
                        continue
                    if r.status_code == 200:
                        acked.append(seq)
                        break
                    assert r.status_code == 503, r.text
                    unavailable.append(r)
                    time.sleep(0.2)
                time.sleep(0.02)

    sender = threading.Thread(target=agent)
    sender.start()
    deadline = time.monotonic() + 60
    while len(acked) < 30:
        assert sender.is_alive() and time.monotonic() < deadline, "batches were not acknowledged"
        time.sleep(0.05)
    pg.stop(mode="immediate")  # a crash: connections die mid-transaction
    outage_start = time.monotonic()
    while time.monotonic() - outage_start < 4:
        time.sleep(0.2)
    during = httpx.get(f"{collector.url}/healthz", timeout=10)
    assert during.status_code == 503 and during.json()["database"] == "unreachable"
    assert collector.proc.poll() is None, "the collector must keep running"
    pg.start()
    sender.join(timeout=120)
    stop_sending.set()
    assert not sender.is_alive(), "ingest did not resume after the database came back"

    assert unavailable, "expected 503s while the database was down"
    assert all(r.headers.get("Retry-After", "").isdigit() for r in unavailable)
    assert acked == list(range(BATCHES))
    with psycopg.connect(pg.dsn) as conn:
        per_seq = dict(conn.execute("SELECT seq, count(*) FROM jobpulse.ingest_batches GROUP BY seq").fetchall())
        samples = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0]
    assert per_seq == {seq: 1 for seq in range(BATCHES)}
    assert samples == 2 * BATCHES
    assert httpx.get(f"{collector.url}/healthz", timeout=10).status_code == 200
    metrics = httpx.get(f"{collector.url}/metrics").text
    assert "jobpulse_collector_db_errors_total" in metrics
    stop_collector(collector)
    assert "Traceback" not in collector.log.read_text()
    print(f"\noutage: {len(unavailable)} answers 503 while the database was down; {BATCHES} batches stored once")
