"""Recordings as nvidia-smi and dcgmi write them: every variant of each format read into the agent's
fields and units, "not measured" kept apart from zero, and a line that does not fit named."""

from __future__ import annotations

import gzip
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from jobpulse.collector.recordings import formats
from jobpulse.collector.recordings.faults import RecordingError, Skip
from jobpulse.collector.recordings.intake import MAX_LINE, source
from jobpulse.collector.recordings.survey import survey
from jobpulse.collector.recordings.table import MAX_NODES
from jobpulse.collector.recordings.times import time_format
from jobpulse.collector.recordings.values import Reading
from jobpulse.schema import field_aliases as fa

QUERY = """timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W], \
clocks_throttle_reasons.active
2024/03/01 10:00:00.125, 0, NVIDIA A100-SXM4-80GB, 97 %, 70123 MiB, 81920 MiB, 391.52 W, 0x0000000000000000
2024/03/01 10:00:00.127, 1, NVIDIA A100-SXM4-80GB, 0 %, 4 MiB, 81920 MiB, [N/A], 0x0000000000000001
"""


def readings(path: Path, fmt: str | None = None, columns: list[str] | None = None, start: datetime | None = None,
             interval: timedelta | None = None) -> list[Reading]:
    """The file's readings; its first bad line raised (these tests name each one)."""
    with source(path) as src:
        fmt = fmt or formats.format_of(src, columns)
        got = list(formats.readings(src, fmt, formats.ReadOptions(columns, start, interval)))
    for r in got:
        if isinstance(r, Skip) and r.kind != "repeated header":
            raise RecordingError(r.reason, r.line)
    return [r for r in got if isinstance(r, Reading)]


def write(tmp_path: Path, text: str, name: str = "rec.log") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_query_gpu_with_units_in_the_values(tmp_path: Path) -> None:
    got = list(readings(write(tmp_path, QUERY)))
    assert [(r.gpu, r.ts, r.model) for r in got] == [
        (0, datetime(2024, 3, 1, 10, 0, 0, 125000), "NVIDIA A100-SXM4-80GB"),
        (1, datetime(2024, 3, 1, 10, 0, 0, 127000), "NVIDIA A100-SXM4-80GB")]
    assert got[0].values == {"sm_util": 97, "fb_used_mib": 70123, "fb_total_mib": 81920, "power_w": 391.52,
                             "clock_event_reasons": 0}
    assert "power_w" not in got[1].values and got[1].values["sm_util"] == 0, "[N/A] is not measured, 0 % is zero"
    assert got[1].values["clock_event_reasons"] == 1


def test_query_gpu_nounits_pandas_index_repeated_header_and_gzip(tmp_path: Path) -> None:
    text = (",timestamp,index,utilization.gpu [%],memory.used [MiB]\n"
            "0,2024-03-01 10:00:00,0,55,1000\n"
            ",timestamp,index,utilization.gpu [%],memory.used [MiB]\n"  # a second log appended
            "1,2024-03-01 10:00:02,0,65,1 GiB\n")
    p = tmp_path / "rec.csv.gz"
    p.write_bytes(gzip.compress(text.encode()))
    got = list(readings(p))
    assert [(r.values["sm_util"], r.values["fb_used_mib"]) for r in got] == [(55, 1000), (65, 1024)]


def test_query_gpu_without_header_or_time(tmp_path: Path) -> None:
    p = write(tmp_path, "0, 40 %\n1, 0 %\n0, 42 %\n1, 1 %\n")
    start = datetime(2024, 1, 1)
    got = list(readings(p, columns=["index", "utilization.gpu"], start=start, interval=timedelta(seconds=5)))
    assert [(r.gpu, r.ts, r.timed) for r in got] == [(0, start, False), (1, start, False),
                                                    (0, start + timedelta(seconds=5), False),
                                                    (1, start + timedelta(seconds=5), False)]
    with pytest.raises(RecordingError, match="without a header"):
        list(readings(p, fmt="csv"))
    with pytest.raises(RecordingError, match="--interval"):
        list(readings(p, columns=["index", "utilization.gpu"]))


DMON_DT = """#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec   mclk   pclk     fb
#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %    MHz    MHz     MB
 20240301   23:59:59      0    250     60      -     88     40      0      0   1593   1410  30000
 20240301   23:59:59      1     60     35      -      0      0      0      0   1593    210      3
#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec   mclk   pclk     fb
#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %    MHz    MHz     MB
 20240302   00:00:00      0    251     60      -     90     41      0      0   1593   1410  30000
"""


