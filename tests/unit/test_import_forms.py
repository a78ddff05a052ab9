"""`jobpulse import` reads the logs people keep: every time form, every family of column names, every
kind of damage (counted, not fatal, until it dominates) and every format, each on a file written the
way its tool writes it (real recordings of the library where there is one: test_recordings judges
them all). The first pass alone (`survey`): what was understood, nothing stored."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from jobpulse.collector.recordings.faults import RecordingError
from jobpulse.collector.recordings.formats import ReadOptions, readings
from jobpulse.collector.recordings.importer import Options, dry_run
from jobpulse.collector.recordings.intake import source
from jobpulse.collector.recordings.survey import Survey, survey
from jobpulse.collector.recordings.values import Reading

LIBRARY = Path(__file__).parents[1] / "data" / "recordings"


def surveyed(path: Path, tz: ZoneInfo | None = None, fmt: str | None = None, **kw: object) -> Survey:
    with source(path) as src:
        return survey(src, fmt, ReadOptions(**kw), tz)  # type: ignore[arg-type]


def read(path: Path, fmt: str, **kw: object) -> list[Reading]:
    with source(path) as src:
        return [r for r in readings(src, fmt, ReadOptions(**kw)) if isinstance(r, Reading)]  # type: ignore[arg-type]


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------------------- times

T0 = datetime(2026, 4, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("form", "written"), [
    ("epoch s", "1775044800"), ("epoch s float", "1775044800.250"), ("epoch ms", "1775044800250"),
    ("epoch µs", "1775044800250000"), ("epoch ns", "1775044800250000000"),
    ("ISO with zone", "2026-04-01T14:00:00.25+02:00"), ("ISO Z", "2026-04-01T12:00:00.250Z"),
    ("ISO ns, comma", "2026-04-01T12:00:00,250000000+00:00"), ("ISO naive", "2026-04-01 12:00:00.250"),
    ("nvidia-smi", "2026/04/01 12:00:00.250"), ("ctime", "Wed Apr  1 12:00:00 2026"),
])
def test_every_time_form_reads_as_the_same_instant(tmp_path: Path, form: str, written: str) -> None:
    second = written.replace("12:00:00", "12:00:01").replace("14:00:00", "14:00:01")
    if written.replace(".", "").isdigit():  # one second later in the same unit
        digits = len(written.split(".")[0])
        second = str(int(written.split(".")[0]) + 10 ** max(digits - 10, 0)) + (
            "." + written.split(".")[1] if "." in written else "")
    p = write(tmp_path, "t.csv", f'time,gpu_util\n"{written}",50\n"{second}",60\n')
    found = surveyed(p)
    want = T0 + timedelta(milliseconds=250 if "250" in written or ".25" in written else 0)
    assert (found.first, found.readings, found.skipped) == (want, 2, {}), (form, found.first, found.mapping.time_form)


def test_naive_times_take_tz_and_elapsed_seconds_need_start(tmp_path: Path) -> None:
    p = write(tmp_path, "local.csv", "timestamp,gpu_util\n2026/04/01 14:00:00.000,5\n2026/04/01 14:00:05.000,5\n")
    assert surveyed(p, tz=ZoneInfo("Europe/Berlin")).first == T0
    elapsed = write(tmp_path, "elapsed.csv", "elapsed_s,gpu_util\n0.0,50\n5.0,55\n")
    with pytest.raises(RecordingError, match="seconds from the start .* --start TIME"):
        surveyed(elapsed)
    start = datetime(2026, 4, 1, 12)
    assert surveyed(elapsed, start=start).first == T0
    small = write(tmp_path, "small.csv", "timestamp,gpu_util\n12.5,50\n17.5,55\n")  # never read as 1970
    with pytest.raises(RecordingError, match="--start"):
        surveyed(small)
    assert surveyed(small, start=start).first == T0 + timedelta(seconds=12.5)


def test_a_time_of_no_gpu_is_a_bad_line_never_an_overflow(tmp_path: Path) -> None:
    p = write(tmp_path, "years.csv", "timestamp,gpu_util\n" + "".join(
        f"2026/04/01 12:00:{s:02d}.000,5\n" for s in range(10)) + "0001/01/01 00:00:00.000,5\n9999/12/31 23:59:59.000,5\n")
    found = surveyed(p)
    assert found.skipped == {"malformed": 2} and found.last == T0 + timedelta(seconds=9)
    assert "is year 1: not a time a GPU was recorded" in found.bad[0].reason


# ---------------------------------------------------------------------------------- column families

FAMILIES = {
    "nvidia-smi": ("timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]",
                   "2026/04/01 12:00:00.000, 0, 87 %, 1024 MiB, 40960 MiB, 250.5 W"),
    "dcgm names": ("timestamp,gpu,DCGM_FI_DEV_GPU_UTIL,DCGM_FI_DEV_FB_USED,DCGM_FI_DEV_POWER_USAGE",
                   "1775044800,0,87,1024,250.5"),
    "dcgm tags": ("TimeStamp,EntityId,GPUTL,FBUSD,POWER", "1775044800,0,87,1024,250.5"),
    "nvml-style": ("time,gpu_id,gpu_util,mem_used_mb,mem_total_mb,power_w", "1775044800.0,0,87,1024,40960,250.5"),
    "psutil-style": ("timestamp,cpu_percent,ram_percent,gpu_utilization,gpu_memory_used_gb,gpu_temperature",
                     "2026-04-01T12:00:00,12.5,40.1,87,1.0,65"),
    "gpustat keys": ("query_time,index,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu",
                     "2026-04-01T12:00:00,0,87,1024,40960,250.5,65"),
    "units in header only": ("Timestamp,GPU Utilization (%),GPU Memory Used (GB),Power (W)",
                             "2026-04-01 12:00:00,87,1,250.5"),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_of_column_names_maps_to_our_fields(tmp_path: Path, family: str) -> None:
    header, row = FAMILIES[family]
    got = read(write(tmp_path, "f.csv", f"{header}\n{row}\n"), "csv")
    assert len(got) == 1 and got[0].values["sm_util"] == 87 and got[0].ts is not None, (family, got)
    assert got[0].values.get("fb_used_mib", 1024) == 1024, (family, got[0].values)
    assert got[0].values.get("power_w", 250.5) == 250.5


def test_columns_names_a_table_without_a_header(tmp_path: Path) -> None:
    p = write(tmp_path, "noheader.csv", "1775044800, 0, 87, 1024\n1775044801, 0, 88, 1024\n")
    found = surveyed(p, fmt="csv", columns=["timestamp", "index", "utilization.gpu", "memory.used"])
    assert found.readings == 2 and found.mapping.columns["utilization.gpu"] == "sm_util"
    with pytest.raises(RecordingError, match="--columns"):
        surveyed(p, fmt="csv")


def test_wide_files_one_column_per_gpu(tmp_path: Path) -> None:
    """W&B's system-metrics export (system.gpu.N.*) and a logger's gpu0_util, gpu1_util."""
    wandb = write(tmp_path, "wandb.csv", "_runtime,_timestamp,system.cpu,system.gpu.0.gpu,system.gpu.0.memoryAllocatedBytes,"
                  "system.gpu.1.gpu,system.gpu.1.powerWatts\n"
                  "30,1775044800.5,12,90,1073741824,3,61.5\n60,1775044830.5,11,91,1073741824,0,60.0\n")
    found = surveyed(wandb)
    assert (found.fmt, sorted(found.gpus), found.readings) == ("wandb-csv", [0, 1], 4)
    assert found.mapping.columns["system.gpu.1.powerWatts"] == "power_w" and "system.cpu" in found.mapping.ignored
    got = read(wandb, "wandb-csv")
    assert got[0].values == {"sm_util": 90, "fb_used_mib": 1024} and got[1].values == {"sm_util": 3, "power_w": 61.5}
    own = write(tmp_path, "own.csv", "time,gpu0_util,gpu1_util,util_gpu2\n1775044800,90,0,5\n1775044801,91,0,6\n")
    assert sorted(surveyed(own).gpus) == [0, 1, 2]


def test_rows_that_cycle_through_gpus_without_an_index(tmp_path: Path) -> None:
    """At one instant (times within a few ms) each row is the next GPU; --gpus N says so outright."""
    rows = "".join(f"2026/04/01 12:00:{s:02d}.{ms:03d}, {u} %\n" for s in range(5) for ms, u in ((101, 90), (102, 0)))
    p = write(tmp_path, "twogpus.csv", "timestamp, utilization.gpu [%]\n" + rows)
    found = surveyed(p)
    assert sorted(found.gpus) == [0, 1] and found.gpus[1].readings == 5 and not found.mapping.named
    untimed = write(tmp_path, "untimed.csv", "utilization.gpu [%]\n" + "90 %\n0 %\n10 %\n" * 4)
    found = surveyed(untimed, gpu_count=3, interval=timedelta(seconds=2), start=datetime(2026, 4, 1))
    assert sorted(found.gpus) == [0, 1, 2] and found.gpus[2].readings == 4 and found.interval_s == 2


# --------------------------------------------------------------------------------------------- damage


def test_damage_is_counted_and_skipped(tmp_path: Path) -> None:
    good = [f"2026/04/01 12:00:{s:02d}.000, 0, {50 + s} %" for s in range(40)]
    header = "timestamp, index, utilization.gpu [%]"
    lines = [header, *good[:10], header, *good[10:20], "2026/04/01 12:00:05.000, 0, 50 %",  # time going backwards
             "2026/04/01 12:00:20.000, 0, oops %", *good[20:], "2026/04/01 12:00:41.000, 0"]  # cut by a kill
    p = write(tmp_path, "damaged.csv", "\n".join(lines))  # no newline at the end either
    found = surveyed(p)
    assert found.readings == 40
    assert found.skipped == {"repeated header": 1, "time going backwards": 1, "malformed": 1,
                             "truncated line at the end": 1}, found.skipped
    assert found.skipped_text() == ("skipped 1 malformed line, 1 repeated header, 1 line whose time goes backwards, "
                                    "1 truncated line at the end")


def test_damage_that_dominates_is_refused_quoting_the_first_bad_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "bad.csv", "timestamp, index, utilization.gpu [%]\n2026/04/01 12:00:00.000, 0, 5 %\n"
              + "".join(f"2026/04/01 12:00:{s:02d}.000, 0, {s} per cent\n" for s in range(1, 5)))
    with pytest.raises(RecordingError, match=r"4 bad lines \(4 malformed lines\) against 1 good readings.*first: line 3: utilization"
                                             r".*'1 per cent' is not a number"):
        surveyed(p)


# -------------------------------------------------------------------------------------------- formats

SMI_TABLE = """Wed Apr  1 12:00:0{s} 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.133.20             Driver Version: 570.133.20     CUDA Version: 12.8     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          Off |   00000000:AB:00.0 Off |                    0 |
| N/A   33C    P0            {p}W /  700W |   {m}MiB /  81559MiB |     {u}%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+
|   1  NVIDIA H100 80GB HBM3          Off |   00000000:BA:00.0 Off |                    0 |
| N/A   26C    P0             70W /  700W |       0MiB /  81559MiB |      0%      Default |
+-----------------------------------------+------------------------+----------------------+
"""
WINDOWS = """Wed Apr  1 12:00:0{s} 2026
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 516.94       Driver Version: 516.94       CUDA Version: 11.7     |
|-------------------------------+----------------------+----------------------+
| GPU  Name            TCC/WDDM | Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|===============================+======================+======================|
|   0  NVIDIA GeForce ... WDDM  | 00000000:01:00.0  On |                  N/A |
| 30%   45C    P2   {p}W / 170W |   {m}MiB / 12288MiB  |     {u}%      Default |
+-------------------------------+----------------------+----------------------+
"""


@pytest.mark.parametrize("template", [SMI_TABLE, WINDOWS], ids=["linux", "windows-wddm"])
def test_nvidia_smi_table_repeated(tmp_path: Path, template: str) -> None:
    text = "".join(template.format(s=s, p=100 + s, m=1000 + s, u=90 + s) for s in range(3))
    found = surveyed(write(tmp_path, "smi.log", text))
    assert found.fmt == "smi-table" and found.readings == 3 * template.count("MiB /")
    got = read(tmp_path / "smi.log", "smi-table")
    assert (got[0].ts, got[0].gpu, got[0].values) == (datetime(2026, 4, 1, 12), 0, {
        "power_w": 100, "power_limit_w": 700 if template is SMI_TABLE else 170, "gpu_temp_c": 33 if template is
        SMI_TABLE else 45, "fb_used_mib": 1000, "fb_total_mib": 81559 if template is SMI_TABLE else 12288,
        "sm_util": 90})


SMI_Q = """
==============NVSMI LOG==============

