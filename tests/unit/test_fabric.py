"""The fabric source (`agent/sources/fabric.py`) on a sysfs tree made to the kernel's layout and on real
captures of /sys/class/infiniband: counters to rates (4-byte data words, a 32-bit wrap, a saturated
or reset counter, an agent restart), link state, rate and width, the port's maximum, RoCE interfaces."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobpulse.agent.sources.fabric import U32, FabricSampler, counter_delta, parse_rate, parse_state
from jobpulse.schema import wire
from tests.sysfs_tree import SysfsTree

TS = datetime(2026, 1, 1, tzinfo=UTC)
CAPTURES = Path(__file__).parent.parent / "data" / "sysfs" / "prometheus-procfs" / "sys"
GB = 10**9


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def sampler(tree: SysfsTree, clock: Clock, job: str | None = None, state: Path | None = None) -> FabricSampler:
    return FabricSampler(tree.root, lambda: job, state, clock=clock)


def by_port(rows: list[wire.FabricSample]) -> dict[str, wire.FabricSample]:
    return {f"{r.device}/{r.port}": r for r in rows}


def test_rate_and_state_files_parse_as_the_kernel_writes_them() -> None:
    assert parse_rate("100 Gb/sec (4X EDR)") == (100.0, 4)
    assert parse_rate("25 Gb/sec (1X EDR)") == (25.0, 1)
    assert parse_rate("400 Gb/sec (4X NDR)") == (400.0, 4)
    assert parse_rate("2.5 Gb/sec (1X SDR)") == (2.5, 1)
    assert parse_rate("10 Gb/sec") == (10.0, None)  # some drivers print no width
    assert parse_rate("garbage") == (None, None)
    assert parse_state("4: ACTIVE") == 4 and parse_state("5: LinkUp") == 5 and parse_state("") is None


def test_counter_delta_wraps_at_32_bits_refuses_resets_and_saturation() -> None:
    assert counter_delta(U32 - 10, 5, True, None) == 15  # wrapped
    assert counter_delta(U32 - 10, 5, True, 10) is None  # a wrap the link could not have carried: a reset
    assert counter_delta(5 * U32, 100, True, None) is None  # a 64-bit counter went down: reset
    assert counter_delta(100, U32 - 1, True, None) is None  # a 32-bit data counter stuck at its maximum
    assert counter_delta(100, U32 - 1, False, None) == U32 - 101  # other counters are only what they are


def test_data_counters_are_4_byte_words_turned_into_kbs(tmp_path: Path) -> None:
    tree, clock = SysfsTree(tmp_path), Clock()
    tree.add_port("mlx5_0", 1)
    s = sampler(tree, clock, job="42")
    first = s.sample(TS)[0]
    assert first.rx_kbs is None and first.tx_kbs is None  # no previous value: no rate
    assert (first.link_layer, first.port_state, first.phys_state, first.rate_gbps, first.width) == \
        ("InfiniBand", 4, 5, 100.0, 4)
    assert first.job_id == "42"  # the job holds the node alone: its traffic
    tree.add_bytes("mlx5_0", 1, rx=2 * GB, tx=1 * GB)  # over 2 s
    clock.t += 2
    r = s.sample(TS)[0]
    assert r.rx_kbs == round(GB / 1024) and r.tx_kbs == round(GB / 2 / 1024)
    tree.set_counter("mlx5_0", 1, "port_xmit_wait", 3000)
    tree.set_counter("mlx5_0", 1, "symbol_error", 7)
    clock.t += 1
    r = s.sample(TS)[0]
    assert r.xmit_wait_per_s == 3000 and r.symbol_error == 7 and r.rx_kbs == 0
    wire.decode(wire.encode(wire.Batch(version=1, agent=wire.AgentInfo(instance="i", node="n", cluster="c", version="1",
                                                                       started_at=TS),
                                       seq=0, created_at=TS, fabric_samples=[r])))  # within the wire's bounds


def test_a_32_bit_counter_that_wraps_keeps_its_rate(tmp_path: Path) -> None:
    tree, clock = SysfsTree(tmp_path), Clock()
    tree.add_port("mlx4_0", 1, speed="QDR")
    tree.set_counter("mlx4_0", 1, "port_rcv_data", U32 - 1000)
    s = sampler(tree, clock)
    s.sample(TS)
    tree.set_counter("mlx4_0", 1, "port_rcv_data", 256 * 1024 - 1000)  # past 2^32: wrapped
    clock.t += 1
    assert s.sample(TS)[0].rx_kbs == 1024  # 256 Ki words of 4 bytes in 1 s
    assert s.sample(TS)[0].rx_kbs is None  # no time passed: no rate, never a division by zero


def test_a_saturated_or_reset_counter_gives_no_rate_then_recovers(tmp_path: Path) -> None:
    tree, clock = SysfsTree(tmp_path), Clock()
    tree.add_port("mlx4_0", 1)
    tree.set_counter("mlx4_0", 1, "port_xmit_data", 5 * U32)
    s = sampler(tree, clock)
    s.sample(TS)
    tree.set_counter("mlx4_0", 1, "port_xmit_data", 1000)  # a driver reload reset it
    clock.t += 1
    assert s.sample(TS)[0].tx_kbs is None
    tree.set_counter("mlx4_0", 1, "port_xmit_data", 1000 + 512)
    clock.t += 1
    assert s.sample(TS)[0].tx_kbs == 2
    tree.set_counter("mlx4_0", 1, "port_xmit_data", U32 - 1)  # saturated (PortCounters stop at the top)
    clock.t += 1
    assert s.sample(TS)[0].tx_kbs is None


def test_an_agent_restart_starts_without_a_rate_and_keeps_the_ports_best_link(tmp_path: Path) -> None:
    tree, clock = SysfsTree(tmp_path / "sys"), Clock()
    tree.add_port("mlx5_0", 1)
    state = tmp_path / "fabric.json"
    s = sampler(tree, clock, state=state)
    s.sample(TS)
    tree.add_bytes("mlx5_0", 1, rx=4 * GB, tx=0)
    clock.t += 1
    assert s.sample(TS)[0].rx_kbs == round(4 * GB / 1024)
    s.close()
    tree.set_link("mlx5_0", 1, lanes=1)  # trained down to a quarter width while no agent ran
    tree.add_bytes("mlx5_0", 1, rx=3 * GB, tx=0)
    clock.t += 100
    again = sampler(tree, clock, state=state)  # a new agent: counters went on, its memory of them did not
    first = again.sample(TS)[0]
    assert first.rx_kbs is None  # never the 100 s since the last agent's read as one interval
    assert (first.width, first.width_max, first.rate_gbps, first.rate_max_gbps) == (1, 4, 25.0, 100.0)
    tree.add_bytes("mlx5_0", 1, rx=1024 * 1000, tx=0)
    clock.t += 1
    assert again.sample(TS)[0].rx_kbs == 1000
    fresh = sampler(tree, clock)  # without the state file: the port never showed more than 1X
    assert fresh.sample(TS)[0].width_max == 1


def test_a_port_below_its_peers_of_the_same_hca_shows_their_maximum(tmp_path: Path) -> None:
    tree, clock = SysfsTree(tmp_path), Clock()
    for d in range(4):
        tree.add_port(f"mlx5_{d}", 1, lanes=1 if d == 2 else 4)
    tree.add_port("mlx5_4", 1, lanes=1, link_layer="Ethernet", netdev="eth4")  # other link layer: not a peer
    tree.add_port("mlx5_5", 1, state=1, phys_state=2)  # down: its rate says nothing
    rows = by_port(sampler(tree, clock).sample(TS))
    assert (rows["mlx5_2/1"].width, rows["mlx5_2/1"].width_max) == (1, 4)
    assert (rows["mlx5_0/1"].width, rows["mlx5_0/1"].width_max) == (4, 4)
    assert rows["mlx5_4/1"].width_max == 1
    assert (rows["mlx5_5/1"].port_state, rows["mlx5_5/1"].phys_state, rows["mlx5_5/1"].width_max) == (1, 2, 4)


def test_a_roce_port_reads_its_ethernet_interface(tmp_path: Path) -> None:
    tree, clock = SysfsTree(tmp_path), Clock()
    tree.add_port("mlx5_0", 1, link_layer="Ethernet", netdev="ens1f0np0", hw_counters=True)
    s = sampler(tree, clock)
    assert s.sample(TS)[0].netdev == "ens1f0np0"
    tree.add_bytes("mlx5_0", 1, rx=1024 * 4000, tx=1024 * 8000, netdev="ens1f0np0")
    tree.set_counter("mlx5_0", 1, "np_ecn_marked_roce_packets", 12, folder="hw_counters")
    clock.t += 4
    r = s.sample(TS)[0]
    assert (r.link_layer, r.net_rx_kbs, r.net_tx_kbs, r.rx_kbs, r.tx_kbs) == ("Ethernet", 1000, 2000, 1000, 2000)
    assert r.hw_np_ecn_marked_roce_packets == 12 and r.net_rx_dropped == 0


def test_ports_that_come_and_go_are_found_at_the_next_scan(tmp_path: Path) -> None:
    tree, clock = SysfsTree(tmp_path), Clock()
    s = sampler(tree, clock)
    assert s.sample(TS) == []  # no HCA: nothing, no error
    tree.add_port("mlx5_0", 1)
    clock.t += 61
    assert [r.device for r in s.sample(TS)] == ["mlx5_0"]


def test_real_captures_of_sys_class_infiniband() -> None:
    """prometheus/procfs' fixtures (tests/data/sysfs/SOURCES.md): an Omni-Path HFI, a ConnectX-3
    with two ports and a ConnectX-4 trained to 1X with hw_counters; values as the files hold them."""
    rows = by_port(FabricSampler(CAPTURES, lambda: None, clock=Clock()).sample(TS))
    assert sorted(rows) == ["hfi1_0/1", "mlx4_0/1", "mlx4_0/2", "mlx5_0/1"]
    hfi, cx3, cx4 = rows["hfi1_0/1"], rows["mlx4_0/1"], rows["mlx5_0/1"]
    assert (hfi.rate_gbps, hfi.width, hfi.port_state, hfi.phys_state) == (100.0, 4, 4, 5)
    assert (cx3.rate_gbps, cx3.width, cx3.link_layer) == (40.0, 4, "InfiniBand")
    assert (cx4.rate_gbps, cx4.width) == (25.0, 1)
    assert cx4.phys_state == 4  # the capture's mlx5 phys_state reads "4: ACTIVE"
    assert (cx4.hw_out_of_sequence, cx4.hw_packet_seq_err, cx4.hw_local_ack_timeout_err) == (1, 1, 131)
    assert hfi.hw_out_of_sequence is None  # no hw_counters folder: NULL, not 0
    assert cx3.symbol_error is not None and cx3.rx_kbs is None


@pytest.mark.parametrize("bad", ["", "x", "-5"])
def test_a_counter_that_does_not_read_as_a_number_is_null(tmp_path: Path, bad: str) -> None:
    tree, clock = SysfsTree(tmp_path), Clock()
    tree.add_port("mlx5_0", 1)
    (tree.port_dir("mlx5_0") / "counters" / "symbol_error").write_text(bad)
    assert sampler(tree, clock).sample(TS)[0].symbol_error is None