def test_dmon_with_date_and_time_and_repeated_headers(tmp_path: Path) -> None:
    got = list(readings(write(tmp_path, DMON_DT)))
    assert [(r.gpu, r.ts) for r in got] == [(0, datetime(2024, 3, 1, 23, 59, 59)), (1, datetime(2024, 3, 1, 23, 59, 59)),
                                            (0, datetime(2024, 3, 2))]
    assert got[0].values == {"power_w": 250, "gpu_temp_c": 60, "sm_util": 88, "mem_util": 40, "enc_util": 0,
                             "dec_util": 0, "mem_clock_mhz": 1593, "sm_clock_mhz": 1410, "fb_used_mib": 30000}
    assert "mem_temp_c" not in got[0].values, "'-' is not supported, not zero"


def test_dmon_time_of_day_rolls_over_midnight_and_no_time_uses_the_interval(tmp_path: Path) -> None:
    text = ("#Time        gpu     sm\n#HH:MM:SS    Idx      %\n 23:59:59      0     50\n 00:00:01      0     51\n")
    got = list(readings(write(tmp_path, text), start=datetime(2024, 3, 1)))
    assert [r.ts for r in got] == [datetime(2024, 3, 1, 23, 59, 59), datetime(2024, 3, 2, 0, 0, 1)]
    with pytest.raises(RecordingError, match="--start"):
        list(readings(write(tmp_path, text)))
    plain = "# gpu     sm    mem\n# Idx      %      %\n    0     10      1\n    1     20      2\n    0     11      1\n"
    got = list(readings(write(tmp_path, plain), start=datetime(2024, 3, 1)))
    assert [r.ts.second for r in got if r.ts] == [0, 0, 1], "dmon's default interval: one second per round"


DCGMI = """#Entity   GPUTL  FBUSD  POWER  SMACT  TENSO  PCITX
ID
GPU 0     93     39000  301.2  0.812  0.250  1048576
GPU 1     N/A    12     61.0   0.000  0.000  0
GPU-I 7   5      100    N/A    0.1    0.0    0
"""


def test_dcgmi_dmon_ratios_become_percent_and_other_entities_are_skipped(tmp_path: Path) -> None:
    got = list(readings(write(tmp_path, DCGMI), start=datetime(2024, 3, 1)))
    assert [r.gpu for r in got] == [0, 1]
    assert got[0].values == {"sm_util": 93, "fb_used_mib": 39000, "power_w": 301.2, "gpm_sm_active": 81.2,
                             "gpm_tensor_active": 25.0, "pcie_tx_kbs": 1024}
    assert "sm_util" not in got[1].values


DCGM_CSV = """EntityId,GRACT,FBUSD,TimeStamp
0,0.000,3,1661698242
0,0.873,2402,1661698243
0,0.000,N/A,1661698244
"""


def test_dcgm_fields_as_csv_gract_stands_in_for_utilization(tmp_path: Path) -> None:
    """As MIGProfiler's recorder writes `dcgmi dmon -e 1001,252`: Unix seconds, GRACT the only activity."""
    got = list(readings(write(tmp_path, DCGM_CSV, "dcgm.csv")))
    assert [(r.gpu, r.ts, r.timed, r.stand_in) for r in got] == [
        (0, datetime(2022, 8, 28, 14, 50, 42 + i, tzinfo=UTC), True, True) for i in range(3)]
    assert got[1].values == {"gpm_gr_active": 87.3, "fb_used_mib": 2402, "sm_util": 87}
    assert got[2].values == {"gpm_gr_active": 0.0, "sm_util": 0}  # N/A memory: not measured, not 0


def test_dcgm_csv_by_field_name_with_a_row_index_and_microseconds(tmp_path: Path) -> None:
    """DCGM's own names (as dcgm-exporter and the API call them), DCGM's microsecond stamps, pandas' index
    column; with SMACT there, GRACT stands in for nothing."""
    text = (",gpu,DCGM_FI_PROF_GR_ENGINE_ACTIVE,DCGM_FI_PROF_SM_ACTIVE,DCGM_FI_DEV_POWER_USAGE,timestamp\n"
            "0,0,0.95,0.81,301.5,1709287200125000\n1,1,0.02,0.01,61.0,1709287200125000\n")
    got = list(readings(write(tmp_path, text, "export.csv")))
    assert [(r.gpu, r.ts, r.stand_in) for r in got] == [(0, datetime(2024, 3, 1, 10, 0, 0, 125000, tzinfo=UTC), False),
                                                         (1, datetime(2024, 3, 1, 10, 0, 0, 125000, tzinfo=UTC), False)]
    assert got[0].values == {"gpm_gr_active": 95.0, "gpm_sm_active": 81.0, "power_w": 301.5}
    # pandas' reset_index() names its row numbers "index": the entity column comes first
    got = list(readings(write(tmp_path, "index,GRACT,EntityId,TimeStamp\n0,0.5,3,1661698242\n1,0.5,3,1661698243\n",
                              "reset.csv")))
    assert [r.gpu for r in got] == [3, 3]