Timestamp                                 : Wed Apr  1 12:00:0{s} 2026
Driver Version                            : 570.133.20

Attached GPUs                             : 1
GPU 00000000:CA:00.0
    Product Name                          : NVIDIA A40
    GPU UUID                              : GPU-4dedf221-2c6d-da43-e5fc-01d46ed4ac0d
    FB Memory Usage
        Total                             : 46068 MiB
        Reserved                          : 569 MiB
        Used                              : {m} MiB
    Utilization
        GPU                               : {u} %
        Memory                            : 3 %
    Temperature
        GPU Current Temp                  : 41 C
    GPU Power Readings
        Average Power Draw                : 121.41 W
        Instantaneous Power Draw          : 121.31 W
        Current Power Limit               : 300.00 W
    Clocks
        Graphics                          : 1740 MHz
        SM                                : 1740 MHz
        Memory                            : 7251 MHz
"""


def test_nvidia_smi_q_text_repeated(tmp_path: Path) -> None:
    found = surveyed(write(tmp_path, "q.log", "".join(SMI_Q.format(s=s, m=100 * s, u=10 * s) for s in range(4))))
    assert (found.fmt, found.readings, found.first) == ("smi-q", 4, datetime(2026, 4, 1, 12, tzinfo=UTC))
    got = read(tmp_path / "q.log", "smi-q")
    assert got[2].values == {"fb_total_mib": 46068, "fb_reserved_mib": 569, "fb_used_mib": 200, "sm_util": 20,
                             "mem_util": 3, "gpu_temp_c": 41, "power_w": 121.41, "power_limit_w": 300,
                             "sm_clock_mhz": 1740, "mem_clock_mhz": 7251}
    assert (got[0].uuid, got[0].model) == ("GPU-4dedf221-2c6d-da43-e5fc-01d46ed4ac0d", "NVIDIA A40")


SMI_X = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
	<timestamp>Wed Apr  1 12:00:0{s} 2026</timestamp>
	<attached_gpus>2</attached_gpus>
	<gpu id="00000000:07:00.0">
		<product_name>NVIDIA A100-SXM4-40GB</product_name>
		<uuid>GPU-aaaa</uuid>
		<fb_memory_usage><total>40960 MiB</total><used>{m} MiB</used></fb_memory_usage>
		<utilization><gpu_util>{u} %</gpu_util><memory_util>10 %</memory_util></utilization>
		<gpu_power_readings><power_draw>250.10 W</power_draw><current_power_limit>400.00 W</current_power_limit>
		</gpu_power_readings>
		<clocks><sm_clock>1410 MHz</sm_clock></clocks>
	</gpu>
	<gpu id="00000000:0F:00.0">
		<product_name>NVIDIA A100-SXM4-40GB</product_name>
		<uuid>GPU-bbbb</uuid>
		<utilization><gpu_util>0 %</gpu_util></utilization>
		<power_readings><power_draw>N/A</power_draw></power_readings>
	</gpu>
</nvidia_smi_log>
"""


