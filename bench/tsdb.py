"""The time-series stores a site would run instead of jobpulse, as `bench/versus_tsdb.py` drives
them: Debian's Prometheus and VictoriaMetrics, each scraping dcgm-exporter's exposition, each
counting what it stored, each given a recorded history to measure its bytes on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import wait_ready

from jobpulse.collector.embedded.postgres import free_port

PROMETHEUS, VICTORIA = "prometheus", "victoriametrics"


def cpu_s(pid: int) -> float:
    """User + system CPU of one process so far (its threads included)."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def scrape_config(targets: list[str]) -> str:
    """Every target each second, keeping only dcgm-exporter's `DCGM_*` series (as a site's would):
    the same configuration for both stores. YAML is a superset of JSON."""
    return json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [{"job_name": "gpus", "static_configs": [{"targets": targets}],
                            "metric_relabel_configs": [{"source_labels": ["__name__"], "regex": "DCGM_.*",
                                                        "action": "keep"}]}]})


@dataclass
class Store:
    """One running store: its process, its HTTP port, its data folder."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    data: Path

    def cpu_s(self) -> float:
        return cpu_s(self.proc.pid)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        """SIGINT, as systemd stops it: both stores flush what they buffer before they exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(120)

    def scrapes(self) -> float:
        """Scrapes VictoriaMetrics made so far, from its own metrics (its query API hides the last
        30 s, `-search.latencyOffset`, so the `up` series of a round just ended is not read back)."""
        assert self.name == VICTORIA
        with urllib.request.urlopen(self.url("/metrics"), timeout=10) as r:
            return sum(float(line.split()[-1]) for line in r.read().decode().splitlines()
                       if line.startswith("vm_promscrape_scrapes_total"))


def start_prometheus(work: Path, targets: list[str], data: str = "tsdb") -> Store:
    port = free_port()
    (work / "prometheus.yml").write_text(scrape_config(targets))
    proc = subprocess.Popen(["prometheus", f"--config.file={work / 'prometheus.yml'}", "--web.enable-admin-api",
                             f"--storage.tsdb.path={work / data}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("wb"))
    wait_ready(proc, lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1),
               work / "prometheus.log", "prometheus")
    return Store(PROMETHEUS, proc, port, work / data)


def start_victoria(work: Path, targets: list[str] | None, data: str = "victoria") -> Store:
    """Single-node VictoriaMetrics with its defaults (a month's retention), scraping ``targets``
    (None: no scraping, a store to import into)."""
    port = free_port()
    args = ["victoria-metrics", f"-storageDataPath={work / data}", f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=ERROR"]
    if targets is not None:
        (work / "victoria.yml").write_text(scrape_config(targets))
        args.append(f"-promscrape.config={work / 'victoria.yml'}")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=(work / f"{data}.log").open("wb"))
    wait_ready(proc, lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1),
               work / f"{data}.log", "victoria-metrics")
    return Store(VICTORIA, proc, port, work / data)


def prometheus_api(port: int, query: str, at: float) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    with urllib.request.urlopen(url, timeout=300) as r:
        return json.load(r)["data"]["result"]


def prometheus_scrapes(store: Store, start: float, end: float) -> int:
    """Scrapes Prometheus stored between two times, from its own `up` series."""
    found = prometheus_api(store.port, f"sum(count_over_time(up[{int(end - start)}s]))", end)
    return int(float(found[0]["value"][1]))