@pytest.mark.parametrize(("text", "error"), [
    ("hello world\n", "not a recording jobpulse knows"),
    (QUERY + "2024/03/01 10:00:01.000, 0, NVIDIA A100-SXM4-80GB, 97 %\n", "line 4: 4 columns where the header has 8"),
    (QUERY.replace("97 %", "lots"), "line 2: utilization.gpu [%]: 'lots' is not a number"),
    (QUERY.replace("97 %", "250 %"), "line 2: utilization.gpu [%]: 250 is outside"),
    (DMON_DT + " 20240302   00:00:01      0    251\n", "line 8: 4 values where the header has 13"),
    (DCGMI.replace("GPU 1     N/A    12", "GPU x     N/A    12"), "line 4: GPU index 'x' is not a number"),
    (DCGM_CSV + "0,0.5,12\n", "line 5: 3 columns where the header has 4"),
    (DCGM_CSV.replace("0.873", "87.3"), "line 3: GRACT: 8730 is outside"),
    (DCGM_CSV.replace("1661698243", "yesterday"), "line 3: time 'yesterday' is not in the column's form"),
    ("", "the file is empty"),
])
def test_a_line_that_does_not_fit_is_named(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(RecordingError, match=re.escape(error)):
        list(readings(write(tmp_path, text), start=datetime(2024, 3, 1)))


def test_binary_garbage_and_endless_lines_are_refused_without_reading_them_whole(tmp_path: Path) -> None:
    p = tmp_path / "garbage.bin"
    p.write_bytes(QUERY.encode() + b"\x00\x01\xff" * 100)
    with pytest.raises(RecordingError, match="line 4: binary data"):
        list(readings(p))
    p.write_bytes(QUERY.encode() + b"9" * (MAX_LINE * 4))
    with pytest.raises(RecordingError, match="line 4: longer than 64 KiB"):
        list(readings(p))
    p.write_bytes(gzip.compress(QUERY.encode() * 50)[:-30])  # a gzip cut short
    with pytest.raises(RecordingError, match="cannot read the file"):
        list(readings(p))


def test_columns_are_matched_by_what_they_mean_and_their_units_read(tmp_path: Path) -> None:
    """A logger's own names: the field's own name, a unit as the last word, the field table's DCGM
    fields; a header's GiB scales memory to MiB."""
    text = ("timestamp,gpu_index,sm_util_pct,memory_used_gib,gpm_tensor_active,gpm_sm_active,nvlink_tx_kbs,"
            "power_draw_watts,sm_clock_mhz\n"
            "2026-03-11 15:13:16,0,87,30.5,41.5,77,1200,310.5,1410\n")
    (r,) = readings(write(tmp_path, text, "mine.csv"))
    assert r.values == {"sm_util": 87, "fb_used_mib": 30.5 * 1024, "gpm_tensor_active": 41.5, "gpm_sm_active": 77,
                        "nvlink_tx_kbs": 1200, "power_w": 310.5, "sm_clock_mhz": 1410}


def test_a_day_first_time_with_dashes_is_read(tmp_path: Path) -> None:
    """A site monitor's `03-11-2026 15:13:16` is the 3rd of November (dashes: day first)."""
    text = "time,gpu,utilization.gpu [%]\n03-11-2026 15:13:16,0,40\n25-11-2026 15:13:17,0,41\n"
    got = readings(write(tmp_path, text, "site.csv"))
    assert [r.ts for r in got] == [datetime(2026, 11, 3, 15, 13, 16), datetime(2026, 11, 25, 15, 13, 17)]


def test_columns_named_on_a_file_with_its_own_header_and_spaces_read_it(tmp_path: Path) -> None:
    """`--columns` once split every file at commas: a space-separated log with a header became
    "1 columns where the header has 4"; its own header is not counted as a repeat either."""
    p = write(tmp_path, "t host util mem\n2026-03-11T15:13:16 n1 40 100\n2026-03-11T15:13:17 n1 41 100\n", "ws.log")
    with source(p) as src:
        got = list(formats.readings(src, "csv", formats.ReadOptions(["timestamp", "host", "utilization.gpu",
                                                                     "memory.used"])))
    assert [r.values for r in got if isinstance(r, Reading)] == [{"sm_util": 40, "fb_used_mib": 100},
                                                                 {"sm_util": 41, "fb_used_mib": 100}]
    assert not [r for r in got if isinstance(r, Skip)]


# ------------------------------------------------------------------------------- a log's structure

CLUSTER = "date,hostname,gpu,GPU Util (%),Memory Used (GiB),Power (W),SM Clock (MHz),sm_active,tensor_active\n"


def cluster_log(tmp_path: Path, stamp: str = "%d-%m-%Y %H:%M:%S", rows: int = 6, index: bool = True) -> Path:
    """A site monitor's per-job table: one row per GPU and time, 4 + 4 + 2 GPUs over three nodes."""
    t0, lines = datetime(2026, 11, 3, 15, 13, 16), [CLUSTER if index else CLUSTER.replace("gpu,", "")]
    for s in range(rows):
        ts = (t0 + timedelta(seconds=30 * s)).strftime(stamp)
        for node, count in (("jwb0001.juwels", 4), ("jwb0002.juwels", 4), ("jwb0003.juwels", 2)):
            for g in range(count):
                gpu = f"{g}," if index else ""
                lines.append(f"{ts},{node},{gpu}{90 + g},{30 + g}.5,{300 + g}.5,1410,0.8{g},0.4\n")
    return write(tmp_path, "".join(lines), "cluster.csv")


def test_a_node_column_makes_nodes_each_with_its_own_gpu_indices(tmp_path: Path) -> None:
    """A cluster's log over three nodes is three nodes (short hostnames) of 4, 4 and 2 GPUs, indexed
    per node, not one node of 10; rows that name no index are numbered per node too."""
    for index in (True, False):
        got = readings(cluster_log(tmp_path, index=index))
        per_node: dict[str, set[int]] = {}
        for r in got:
            per_node.setdefault(r.node, set()).add(r.gpu)
        assert per_node == {"jwb0001": {0, 1, 2, 3}, "jwb0002": {0, 1, 2, 3}, "jwb0003": {0, 1}}, (index, per_node)
        assert len(got) == 6 * 10 and not [r for r in got if r.ts is None]


def test_units_in_the_header_and_the_values_are_the_field_tables(tmp_path: Path) -> None:
    """GiB, W, MHz and DCGM's ratios in the header's words; mW, GHz, KB/s and bytes per second; a
    unit after the value decides over the header's (GiB in both is GiB once)."""
    (r, *_) = readings(cluster_log(tmp_path))
    assert r.values == {"sm_util": 90, "fb_used_mib": 30.5 * 1024, "power_w": 300.5, "sm_clock_mhz": 1410,
                        "gpm_sm_active": 80, "gpm_tensor_active": 40}
    text = ("timestamp,index,Power (mW),SM Clock (GHz),PCIe TX (KB/s),nvlink_rx_bytes,memory.used [GiB],"
            "Temp (°C)\n2026-03-11T15:13:16,0,250500,1.41,1200,2048000,1.5 GiB,65 °C\n")
    (r,) = readings(write(tmp_path, text, "units.csv"))
    assert r.values == {"power_w": 250.5, "sm_clock_mhz": 1410, "pcie_tx_kbs": 1200, "nvlink_rx_kbs": 2000,
                        "fb_used_mib": 1536, "gpu_temp_c": 65}


@pytest.mark.parametrize(("name", "field"), [
    ("sm_util_pct", "sm_util"), ("gpu_util_percent", "sm_util"), ("mem_used_gib", "fb_used_mib"),
    ("power_w", "power_w"), ("gpuMemoryUsedGiB", "fb_used_mib"), ("GPU Memory Usage (MiB)", "fb_used_mib"),
    ("gpu_mem_util_pct", "mem_util"), ("memoryTotalMiB", "fb_total_mib"), ("smClockMHz", "sm_clock_mhz"),
    ("gpu_power_limit_w", "power_limit_w"), ("gr_engine_active", "gpm_gr_active"), ("dram_active", "gpm_dram_bw"),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gpm_fp16_active"), ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_kbs"),
    ("DCGM_FI_DEV_FB_TOTAL", "fb_total_mib"), ("TENSO", "gpm_tensor_active"), ("DRAMA", "gpm_dram_bw"),
    ("utilization_mem_pct", "mem_util"), ("MemUsedKB", "fb_used_mib"), ("CeClockMHz", "sm_clock_mhz"),
    ("Tensor Core Activity", "gpm_tensor_active"), ("Memory BW Activity", "gpm_dram_bw"), ("SM Occupancy",
    "gpm_sm_occupancy"), ("nvidia_gpu_duty_cycle", "sm_util"), ("nvidia_gpu_power_usage_milliwatts", "power_w"),
    ("power_utilization", None),
    ("Relative_Time_s", "@elapsed"), ("Hostname", "@node"), ("nodename", "@node"),
    # a host's, or none of ours: never read as a GPU's
    ("cpu_percent", None), ("memory_percent", None), ("ram_used_gb", None), ("usage_percent", None),
    ("memory.free [MiB]", None), ("fan_speed", None), ("pstate", None), ("gpu_power_pct", None),
])
def test_a_column_is_matched_by_the_words_it_is_made_of(name: str, field: str | None) -> None:
    found = fa.lookup(name)
    assert (found[0].field if found else None) == field, (name, found)