def test_nvidia_smi_xml_repeated(tmp_path: Path) -> None:
    text = "".join(SMI_X.format(s=s, m=1000 * s, u=30 * s) for s in range(3))
    found = surveyed(write(tmp_path, "x.xml", text))
    assert (found.fmt, found.readings, sorted(found.gpus)) == ("smi-xml", 6, [0, 1])
    got = read(tmp_path / "x.xml", "smi-xml")
    assert got[2].values == {"fb_total_mib": 40960, "fb_used_mib": 1000, "sm_util": 30, "mem_util": 10,
                             "power_w": 250.1, "power_limit_w": 400, "sm_clock_mhz": 1410}
    assert got[3].values == {"sm_util": 0} and got[3].uuid == "GPU-bbbb", "N/A power: not measured"
    broken = write(tmp_path, "cut.xml", text + SMI_X.format(s=3, m=1, u=1)[:300])
    assert surveyed(broken).skipped == {"truncated line at the end": 1}


def test_gpustat_json_pretty_and_json_lines(tmp_path: Path) -> None:
    """`gpustat --json` in a loop (pretty-printed, one object after another) and nvitop's collector
    written as JSON lines."""
    def sample(s: int) -> dict[str, object]:
        return {"hostname": "node1", "driver_version": "535.104.05", "query_time": f"2026-04-01T12:00:0{s}.000000",
                "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA RTX A6000", "temperature.gpu": 50,
                          "fan.speed": 30, "utilization.gpu": 90 * (1 - i), "utilization.enc": 0,
                          "power.draw": 280, "enforced.power.limit": 300, "memory.used": 30000, "memory.total": 49140,
                          "processes": [{"pid": 1, "gpu_memory_usage": 29000}]} for i in range(2)]}
    p = write(tmp_path, "gpustat.json", "".join(json.dumps(sample(s), indent=4) + "\n" for s in range(3)))
    found = surveyed(p)
    assert (found.fmt, found.readings, sorted(found.gpus)) == ("json", 6, [0, 1])
    got = read(p, "json")
    assert got[0].values == {"gpu_temp_c": 50, "sm_util": 90, "enc_util": 0, "power_w": 280, "power_limit_w": 300,
                             "fb_used_mib": 30000, "fb_total_mib": 49140}
    nvitop = write(tmp_path, "nvitop.jsonl", "".join(json.dumps({
        "timestamp": 1775044800 + s, "host/cpu_percent (%)/mean": 12.0,
        "cuda:0 (gpu:3)/gpu_utilization (%)/mean": 80.0 + s, "cuda:0 (gpu:3)/memory_used (MiB)/mean": 2048.0,
        "cuda:0 (gpu:3)/power_usage (W)/mean": 200.0}) + "\n" for s in range(3)) + '{"timestamp": 17750')
    found = surveyed(nvitop)
    assert (found.readings, sorted(found.gpus), found.skipped) == (3, [3], {"truncated line at the end": 1})