def head_block_cpu_s(store: Store) -> float:
    """Prometheus' CPU to write its head as a block: what its head compaction (every 2 hours) does
    to every sample it scraped, the first of its compactions (later ones merge blocks), made now by
    a snapshot of the head (the admin API's, the same block writer)."""
    before = store.cpu_s()
    req = urllib.request.Request(store.url("/api/v1/admin/tsdb/snapshot?skip_head=false"), method="POST")
    urllib.request.urlopen(req, timeout=600).close()
    return store.cpu_s() - before


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def files_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def prometheus_blocks(work: Path, store: Store, since: float, until: float) -> dict[str, Any]:
    """Every sample Prometheus holds, as OpenMetrics, made into blocks by promtool: bytes on disk."""
    series = prometheus_api(store.port, f'{{__name__=~".+"}}[{int(until - since) + 5}s]', until)
    series.sort(key=lambda s: (s["metric"]["__name__"], sorted(s["metric"].items())))
    samples = scrapes = 0
    with (work / "samples.om").open("w") as out:
        for s in series:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s["metric"].items()) if k != "__name__")
            head = f'{s["metric"]["__name__"]}{{{labels}}}'
            for ts, value in s["values"]:
                out.write(f"{head} {value} {ts}\n")
            samples += len(s["values"])
            scrapes += len(s["values"]) if s["metric"]["__name__"] == "up" else 0
        out.write("# EOF\n")
    return {"series": len(series), "samples": samples, "scrapes": scrapes,
            "bytes": promtool_blocks(work / "samples.om", work / "blocks")}


def promtool_blocks(openmetrics: Path, blocks: Path) -> int:
    """Bytes of the blocks `promtool tsdb create-blocks-from openmetrics` makes of a history (a live
    head block is cut only after 2 hours)."""
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(blocks)],
                   check=True, capture_output=True, timeout=1200)
    return files_bytes(blocks)


def _prometheus_text(openmetrics: Path, lines: int = 100_000) -> Iterator[bytes]:
    """An OpenMetrics history (times in seconds) as Prometheus' text format (times in ms), in parts."""
    part: list[str] = []
    with openmetrics.open() as f:
        for line in f:
            if line.startswith("#"):
                continue
            head, ts = line.rsplit(" ", 1)
            part.append(f"{head} {round(float(ts) * 1000)}\n")
            if len(part) == lines:
                yield "".join(part).encode()
                part = []
    if part:
        yield "".join(part).encode()


def _vm_metrics(store: Store) -> dict[str, float]:
    """VictoriaMetrics' own figures: rows, parts, bytes and merges in progress, each summed over its kinds."""
    sums: dict[str, float] = {}
    with urllib.request.urlopen(store.url("/metrics"), timeout=10) as r:
        for line in r.read().decode().splitlines():
            name = line.split("{")[0]
            if name in ("vm_rows", "vm_parts", "vm_data_size_bytes", "vm_active_merges") and "storage" in line:
                sums[name] = sums.get(name, 0.0) + float(line.split()[-1])
    return sums


def victoria_bytes(work: Path, openmetrics: Path) -> dict[str, Any]:
    """Bytes on disk of a history imported into a VictoriaMetrics of its own: flushed, left to its
    background merges until every row is in its parts and no merge runs, then stopped (it writes
    what it holds in memory at exit); its data and index counted (as Prometheus' blocks count their
    index), not the caches it saves at exit. No forced merge: stopping it while one holds a
    partition makes it panic and lose the part."""
    store = start_victoria(work, None, data="victoria-history")
    try:
        rows = 0
        for part in _prometheus_text(openmetrics):
            req = urllib.request.Request(store.url("/api/v1/import/prometheus"), data=part, method="POST")
            urllib.request.urlopen(req, timeout=300).close()
            rows += part.count(b"\n")
        urllib.request.urlopen(store.url("/internal/force_flush"), timeout=300).close()
        seen: list[dict[str, float]] = []
        for _ in range(1200):
            seen = [*seen[-2:], _vm_metrics(store)]
            if len(seen) == 3 and all(m == seen[0] and m["vm_rows"] == rows and not m["vm_active_merges"] for m in seen):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"VictoriaMetrics did not settle: {seen[-1]} for {rows} rows")
    finally:
        store.stop()
    size = {part: files_bytes(store.data / part) for part in ("data", "indexdb")}
    return {"rows": rows, "bytes": sum(size.values()), "bytes_by_part": size, "parts": seen[-1]["vm_parts"]}