def test_a_date_is_read_the_way_round_the_file_says(tmp_path: Path) -> None:
    """Day first with dashes until a value says otherwise: 11-25-2026 (the 25th month?) means month
    first, and the rows before it are read again that way; a file that never says stays day first
    and the dry run says how to read it the other way (`--time-format`, which decides outright)."""
    text = "time,gpu,utilization.gpu [%]\n11-03-2026 15:13:16,0,40\n11-25-2026 15:13:17,0,41\n"
    p = write(tmp_path, text, "us.csv")
    with source(p) as src:
        found = survey(src, None, formats.ReadOptions(), None)
    assert (found.first, found.last) == (datetime(2026, 11, 3, 15, 13, 16, tzinfo=UTC),
                                         datetime(2026, 11, 25, 15, 13, 17, tzinfo=UTC))
    assert found.mapping.time_form == "%m-%d-%Y %H:%M:%S" and found.readings == 2 and not found.skipped
    p = write(tmp_path, "time,gpu,utilization.gpu [%]\n03-11-2026 15:13:16,0,40\n04-11-2026 15:13:17,0,41\n", "eu.csv")
    with source(p) as src:
        found = survey(src, None, formats.ReadOptions(), None)
    assert found.first == datetime(2026, 11, 3, 15, 13, 16, tzinfo=UTC)
    assert "day first: no value says which way round; --time-format '%m-%d-%Y %H:%M:%S'" in str(found.mapping.time_form)
    with source(p) as src:
        found = survey(src, None, formats.ReadOptions(time_format="%m-%d-%Y %H:%M:%S"), None)
    assert found.first == datetime(2026, 3, 11, 15, 13, 16, tzinfo=UTC) and found.mapping.time_form == "%m-%d-%Y %H:%M:%S"