def test_dcgmi_dmon_text(tmp_path: Path) -> None:
    text = "#Entity   GPUTL  FBUSD  SMACT\nID\n" + "GPU 0     93     39000  0.812\nGPU 1     0      12     0.0\n" * 3
    found = surveyed(write(tmp_path, "dcgmi.log", text), start=datetime(2026, 4, 1))
    assert (found.fmt, found.readings, found.interval_s) == ("dcgmi-dmon", 6, 1.0)


# ------------------------------------------------------------------------------------- real files


def test_real_nvidia_smi_tables_repeated_gzip_and_a_loop_without_sleep() -> None:
    """SlurmMWE's `nvidia-smi >> log` in a loop (L40S, gzip as stored): several tables a second,
    nvidia-smi's date line in whole seconds, so the repeats of a second are one sample, not damage."""
    found = surveyed(LIBRARY / "l40s-bert-sst2-finetune-appended-runs-smi-table.log.gz")
    assert (found.fmt, found.readings, found.gpus[0].model) == ("smi-table", 222, "NVIDIA L40S")
    assert found.skipped == {"time repeated": 1353} and found.damage == 0
    assert found.measured >= {"sm_util", "fb_used_mib", "fb_total_mib", "power_w", "power_limit_w", "gpu_temp_c"}
    alvis = surveyed(LIBRARY / "a40-alvis-speech-curriculum-lowutil-2h-smi-table.log")
    assert (alvis.readings, alvis.interval_s, alvis.skipped) == (134, 60.0, {})


