"""Ingest benchmark (not a test): GPU-sample rows per second end to end — agents' HTTP batches
through a real collector process into PostgreSQL — against raw binary COPY of the same rows
into the same table of the same database, in the same run.

    python bench/ingest.py [--rows 200000] [--batch-sizes 8,64,512] [--senders 4]

Prints a table and writes bench/results/ingest.json.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import psycopg

from jobpulse.collector.demo.embedded_postgres import EmbeddedPostgres, free_port
from jobpulse.collector.store import migrations, partitions
from jobpulse.schema import wire

TOKEN = "bench-token"


def make_samples(n: int, n_gpus: int = 8) -> list[wire.GpuSample]:
    """``n`` fully populated H100-like samples: ``n_gpus`` GPUs sampled at 1 Hz."""
    t0 = datetime.now(timezone.utc) - timedelta(seconds=n // n_gpus + 1)
    out = []
    for i in range(n):
        g = i % n_gpus
        out.append(wire.GpuSample(
            ts=t0 + timedelta(seconds=i // n_gpus), gpu_uuid=f"GPU-bench-{g:02d}", gpu_index=g, job_id="424242",
            sm_util=i % 101, mem_util=(i * 7) % 101, enc_util=0, dec_util=0, jpg_util=0, ofa_util=0,
            power_w=300.0 + (i % 400), power_limit_w=700.0, energy_mj=10**9 + i * 300, gpu_temp_c=60, mem_temp_c=68,
            sm_clock_mhz=1980, mem_clock_mhz=2619, sm_clock_max_mhz=1980, mem_clock_max_mhz=2619,
            fb_used_mib=40_000 + i % 1000, fb_total_mib=81_559, pcie_rx_kbs=1_000_000, pcie_tx_kbs=500_000,
            pcie_gen=5, pcie_width=16, pcie_gen_max=5, pcie_width_max=16, pcie_replay=0, nvlink_rx_kbs=10**8,
            nvlink_tx_kbs=10**8, clock_event_reasons=0, ecc_sbe_total=0, ecc_dbe_total=0, remapped_correctable=0,
            remapped_uncorrectable=0, remap_pending=False, remap_failure=False, gpm_sm_active=70.5,
            gpm_sm_occupancy=30.25, gpm_tensor_active=40.0, gpm_dram_bw=55.0, gpm_fp16_active=30.0,
            gpm_fp32_active=5.0, gpm_fp64_active=0.0,
        ))
    return out


def raw_copy(dsn: str, samples: list[wire.GpuSample]) -> float:
    """Baseline: one binary COPY of the same rows; returns rows per second."""
    with psycopg.connect(dsn) as conn:
        types = dict(conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'jobpulse.gpu_samples'::regclass AND attnum > 0 AND NOT attisdropped").fetchall())
        cols = ["cluster", "node", *wire.GpuSample.__struct_fields__]
        rows = [("bench", "raw", *msgspec.structs.astuple(s)) for s in samples]
        start = time.perf_counter()
        with conn.cursor().copy(f"COPY jobpulse.gpu_samples ({', '.join(cols)}) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types([types[c] for c in cols])
            for row in rows:
                cp.write_row(row)
        conn.commit()
        return len(rows) / (time.perf_counter() - start)


def bodies(samples: list[wire.GpuSample], batch_size: int, senders: int) -> list[list[bytes]]:
    """Pre-encoded gzip batches per sender (agent instance), so senders cost the collector nothing."""
    per_sender: list[list[bytes]] = [[] for _ in range(senders)]
    now = datetime.now(timezone.utc)
    for k, start in enumerate(range(0, len(samples), batch_size)):
        s = k % senders
        agent = wire.AgentInfo(instance=f"bench-{batch_size}-{s}", node=f"node{s:03d}", cluster="bench",
                               version="bench", started_at=now)
        b = wire.Batch(version=1, agent=agent, seq=len(per_sender[s]), created_at=now,
                       gpu_samples=samples[start:start + batch_size])
        per_sender[s].append(gzip.compress(wire.encode(b), compresslevel=1))
    return per_sender


def http_ingest(port: int, per_sender: list[list[bytes]]) -> tuple[float, list[float]]:
    """Send every batch (one keep-alive connection per sender); returns wall seconds and latencies."""
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[str] = []

    def send(batches: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                   "Content-Encoding": "gzip"}
        for body in batches:
            t = time.perf_counter()
            conn.request("POST", "/v1/batches", body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                errors.append(f"{resp.status} {data[:200]!r}")
                return
            mine.append(time.perf_counter() - t)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=send, args=(b,)) for b in per_sender]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"collector refused batches: {errors[:3]}")
    return wall, sorted(latencies)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-sizes", default="8,64,512")
    ap.add_argument("--senders", type=int, default=4)
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="jobpulse-bench-"))
    pg = EmbeddedPostgres(base / "data")
    pg.start()
    collector = None
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            migrations.upgrade(conn)
            partitions.ensure_ahead(conn, 2)
        samples = make_samples(args.rows)
        raw_rate = raw_copy(pg.dsn, samples)

        tokens = base / "tokens"
        tokens.write_text(TOKEN + "\n")
        port = free_port()
        collector = subprocess.Popen(
            [sys.executable, "-m", "jobpulse.collector.cli", "collector", "serve", "--dsn", pg.dsn,
             "--listen", f"127.0.0.1:{port}", "--token-file", str(tokens), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=(base / "collector.log").open("wb"))
        for _ in range(100):
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/healthz")
                break
            except OSError:
                time.sleep(0.1)

        results = []
        for size in [int(x) for x in args.batch_sizes.split(",")]:
            n = min(len(samples), max(size * args.senders * 50, 20_000)) if size < 64 else len(samples)
            per_sender = bodies(samples[:n], size, args.senders)
            wall, lat = http_ingest(port, per_sender)
            rate = n / wall
            results.append({"batch_rows": size, "rows": n, "batches": sum(map(len, per_sender)),
                            "rows_per_s": round(rate), "batches_per_s": round(sum(map(len, per_sender)) / wall),
                            "ratio_vs_raw_copy": round(rate / raw_rate, 3),
                            "latency_p50_ms": round(lat[len(lat) // 2] * 1000, 2),
                            "latency_p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2)})
        with psycopg.connect(pg.dsn) as conn:
            stored = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples WHERE node <> 'raw'").fetchone()[0]
        expected = sum(r["rows"] for r in results)
        if stored != expected:
            raise RuntimeError(f"stored {stored} rows, sent {expected}")

        machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        print(f"\njobpulse ingest benchmark — {machine}, PostgreSQL at {pg.bindir}")
        print(f"raw binary COPY of {len(samples):,} gpu_samples rows: {raw_rate:,.0f} rows/s\n")
        print(f"{'batch rows':>10} {'rows':>9} {'rows/s':>10} {'batches/s':>10} {'ratio':>7} {'p50 ms':>8} {'p99 ms':>8}")
        for r in results:
            print(f"{r['batch_rows']:>10} {r['rows']:>9,} {r['rows_per_s']:>10,} {r['batches_per_s']:>10,} "
                  f"{r['ratio_vs_raw_copy']:>7.3f} {r['latency_p50_ms']:>8} {r['latency_p99_ms']:>8}")
        print(f"\n{args.senders} concurrent senders (keep-alive, gzip), one collector process; all {stored:,} rows "
              "verified in PostgreSQL")
        out = Path(__file__).parent / "results"
        out.mkdir(exist_ok=True)
        (out / "ingest.json").write_text(json.dumps(
            {"machine": machine, "raw_copy_rows_per_s": round(raw_rate), "http": results}, indent=2))
        return 0
    finally:
        if collector:
            collector.terminate()
            collector.wait(10)
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