def test_a_time_format_that_does_not_fit_is_said_and_one_that_reads_nothing_refused(tmp_path: Path) -> None:
    for bad in ("dd-mm-yyyy", "%Q", ""):
        with pytest.raises(ValueError, match="is not a strftime form"):
            time_format(bad)
    p = write(tmp_path, "time,gpu,utilization.gpu [%]\n03-11-2026 15:13:16,0,40\n", "eu.csv")
    with source(p) as src, pytest.raises(RecordingError, match=re.escape(
            "time '03-11-2026 15:13:16' is not in the column's form (%Y/%m/%d)")):
        survey(src, None, formats.ReadOptions(time_format="%Y/%m/%d"), None)
    dmon = write(tmp_path, "# gpu   pwr    sm\n# Idx     W     %\n    0    60     5\n", "dmon.log")
    with source(dmon) as src, pytest.raises(RecordingError, match="--time-format names a time column's form"):
        survey(src, None, formats.ReadOptions(time_format="%H:%M:%S"), None)


def test_a_new_node_on_every_row_is_bounded_and_a_hostile_name_kept_short(tmp_path: Path) -> None:
    """A node column that names a new node on every row is no cluster: past `MAX_NODES` its rows are
    bad lines (counted, one pass, in bounded time); a node's name is cut to what Slurm could name."""
    rows = "".join(f"{1775044800 + i},h{i}{'n' * 500},0,50\n" for i in range(MAX_NODES + 500))
    p = write(tmp_path, "time,hostname,gpu,utilization.gpu\n" + rows, "hosts.csv")
    began = time.monotonic()
    with source(p) as src:
        found = survey(src, None, formats.ReadOptions(), None)
    assert time.monotonic() - began < 10
    assert (len(found.nodes), found.readings, found.skipped) == (MAX_NODES, MAX_NODES, {"malformed": 500})
    assert max(len(n) for n in found.nodes) == 60 and "beyond the 1024 one file may name" in found.bad[0].reason