def test_real_log_cut_mid_line_and_epoch_seconds() -> None:
    """An H100 NVL --query-gpu log that ends mid-line where nvidia-smi's buffer was never flushed;
    a logger of one's own with Unix seconds and nvidia-smi's property names."""
    cut = surveyed(LIBRARY / "h100nvl-llm-eval-testrun-cut-short-query.log")
    assert (cut.readings, cut.skipped) == (104, {"truncated line at the end": 1})
    assert cut.bad[0].line == 106 and cut.bad[0].text.endswith("95830 MiB,")
    own = surveyed(LIBRARY / "gpu24g-rectified-point-flow-train-60s-custom.csv")
    assert (own.fmt, own.mapping.time_form, own.first) == ("query-gpu", "Unix time in s",
                                                         datetime(2025, 11, 26, 20, 31, 15, tzinfo=UTC))


def test_real_site_monitor_logs_name_their_node_and_a_cron_jobs_minutes() -> None:
    """Lengau's node monitor (no header, named with --columns): the hostname column names the node,
    its four GPUs are that node's, the user and PID columns are none of ours, '20190923 00:00' is read."""
    columns = ["timestamp", "hostname", "index", "pci.bus_id", "temperature.gpu", "utilization.gpu",
               "utilization.memory", "user", "app", "pids"]
    found = surveyed(LIBRARY / "gpux4-lengau-gromacs-uses-one-of-four-24h-hostname-noheader.log", fmt="csv",
                     columns=columns)
    assert (list(found.nodes), sorted(found.gpus), found.readings, found.skipped) == (["gpu4001"], [0, 1, 2, 3], 1152, {})
    assert (found.mapping.node_column, found.mapping.time_form, found.interval_s) == ("hostname", "%Y%m%d %H:%M", 300)
    assert found.first == datetime(2019, 9, 23, tzinfo=UTC) and found.mapping.ignored == ["user", "app", "pids"]


