"""The network between the nodes: every RDMA port (InfiniBand, RoCE) as the kernel exposes it in sysfs.

Per port (`/sys/class/infiniband/DEV/ports/N/`): state, phys_state, rate and width (from `rate`,
e.g. "100 Gb/sec (4X EDR)"), link_layer, the `counters/` and `hw_counters/` the field table names
(`schema.fields.FABRIC_FIELDS`), and for a RoCE port its Ethernet interface's
`/sys/class/net/IF/statistics/`. Every file is opened once and re-read with `pread` at offset 0
(sysfs makes the value afresh on each read from the start), so a sample costs one system call per
file and no path lookup. Ports are looked for again once a minute.

Counters become rates between two samples of the same agent: a port's first sample after the
agent starts has none (the agent does not know how long ago the previous value was taken). A
counter that went down wrapped when the previous value fitted in 32 bits and the wrapped
difference is one the link could have carried (HCAs without extended counters keep 32-bit data
counters); otherwise it was reset (a driver reload), and that interval has no rate. A 32-bit data
counter stuck at its maximum has saturated (the InfiniBand PortCounters never wrap): no rate until
it moves.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import structlog

from jobpulse.schema import wire
from jobpulse.schema.fields import FABRIC_FIELDS, FabricField

log = structlog.get_logger("jobpulse.agent.sources.fabric")

U32 = 2**32
RESCAN_S = 60.0
_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec(?:\s*\((\d+)X[^)]*\))?")
_ATTRS = ("state", "phys_state", "rate", "link_layer")
_COUNTERS = tuple(f for f in FABRIC_FIELDS if f.sysfs)
_BYTES_PER_GBIT = 1e9 / 8


def parse_rate(text: str) -> tuple[float | None, int | None]:
    """'100 Gb/sec (4X EDR)' -> (100.0, 4); what does not parse is (None, None)."""
    m = _RATE.match(text)
    if not m:
        return None, None
    return float(m.group(1)), int(m.group(2)) if m.group(2) else None


def parse_state(text: str) -> int | None:
    """'4: ACTIVE' -> 4 (the number the kernel prints before the name)."""
    head = text.split(":", 1)[0].strip()
    return int(head) if head.isdigit() else None


def counter_delta(prev: int, now: int, counts_data: bool, most: float | None) -> int | None:
    """How much a counter moved between two reads, or None when that cannot be known: a 32-bit data
    counter at its maximum (saturated), or a counter that went down and did not wrap (reset). ``most``:
    the largest move the link could make in the interval (None: any wrap is believed)."""
    if counts_data and now == U32 - 1:
        return None
    if now >= prev:
        return now - prev
    if prev < U32 and (wrapped := now + U32 - prev) >= 0 and (most is None or wrapped <= most):
        return wrapped
    return None


@dataclass
class Port:
    """One RDMA port: its files, open, and what the agent remembers of its counters."""

    device: str
    port: int
    folder: Path
    hca_type: str
    link_layer: str  # as found when opened: what its peers are matched by
    netdev: str | None
    fds: dict[str, int] = field(default_factory=dict)  # attribute or field name -> open descriptor
    last: dict[str, tuple[int, float]] = field(default_factory=dict)  # counter field -> (value, monotonic time)

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _open(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _netdev(dev: Path, port: int) -> str | None:
    """The Ethernet interface of a RoCE port: the port's first GID's netdev where the kernel names it,
    else the device's interface with this port's dev_port, else its only interface."""
    if name := _read_text(dev / "ports" / str(port) / "gid_attrs" / "ndevs" / "0"):
        return name
    try:
        nets = sorted(p for p in (dev / "device" / "net").iterdir())
    except OSError:
        return None
    for n in nets:
        if _read_text(n / "dev_port") == str(port - 1):
            return n.name
    return nets[0].name if len(nets) == 1 else None


class FabricSampler:
    """Reads every port under ``root`` (``/sys``) at each sample. ``job_of_node``: the one job that
    holds the node alone, or None (a shared or idle node: the traffic is the node's). ``state_file``
    keeps each port's widest width and highest rate across agent restarts (the prolog starts an agent
    per job, and a link that trained down before a restart must still show below its maximum)."""

    def __init__(self, root: Path, job_of_node: Callable[[], str | None], state_file: Path | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self.clock = clock
        self.job_of_node = job_of_node
        self.state_file = state_file
        self.ports: dict[str, Port] = {}
        self.best: dict[str, tuple[float, int]] = self._load_best()  # port key -> (rate, width) seen at most
        self._scanned = -RESCAN_S

    def _load_best(self) -> dict[str, tuple[float, int]]:
        if self.state_file is None:
            return {}
        try:
            raw = json.loads(self.state_file.read_text())
            return {str(k): (float(v[0]), int(v[1])) for k, v in raw.items()}
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            return {}

    def _save_best(self) -> None:
        if self.state_file is None:
            return
        tmp = self.state_file.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps({k: list(v) for k, v in sorted(self.best.items())}))
            tmp.replace(self.state_file)
        except OSError as exc:
            log.warning("fabric state not kept", file=str(self.state_file), error=str(exc))

    def scan(self) -> None:
        """Find the ports (new ones opened, vanished ones closed)."""
        base = self.root / "class" / "infiniband"
        found: dict[str, tuple[Path, Path, int]] = {}
        try:
            devices = sorted(base.iterdir())
        except OSError:
            devices = []
        for dev in devices:
            try:
                ports = sorted((p for p in (dev / "ports").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
            except OSError:
                continue
            for p in ports:
                found[f"{dev.name}/{p.name}"] = (dev, p, int(p.name))
        for key in set(self.ports) - set(found):
            self.ports.pop(key).close()
        for key, (dev, folder, number) in found.items():
            if key not in self.ports:
                self.ports[key] = self._open_port(dev, folder, number)

    def _open_port(self, dev: Path, folder: Path, number: int) -> Port:
        link_layer = _read_text(folder / "link_layer")
        netdev = _netdev(dev, number) if link_layer == "Ethernet" else None
        port = Port(dev.name, number, folder, _read_text(dev / "hca_type"), link_layer, netdev)
        for name in _ATTRS:
            if (fd := _open(folder / name)) is not None:
                port.fds[name] = fd
        for f in _COUNTERS:
            assert f.sysfs
            if f.sysfs.startswith("net:"):
                if netdev is None:
                    continue
                path = self.root / "class" / "net" / netdev / "statistics" / f.sysfs[4:]
            else:
                path = folder / f.sysfs
            if (fd := _open(path)) is not None:
                port.fds[f.name] = fd
        log.info("fabric port", port=port.key, netdev=netdev, files=len(port.fds))
        return port

    def close(self) -> None:
        for p in self.ports.values():
            p.close()
        self.ports.clear()

    def sample(self, ts: datetime) -> list[wire.FabricSample]:
        now = self.clock()
        if now - self._scanned >= RESCAN_S:
            self._scanned = now
            self.scan()
        job = self.job_of_node()
        read = {key: self._read(p) for key, p in self.ports.items()}
        if self._learn(read):
            self._save_best()
        return [self._record(ts, now, self.ports[key], values, job) for key, values in read.items()]

    @staticmethod
    def _read(p: Port) -> dict[str, str]:
        out = {}
        for name, fd in p.fds.items():
            try:
                out[name] = os.pread(fd, 128, 0).decode("ascii", "replace").strip()
            except OSError:
                continue  # a counter the driver refuses to read (a port going away): NULL this time
        return out

    def _learn(self, read: dict[str, dict[str, str]]) -> bool:
        """Raise each port's best rate and width to what it shows now; True if any rose."""
        changed = False
        for key, values in read.items():
            rate, width = parse_rate(values.get("rate", ""))
            if rate is None or parse_state(values.get("state", "")) != 4:
                continue  # a port that is not ACTIVE reports a rate it does not run at
            old = self.best.get(key, (0.0, 0))
            new = (max(old[0], rate), max(old[1], width or 0))
            if new != old:
                self.best[key], changed = new, True
        return changed

    def _port_max(self, p: Port) -> tuple[float | None, int | None]:
        """The port's own best, or the best of a port of the same HCA type and link layer on the node."""
        peers = [q.key for q in self.ports.values()
                 if q.key == p.key or (p.hca_type and q.hca_type == p.hca_type and q.link_layer == p.link_layer)]
        seen = [self.best[k] for k in peers if k in self.best]
        if not seen:
            return None, None
        return max(r for r, _ in seen), max(w for _, w in seen) or None

    def _record(self, ts: datetime, now: float, p: Port, values: dict[str, str], job: str | None) -> wire.FabricSample:
        rate, width = parse_rate(values.get("rate", ""))
        link_layer = values.get("link_layer") or None
        rate_max, width_max = self._port_max(p)
        out: dict[str, object] = {
            "link_layer": link_layer, "port_state": parse_state(values.get("state", "")),
            "phys_state": parse_state(values.get("phys_state", "")), "rate_gbps": rate, "width": width,
            "rate_max_gbps": rate_max, "width_max": width_max}
        for f in _COUNTERS:
            raw = values.get(f.name)
            value = int(raw) if raw and raw.isdigit() else None
            out[f.name] = value if f.per_s is None else self._rate(p, f, value, now, rate)
        return wire.FabricSample(ts=ts, device=p.device, port=p.port, job_id=job, netdev=p.netdev, **out)

    @staticmethod
    def _rate(p: Port, f: FabricField, value: int | None, now: float, link_gbps: float | None) -> int | None:
        if value is None:
            p.last.pop(f.name, None)
            return None
        prev = p.last.get(f.name)
        p.last[f.name] = (value, now)
        if prev is None or now <= prev[1]:
            return None
        dt = now - prev[1]
        assert f.per_s is not None
        data = f.unit == "KB/s"  # bytes: bounded by what the link carries
        # The most the link could carry in the interval, in counter units, with room for timing jitter.
        most = 2 * link_gbps * _BYTES_PER_GBIT / (1024 * f.per_s) * dt if data and link_gbps else None
        delta = counter_delta(prev[0], value, data, most)
        return None if delta is None else round(delta * f.per_s / dt)
