"""A sysfs tree for the fabric source, the fake NVML's counterpart: RDMA ports laid out as the kernel
documents them (Documentation/ABI/stable/sysfs-class-infiniband: `class/infiniband/DEV/ports/N/`
with `state`, `phys_state`, `rate`, `link_layer`, `counters/`, `hw_counters/`; a RoCE port's
interface in `class/net/IF/statistics/`, found through `gid_attrs/ndevs/0` and `device/net/IF`).
Tests move its counters while a real agent reads it (`jobpulse-agent run --sysfs-root`)."""

from __future__ import annotations

from pathlib import Path

COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_xmit_wait",
            "symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
            "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
            "excessive_buffer_overrun_errors", "VL15_dropped")
HW_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
               "np_ecn_marked_roce_packets", "np_cnp_sent")
NET_STATISTICS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_dropped", "tx_dropped", "rx_errors")
_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_PHYS = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
         6: "LinkErrorRecovery", 7: "Phy Test"}
_SPEEDS = {"EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "QDR": 10.0}


def rate_text(lanes: int, speed: str = "EDR") -> str:
    """The kernel's `rate` file: '100 Gb/sec (4X EDR)'."""
    return f"{_SPEEDS[speed] * lanes:g} Gb/sec ({lanes}X {speed})"


class SysfsTree:
    """``root`` stands for /sys."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
        (root / "class" / "net").mkdir(parents=True, exist_ok=True)

    def port_dir(self, device: str, port: int = 1) -> Path:
        return self.root / "class" / "infiniband" / device / "ports" / str(port)

    def add_port(self, device: str, port: int = 1, *, lanes: int = 4, speed: str = "EDR", state: int = 4,
                 phys_state: int = 5, link_layer: str = "InfiniBand", netdev: str | None = None,
                 hw_counters: bool = True, hca_type: str = "MT4123") -> Path:
        dev = self.root / "class" / "infiniband" / device
        d = self.port_dir(device, port)
        (d / "counters").mkdir(parents=True, exist_ok=True)
        (dev / "hca_type").write_text(hca_type + "\n")
        self.set_link(device, port, lanes=lanes, speed=speed, state=state, phys_state=phys_state)
        (d / "link_layer").write_text(link_layer + "\n")
        for c in COUNTERS:
            (d / "counters" / c).write_text("0\n")
        if hw_counters:
            (d / "hw_counters").mkdir(exist_ok=True)
            for c in HW_COUNTERS:
                (d / "hw_counters" / c).write_text("0\n")
        if netdev:
            (d / "gid_attrs" / "ndevs").mkdir(parents=True, exist_ok=True)
            (d / "gid_attrs" / "ndevs" / "0").write_text(netdev + "\n")
            (dev / "device" / "net" / netdev).mkdir(parents=True, exist_ok=True)
            (dev / "device" / "net" / netdev / "dev_port").write_text(f"{port - 1}\n")
            stats = self.root / "class" / "net" / netdev / "statistics"
            stats.mkdir(parents=True, exist_ok=True)
            for s in NET_STATISTICS:
                (stats / s).write_text("0\n")
        return d

    def set_link(self, device: str, port: int = 1, *, lanes: int = 4, speed: str = "EDR", state: int = 4,
                 phys_state: int = 5) -> None:
        d = self.port_dir(device, port)
        d.mkdir(parents=True, exist_ok=True)
        _write(d / "rate", rate_text(lanes, speed))
        _write(d / "state", f"{state}: {_STATES[state]}")
        _write(d / "phys_state", f"{phys_state}: {_PHYS[phys_state]}")

    def set_counter(self, device: str, port: int, name: str, value: int, folder: str = "counters") -> None:
        _write(self.port_dir(device, port) / folder / name, str(value))

    def counter(self, device: str, port: int, name: str, folder: str = "counters") -> int:
        return int((self.port_dir(device, port) / folder / name).read_text())

    def add_bytes(self, device: str, port: int, rx: int, tx: int, netdev: str | None = None) -> None:
        """Traffic of ``rx``/``tx`` bytes: the data counters count 4-byte words (a RoCE port's
        interface counts the same bytes)."""
        for name, n in (("port_rcv_data", rx), ("port_xmit_data", tx)):
            self.set_counter(device, port, name, self.counter(device, port, name) + n // 4)
        if netdev:
            stats = self.root / "class" / "net" / netdev / "statistics"
            for name, n in (("rx_bytes", rx), ("tx_bytes", tx)):
                _write(stats / name, str(int((stats / name).read_text()) + n))


def _write(path: Path, text: str) -> None:
    """In place (the agent keeps the file open and re-reads it from offset 0, as it does in sysfs)."""
    with open(path, "r+" if path.exists() else "w") as f:
        f.write(text + "\n")
        f.truncate()