def test_real_json_array_of_samples_pretty_printed_and_on_one_line(tmp_path: Path) -> None:
    """A logger that rewrites one indented JSON array of all its samples (AlgoTradPro5's
    gpu_metrics.json): '[' alone, objects separated by '},', ']' at the end; and the same array on one line."""
    found = surveyed(LIBRARY / "gpu11g-desktop-trading-app-gpu-monitor-near-idle-json-array.json")
    assert (found.fmt, found.readings, found.skipped, found.damage) == ("json", 1252, {}, 0)
    assert found.measured >= {"sm_util", "fb_used_mib", "fb_total_mib", "gpu_temp_c"}
    assert found.first == datetime(2025, 3, 6, 18, 35, 35, 511152, tzinfo=UTC)
    one = write(tmp_path, "one.json", json.dumps([{"timestamp": 1775044800 + s, "gpu_load": 40.0 + s,
                                                   "gpu_memory_used": 1500.0} for s in range(3)]) + "\n")
    got = read(one, "json")
    assert [r.values["sm_util"] for r in got] == [40, 41, 42]


# ------------------------------------------------------------------------------------ hostile input


@pytest.mark.parametrize(("name", "text"), [
    ("huge-epoch.csv", "timestamp,gpu_util\n1775044800,5\n99999999999999999999,5\n"),
    ("inf-index.csv", "timestamp,index,gpu_util\n1775044800,0,5\n1775044801,1e400,5\n"),
    ("mixed-zones.csv", "timestamp,gpu_util\n2026-04-01T12:00:00+00:00,5\n2026-04-01 12:00:01,5\n"),
    ("deep.json", "{\n" + '"a": {\n' * 5000 + "1" + "}\n" * 5001),
    ("wide-keys.jsonl", "".join(f'{{"timestamp": {1775044800 + i}, "gpu_util": 5, "k{i}": 1}}\n' for i in range(500))),
    ("bus-ids.csv", "timestamp,pci.bus_id,gpu_util\n" + "".join(f"{1775044800 + i},{i:08x}:01:00.0,5\n"
                                                                for i in range(200))),
])
def test_hostile_lines_are_counted_or_refused_in_one_line(tmp_path: Path, name: str, text: str) -> None:
    """A Unix time past the C library's, an index of 1e400, a zone on some times only, JSON nested
    thousands deep, keys that change every sample, a new GPU on every row: skipped lines or one
    `RecordingError`, bounded, never another exception."""
    try:
        found = surveyed(write(tmp_path, name, text))
    except RecordingError as exc:
        assert "\n" not in str(exc)
    else:
        assert found.readings and (found.skipped or name == "wide-keys.jsonl"), (name, found.skipped)


def test_mutated_real_recordings_never_raise_anything_but_a_recording_error(tmp_path: Path) -> None:
    """Every file of the library, cut, spliced and sprinkled with years, infinities and stray bytes."""
    import gzip
    import random

    seeds = [(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes())[:20_000]
             for p in sorted(LIBRARY.iterdir()) if p.suffix != ".toml"]
    r = random.Random(58)
    for case in range(300):
        b = bytearray(r.choice(seeds))
        for _ in range(r.randint(1, 30)):
            pos, op = r.randrange(len(b) or 1), r.random()
            if op < 0.3:
                b[pos:pos + 1] = bytes([r.choice(b"0123456789,.:- \n%{}[]<>/\"aZ")])
            elif op < 0.5:
                del b[pos:pos + r.randint(1, 50)]
            elif op < 0.7:
                b[pos:pos] = b[r.randrange(len(b) or 1):][:r.randint(1, 200)]
            else:
                b[pos:pos] = r.choice([b"9999/12/31 23:59:59", b"0001/01/01", b"1e308", b"-1", b"nan", b"inf",
                                       b"99999999999999999999", b"\xff\xfe", b"\n"])
        p = tmp_path / "mutated.log"
        p.write_bytes(bytes(b))
        kw = r.choice([{}, {"columns": ["timestamp", "index", "utilization.gpu"]}, {"gpu_count": 2}])
        try:
            surveyed(p, **kw)
        except RecordingError:
            pass
        except Exception as exc:  # noqa: BLE001 - the point: nothing else escapes
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc}")


def test_a_table_without_a_header_asks_for_columns() -> None:
    with pytest.raises(RecordingError, match=r"a table without a header: .*--columns timestamp,utilization.gpu"):
        surveyed(LIBRARY / "a100-80g-vllm-agent-server-idle-epoch-noheader.log")
    found = surveyed(LIBRARY / "a100-80g-vllm-agent-server-idle-epoch-noheader.log",
                     columns=["timestamp", "utilization.gpu", "power.draw", "memory.used", "memory.total"])
    assert (found.readings, found.mapping.time_form, found.interval_s) == (1657, "Unix time in s", 5.0)


