"""`jobpulse report` shows only true evidence: each flag since when its condition began (and until
it ended), relative to the job's start as well as absolute; a rank's CPU summed over its main
process and its data-loader workers; and in the HTML report, a flag shaded on the plots of the GPUs
it concerns and no others."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from jobpulse.collector.report import html as report_html
from jobpulse.collector.report import text as report_text
from jobpulse.collector.store.read import reports
from jobpulse.schema import wire

from .conftest import RunningCollector

MINUTES = 20
CLUSTER, JOB = "rt", "8101"
# node -> [(uuid, NVML index)]; n1/GPU-a1 is allocated and never used
GPUS = {"n1": [("GPU-a0", 0), ("GPU-a1", 1)], "n2": [("GPU-b0", 0)]}
# rank -> (node, main pid, GPU it drives, main CPU %, worker pids, each worker's CPU %)
RANKS = {0: ("n1", 100, "GPU-a0", 98.0, (101, 102, 103), 94.0),
         1: ("n2", 200, "GPU-b0", 60.0, (201, 202), 85.0)}


def seed(c: RunningCollector) -> datetime:
    """A finished 2-node, 3-GPU job, sampled every second by one agent per node: GPU samples, the
    ranks' main processes on their GPUs and their data-loader workers (same job and rank, no GPU)."""
    start = (datetime.now(UTC) - timedelta(minutes=MINUTES + 5)).replace(second=0, microsecond=0)
    end = start + timedelta(minutes=MINUTES)
    job = wire.JobRecord(job_id=JOB, user_name="ann", partition="gpu", job_name="loader-bound", nodes=["n1", "n2"],
                         gpus_total=3, start_time=start, end_time=end, state="COMPLETED", exit_code=0)
    with c.client() as http:
        for node, gpus in GPUS.items():
            agent = wire.AgentInfo(instance=f"rt-{node}", node=node, cluster=CLUSTER, version="0.1.0",
                                   started_at=start)
            for minute in range(MINUTES):
                samples, procs = [], []
                for s in range(60):
                    ts = start + timedelta(minutes=minute, seconds=s)
                    for uuid, index in gpus:
                        used = uuid != "GPU-a1"
                        samples.append(wire.GpuSample(
                            ts=ts, gpu_uuid=uuid, gpu_index=index, job_id=JOB, sm_util=(40 if s % 2 else 0) if used
                            else 0, gpm_sm_active=(30.0 if s % 2 else 0.0) if used else 0.0,
                            fb_used_mib=9_000 if used else 0, fb_total_mib=81_559, power_w=200.0 if used else 70.0,
                            power_limit_w=700.0))
                    first = minute == 0 and s == 0  # a process's first sample has no CPU figure yet
                    for rank, (rnode, main, gpu, main_cpu, workers, worker_cpu) in RANKS.items():
                        if rnode != node:
                            continue
                        # one row per GPU the main process holds a context on, same CPU figure
                        for uuid, mib in [(gpu, 9_000)] + ([("GPU-a1", 500)] if main == 100 else []):
                            procs.append(wire.ProcessSample(
                                ts=ts, pid=main, gpu_uuid=uuid, job_id=JOB, step="0", rank=rank, local_rank=0,
                                gpu_mem_mib=mib, sm_util=30, cpu_percent=None if first else main_cpu, rss_mib=4_000,
                                command="python", cpu=rank))
                        # rank 1 starts a new pool of workers every 5 minutes (new PIDs), as a DataLoader
                        # without persistent workers does each epoch
                        pool = [w + 10 * (minute // 5) for w in workers] if rank == 1 else list(workers)
                        procs += [wire.ProcessSample(
                            ts=ts, pid=w, job_id=JOB, step="0", rank=rank, local_rank=0,
                            cpu_percent=None if first else worker_cpu, rss_mib=1_000, command="pt_data_worker",
                            cpu=8 + i) for i, w in enumerate(pool)]
                batch = wire.Batch(version=1, agent=agent, seq=minute, created_at=start + timedelta(minutes=minute + 1),
                                   gpu_samples=samples, process_samples=procs, jobs=[job] if minute == 0 else [])
                r = http.post("/v1/batches", content=wire.encode(batch))
                assert r.status_code == 200, r.text
    return start


# rule_id, scope, scope_key, minutes after start it began, minutes after start it ended (None: open),
# evidence; the GPU plots each must shade
FLAGS = [
    ("over_allocation", "job", "", 3, None, {"gpus": ["n1/GPU-a1"], "used": 2, "allocated": 3}, {"n1/GPU-a1"}),
    ("memory_underused", "job", "", 5, None,
     {"gpus": ["n1/GPU-a0", "n1/GPU-a1", "n2/GPU-b0"], "peak_mib": 9000, "ranks": []},
     {"n1/GPU-a0", "n1/GPU-a1", "n2/GPU-b0"}),
    ("idle_gpu", "gpu", "n1/GPU-a1", 4, 12, {"idle_minutes": 8, "ranks": []}, {"n1/GPU-a1"}),
    ("input_bound", "gpu", "n2/GPU-b0", 7, None, {"ranks": [1], "gpus": ["n2/GPU-b0"]}, {"n2/GPU-b0"}),
    ("topology_no_nvlink", "job", "n1", 0, None, {"node": "n1", "links": {"GPU0-GPU1": "SYS"},
                                                  "gpus": ["n1/GPU-a0"]}, {"n1/GPU-a0"}),
    ("hw_throttling", "node", "n2", 9, 11, {"reasons": "thermal"}, {"n2/GPU-b0"}),
    ("numa_far", "rank", "n1/pid100", 6, None, {"pid": 100, "rank": 0, "gpu": "n1/GPU-a0", "far_share": 0.9},
     {"n1/GPU-a0"}),
    ("numa_far", "rank", "n2/pid200", 2, 3, {"pid": 200, "rank": 1, "gpu": "n2/GPU0", "far_share": 0.8},
     {"n2/GPU-b0"}),  # the GPU named as node/GPU<index>
    ("low_utilization", "job", "", 8, None, {"mean": 15.0}, set()),  # job-wide, no "gpus": table only
]


def insert_flags(dsn: str, start: datetime) -> None:
    with psycopg.connect(dsn) as conn:
        for rule, scope, key, began, ended, evidence, _ in FLAGS:
            t0 = start + timedelta(minutes=began, seconds=17)
            t1 = None if ended is None else start + timedelta(minutes=ended, seconds=42)
            conn.execute(
                "INSERT INTO jobpulse.job_flags (cluster, job_id, rule_id, severity, category, scope, scope_key,"
                " started_at, ended_at, last_seen, evidence, advice) VALUES (%s, %s, %s, 'warning', 'code', %s, %s,"
                " %s, %s, %s, %s, 'do better')",
                (CLUSTER, JOB, rule, scope, key, t0, t1, t1 or start + timedelta(minutes=MINUTES),
                 json.dumps(evidence)))


def cli(dsn: str, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", JOB, "--dsn", dsn, *args],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def t(start: datetime, minutes: int, seconds: int) -> datetime:
    return start + timedelta(minutes=minutes, seconds=seconds)


def until(began: datetime, ended: datetime) -> str:
    """A flag's end as the report writes it: the time, and the date too when the flag crossed midnight."""
    return f"{ended:%H:%M:%S}" if began.date() == ended.date() else f"{ended:%Y-%m-%d %H:%M:%S}"


def rel(minutes: int, seconds: int) -> str:
    return f"+{minutes}m{seconds:02d}s" if minutes else f"+{seconds}s"


@pytest.fixture
def seeded(quiet_collector: RunningCollector, dsn: str) -> datetime:
    start = seed(quiet_collector)
    insert_flags(dsn, start)
    return start


def test_text_report_shows_when_each_flag_held_and_each_ranks_whole_cpu(seeded: datetime, dsn: str) -> None:
    start = seeded
    out = cli(dsn)
    print(out)
    lines = out.splitlines()
    for rule, _, key, began, ended, _, _ in FLAGS:
        head = next(i for i, line in enumerate(lines) if f"] {rule}{' ' + key if key else ''} (" in line)
        when = lines[head + 1].strip()
        if ended is None:
            assert when == f"since {t(start, began, 17):%Y-%m-%d %H:%M:%S} UTC (job {rel(began, 17)}), still open", when
            assert "open)" in lines[head]
        else:
            held = (ended - began) * 60 + 25
            assert when == (f"from {t(start, began, 17):%Y-%m-%d %H:%M:%S} UTC (job {rel(began, 17)}) until "
                            f"{until(t(start, began, 17), t(start, ended, 42))} UTC (job {rel(ended, 42)}), held "
                            f"{rel(held // 60, held % 60)[1:]}"), \
                when
            assert "closed)" in lines[head]
    assert "(job +0m01s)" not in out and "(job +1s)" not in out
    # evidence: lists as lists, nothing printed for what holds nothing
    assert "ranks=[]" not in out and "[]" not in out and "evidence: idle_minutes=8" in out
    assert "evidence: gpus=n2/GPU-b0, ranks=1" in out
    # a rank's CPU is its main process plus its data-loader workers (a main process on two GPUs
    # counts once; a pool of workers replaced every 5 minutes counts as the 2 workers alive at a time)
    assert re.search(r"rank +0 on n1  pid 100  CPU 380 % \(main 98 %, 3 workers\)  GPU mem 9500 MiB  RSS 4000 MiB",
                     out), out
    assert re.search(r"rank +1 on n2  pid 200  CPU 230 % \(main 60 %, 2 workers\)", out), out
    assert "GPUs 3  start" in out and f"end {t(start, MINUTES, 0):%Y-%m-%d %H:%M:%S} UTC" in out


def test_json_report_holds_the_rank_figures(seeded: datetime, dsn: str) -> None:
    ranks = {k["rank"]: k for k in json.loads(cli(dsn, "--format", "json"))["ranks"]}
    assert round(ranks[0]["cpu_percent"]) == 380 and round(ranks[0]["main_cpu_percent"]) == 98
    assert ranks[0]["workers"] == 3 and ranks[0]["main_pids"] == [100]
    assert round(ranks[1]["cpu_percent"]) == 230 and ranks[1]["workers"] == 2 and ranks[1]["max_workers"] == 2
    assert ranks[1]["pids"] == [200, 201, 202, 211, 212, 221, 222, 231, 232]


def test_html_report_shades_only_the_gpus_a_flag_concerns(seeded: datetime, dsn: str, tmp_path: Path) -> None:
    start = seeded
    path = tmp_path / "r.html"
    cli(dsn, "--format", "html", "-o", str(path))
    page = path.read_text()
    assert "<script" not in page
    plots = dict(re.findall(r"<svg [^>]*data-gpu='([^']+)'[^>]*>(.*?)</svg>", page, re.DOTALL))
    assert set(plots) == {"n1/GPU-a0", "n1/GPU-a1", "n2/GPU-b0"}
    for gpu, svg in plots.items():
        want = sorted(rule for rule, *_, gpus in FLAGS if gpu in gpus)
        assert sorted(re.findall(r"data-flag='([^']+)'", svg)) == want, (gpu, want)
    # each shading starts where its flag's condition began, not at the job's start
    for rule, _, _, began, _, _, gpus in FLAGS:
        since = t(start, began, 17).isoformat()
        for gpu in gpus:
            assert re.search(rf"data-flag='{rule}' data-since='{re.escape(since)}'", plots[gpu]), (rule, gpu)
    items = dict(re.findall(r"<li data-rule='([^']+)'>(.*?)</li>", page, re.DOTALL))
    assert f"since {t(start, 3, 17):%Y-%m-%d %H:%M:%S} UTC (job +3m17s), still open" in items["over_allocation"]
    assert (f"from {t(start, 4, 17):%Y-%m-%d %H:%M:%S} UTC (job +4m17s) until {until(t(start, 4, 17), t(start, 12, 42))} UTC "
            f"(job +12m42s), held 8m25s") in items["idle_gpu"]
    assert "shaded on n1/GPU1" in items["over_allocation"]
    assert "concerns the whole job: no GPU plot" in items["low_utilization"]
    assert "ranks=[]" not in page and "[]" not in page
    ranks = dict(re.findall(r"<tr data-rank='(\d+)'>(.*?)</tr>", page, re.DOTALL))
    assert "<td class='cpu'>380</td><td class='main'>98</td><td class='workers'>3</td>" in ranks["0"]
    assert "<td class='cpu'>230</td><td class='main'>60</td><td class='workers'>2</td>" in ranks["1"]


def test_module_functions_agree_with_the_cli(seeded: datetime, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        data = report_text.gather(conn, JOB, CLUSTER)
        page = report_html.render(data, report_html.series(conn, data))
        assert [f["started_at"] for f in data["flags"]] == [f["started_at"] for f in reports.job(conn, JOB, None)["flags"]]
    assert min(f["started_at"] for f in data["flags"]) == t(seeded, 0, 17)
    assert "data-flag='low_utilization'" not in page and page.count("data-flag='memory_underused'") == 3
    assert "CPU 380 % (main 98 %, 3 workers)" in report_text.text(data)