def test_nvidia_smi_table_from_powershell_utf16_crlf(tmp_path: Path) -> None:
    """`nvidia-smi -l 1 > gpu.txt` in PowerShell: UTF-16 with a BOM, CRLF line ends."""
    text = "".join(WINDOWS.format(s=s, p=100 + s, m=1000 + s, u=90 + s) for s in range(3)).replace("\n", "\r\n")
    p = tmp_path / "gpu.txt"
    p.write_bytes(text.encode("utf-16"))
    found = surveyed(p)
    assert (found.fmt, found.readings, found.gpus[0].model) == ("smi-table", 3, "NVIDIA GeForce ...")


def test_real_wandb_system_metrics_as_the_sdk_writes_them() -> None:
    """A W&B run's own wandb-events.jsonl (a Colab T4, 2020): `system.gpu.0.*` keys through the alias
    table, Unix `_timestamp` for the time, CPU, disk and network keys ignored."""
    found = surveyed(LIBRARY / "t4-colab-dqn-spaceinvaders-wandb-events.jsonl")
    assert (found.fmt, found.readings, found.interval_s, found.damage) == ("json", 18, 30.0, 0)
    assert found.first == datetime(2020, 2, 19, 0, 9, 1, tzinfo=UTC)
    assert found.measured == {"sm_util", "mem_util", "gpu_temp_c", "power_w"}
    got = read(LIBRARY / "t4-colab-dqn-spaceinvaders-wandb-events.jsonl", "json")
    assert got[0].values == {"sm_util": 4, "mem_util": 0, "gpu_temp_c": 50, "power_w": 27.79}  # the fields are whole %, °C


def test_real_nvitop_table_reads_as_nvidia_smis() -> None:
    """`nvitop -1` of a DGX Station: nvidia-smi's table with box-drawing borders, memory in MiB or GiB
    with decimals, the host bars and nvitop's process table between reports are not readings."""
    found = surveyed(LIBRARY / "v100-dgxs-x4-shared-workstation-nvitop-once.log")
    assert (found.fmt, found.readings, sorted(found.gpus), found.damage) == ("smi-table", 4, [0, 1, 2, 3], 0)
    got = read(LIBRARY / "v100-dgxs-x4-shared-workstation-nvitop-once.log", "smi-table")
    assert got[0].values == {"power_w": 80, "power_limit_w": 300, "gpu_temp_c": 53, "fb_used_mib": 19008,
                             "fb_total_mib": 32768, "sm_util": 97}
    assert got[1].values["fb_used_mib"] == 9 and got[2].pci_bus_id == "00000000:0E:00.0"


def test_real_gpustat_text_repeated_default_and_with_fan_codec_power() -> None:
    """gpustat's plain text, a snapshot a minute (default: `60'C,  68 %`) and every 20 s with -F -e -P
    (fan before the utilization, encoder/decoder in brackets, power '?? / ?? W' unknown): the host
    line's time is each snapshot's, gpustat's keys go through the alias table, its MB are MiB."""
    busy = surveyed(LIBRARY / "rtx2070s-io-trace-gpu-busy-17min-gpustat.txt")
    assert (busy.fmt, busy.readings, busy.interval_s, busy.damage) == ("gpustat", 18, 60.0, 0)
    assert busy.first == datetime(2022, 12, 19, 18, 33, 32, tzinfo=UTC)
    assert busy.gpus[0].model == "NVIDIA GeForce RTX 2070 SUPER"
    got = read(LIBRARY / "rtx2070s-io-trace-gpu-busy-17min-gpustat.txt", "gpustat")
    assert got[0].values == {"gpu_temp_c": 60, "sm_util": 68, "fb_used_mib": 3712, "fb_total_mib": 7982}
    idle = surveyed(LIBRARY / "rtx2070s-io-trace-python-holds-memory-idle-13min-gpustat.txt")
    assert (idle.fmt, idle.readings, idle.interval_s, idle.damage) == ("gpustat", 39, 20.0, 0)
    assert "fan.speed" in idle.mapping.ignored
    got = read(LIBRARY / "rtx2070s-io-trace-python-holds-memory-idle-13min-gpustat.txt", "gpustat")
    assert got[2].values == {"gpu_temp_c": 30, "sm_util": 1, "enc_util": 0, "dec_util": 0, "fb_used_mib": 7584,
                             "fb_total_mib": 7982}  # 31 % is the fan; '?? / ?? W' not measured


def test_gpustat_text_of_several_gpus_with_colours_power_and_a_date_banner(tmp_path: Path) -> None:
    """`gpustat -P --color` in a loop behind `===== date =====` banners, 2 GPUs, a cut last line."""
    snap = ("\x1b[1m\x1b[37mnode7\x1b[m  Thu Jan 15 09:34:{s:02d} 2026  560.35.05\n"
            "\x1b[36m[0]\x1b[m \x1b[34mNVIDIA A100-SXM4-80GB\x1b[m | \x1b[31m45°C\x1b[m, \x1b[32m 97 %\x1b[m,"
            "  312 / 400 W | \x1b[33m40000\x1b[m / \x1b[33m81920\x1b[m MB | u:python/1(39990M)\n"
            "[1] NVIDIA A100-SXM4-80GB | 46°C,   0 %,   61 / 400 W |     0 / 81920 MB |\n")
    text = "".join(f"===== 2026-01-15 09:34:{s:02d} =====\n" + snap.format(s=s) + "\n" for s in range(0, 10, 2))
    p = write(tmp_path, "gpustats.log", text + "[0] NVIDIA A100-SXM4-80GB | 45°C,  9")
    found = surveyed(p)
    assert (found.fmt, found.readings, sorted(found.gpus), found.interval_s) == ("gpustat", 10, [0, 1], 2.0)
    assert found.skipped == {"truncated line at the end": 1}
    got = read(p, "gpustat")
    assert got[0].values == {"gpu_temp_c": 45, "sm_util": 97, "power_w": 312, "power_limit_w": 400,
                             "fb_used_mib": 40000, "fb_total_mib": 81920}
    assert got[1].ts == got[0].ts == datetime(2026, 1, 15, 9, 34, 0) and got[1].values["sm_util"] == 0


def test_a_dry_run_refused_for_its_place_still_says_what_it_read(tmp_path: Path) -> None:
    """A recording older than the retention horizon is refused, and the dry run (which may have read
    gigabytes to get there) still shows its mapping, GPUs and time range beside the reason."""
    path = write(tmp_path, "old.csv", "timestamp, index, name, utilization.gpu [%], memory.used [MiB]\n"
                 "2020/01/01 00:00:00.000, 0, NVIDIA A100, 50 %, 100 MiB\n"
                 "2020/01/01 00:00:01.000, 0, NVIDIA A100, 51 %, 100 MiB\n")
    with pytest.raises(RecordingError) as refused:
        dry_run([path], Options())
    said = str(refused.value)
    assert said.startswith("the recording begins 2020-01-01T00:00:00+00:00, before the 30-day retention horizon")
    assert "utilization.gpu [%] -> sm_util" in said and "2 readings, 2020-01-01T00:00:00+00:00" in said


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cell", ["a/" * 30_000, "|" * 60_000, "40'C, 5 %, " + "/" * 60_000 + " W | 1 / 2 MB",
                                  "40'C, 5 % (" + "E:" * 30_000 + ") | 1 / 2 MB"])
def test_a_hostile_gpustat_line_costs_linear_time(tmp_path: Path, cell: str) -> None:
    """A 60 KB GPU line built to make a regular expression backtrack: detection and reading took a
    minute and more (values matched by `\\S+` before a `/`); a figure is a few characters now."""
    text = "host  Mon Dec 19 18:33:32 2022  465.19.01\n" + f"[0] x | {cell}\n" * 40
    started = time.monotonic()
    try:
        surveyed(write(tmp_path, "hostile.txt", text))
    except RecordingError:
        pass
    assert time.monotonic() - started < 5


def test_a_gpustat_snapshot_whose_time_is_unread_is_skipped_not_given_the_last_ones(tmp_path: Path) -> None:
    """A host line in another locale's date between two readable ones: its GPU lines are skipped
    and say why; they were read at the previous snapshot's time (and skipped as a repeated time)."""
    line = "[0] NVIDIA A100 | 41'C,  {} % |  7579 /  7982 MB | root(7575M)\n"
    found = surveyed(write(tmp_path, "gs.txt", "host1  Mon Dec 19 18:33:32 2022  465.19.01\n" + line.format(10)
                           + "host1  lun. 19 déc. 18:33:52 2022  465.19.01\n" + line.format(20)
                           + "host1  Mon Dec 19 18:34:12 2022  465.19.01\n" + line.format(30)))
    assert found.readings == 2
    assert found.skipped == {"malformed": 1}
    assert [(s.line, s.reason) for s in found.bad] == [(4, "its snapshot's host line has no time jobpulse reads")]
