"""A profiler trace asked of a flagged rank that allowed it: real rank processes using the in-job
client, a real agent on the fake NVML library, a real collector and PostgreSQL. The profiler in the
rank replays a real PyTorch profiler trace (from an A100 run; there is no GPU here) — the client, the
agent's socket, the summary, the batch, the store and the report are the product's own. The hostile
cases run the agent's own event socket and tracer against real client processes."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from jobpulse.agent.attribution import Attributor
from jobpulse.agent.capture.trace import Tracer
from jobpulse.agent.procfs import ProcFs
from jobpulse.agent.sources.app_events import EventListener
from jobpulse.schema import wire

from . import munge_daemon
from .agents import Scenario, spawn_rank, start_agent
from .conftest import RunningCollector, start_collector, stop_collector
from .test_captures import LOW
from .test_rules_live import RULES

TRACE = Path(__file__).parent / "data" / "traces" / "nccl_two_rank" / "rank-0.json.gz"
RANK = textwrap.dedent("""
    import shutil, sys, time
    from jobpulse.agent import client as jp

    class Replay:  # stands for torch.profiler where there is no GPU: what it writes is a real run's trace
        def start(self): pass
        def step(self): pass
        def stop(self, path):
            if sys.argv[2] == "garbage":
                open(path, "w").write("this is not a trace")
            else:
                shutil.copyfile(sys.argv[2], path)

    mode = sys.argv[1]
    if mode == "replay":
        jp.allow_traces(Replay())
    elif mode == "default":  # torch.profiler, which this environment does not have
        jp.allow_traces()
    elif mode == "exit":  # allows traces, then leaves before any step
        jp.allow_traces(Replay())
        time.sleep(1.5)
        sys.exit(0)
    i = 0
    while True:
        time.sleep(0.1)
        i += 1
        jp.step(i)
""")


def _traces(dsn: str) -> dict[str, dict[str, object]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT job_id, state, result, reason, trace, trace_bytes, steps, id"
                            " FROM jobpulse.flag_captures WHERE kind = 'trace'").fetchall()
    return {r[0]: {"state": r[1], "result": r[2], "reason": r[3], "trace": r[4], "bytes": r[5], "steps": r[6],
                   "id": r[7]} for r in rows}


@pytest.mark.skipif(munge_daemon.unavailable() is not None, reason=str(munge_daemon.unavailable()))
def test_a_flagged_rank_that_allowed_traces_answers_with_where_its_gpu_time_went(
        fake_nvml: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with munge_daemon.munged() as munge:
        _traced_job(fake_nvml, dsn, tmp_path, monkeypatch, munge)


def _traced_job(fake_nvml: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, munge: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1",
                                "--capture-seconds", "1", "--trace-steps", "3", "--munge-socket", str(munge))
    agent_dir = tmp_path / "a"
    monkeypatch.setenv("JOBPULSE_EVENTS_SOCKET", str(agent_dir / "events.sock"))
    ranks = {job: spawn_rank(job, 0, 0, command=[sys.executable, str(script), mode, str(TRACE)])
             for job, mode in (("9401", "replay"), ("9402", "default"), ("9403", "none"))}
    scenario = Scenario()
    for gpu, rank in enumerate(ranks.values()):
        scenario.gpu(gpu, f"GPU-t{gpu}", f"00000000:{16 + gpu:02x}:00.0", **LOW)
        scenario.add(f"proc 0 {gpu} {rank.pid} 20000 15 10")
    agent = start_agent(fake_nvml, scenario.write(tmp_path / "s.scn"), agent_dir, "n1",
                        collector=collector.url, token=collector.token)
    try:
        for gpu, job in enumerate(ranks):
            assert agent.control("register", job, "--uid", str(os.getuid()), "--gpus", str(gpu))["ok"]
        def flagged_jobs() -> set[str]:
            with psycopg.connect(dsn) as conn:
                return {r[0] for r in conn.execute("SELECT DISTINCT job_id FROM jobpulse.job_flags").fetchall()}

        deadline = time.monotonic() + 120
        while ({j for j, t in _traces(dsn).items() if t["state"] in ("done", "failed")} != {"9401", "9402"}
               or "9403" not in flagged_jobs()):  # 9403 registered last: its flag may come a cycle later
            assert time.monotonic() < deadline, (_traces(dsn), flagged_jobs(), agent.log.read_text()[-3000:])
            time.sleep(0.5)
        time.sleep(3)  # three more rule cycles (1 s each): 9403's flag would have asked for a trace by now
        traces = _traces(dsn)
        flagged = flagged_jobs()
        with psycopg.connect(dsn) as conn:
            (after_flag,) = conn.execute("SELECT extract(epoch FROM c.done_at - f.opened_at)::float8 FROM"
                                         " jobpulse.flag_captures c JOIN jobpulse.job_flags f ON f.id = c.flag_id"
                                         " WHERE c.job_id = '9401' AND c.kind = 'trace'").fetchone()
        report = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "9401", "--dsn", dsn],
                                capture_output=True, text=True, timeout=60)
        html = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "9401", "--dsn", dsn,
                               "--format", "html"], capture_output=True, text=True, timeout=60)
        backtest = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "rules", "backtest", "--dsn", dsn,
                                   "--rules", str(RULES), "--job", "9401", "--step", "2", "--from",
                                   (datetime.now(UTC) - timedelta(minutes=5)).isoformat(), "--to",
                                   datetime.now(UTC).isoformat()],
                                  capture_output=True, text=True, timeout=120)
        access = _access(collector, dsn, munge, int(traces["9401"]["id"]), tmp_path)  # type: ignore[call-overload]
        agent.end_jobs(*ranks)
    finally:
        for rank in ranks.values():
            rank.kill()
        agent.stop()
        stop_collector(collector)

    print(f"\nthe trace's summary was stored {after_flag:.1f} s after the flag was raised")
    assert after_flag < 60
    assert {"9401", "9402", "9403"} <= flagged
    assert "9403" not in traces, "a job that did not allow traces is not asked for one"
    mine = traces["9401"]
    assert mine["state"] == "done" and mine["steps"] == 3, mine
    assert bytes(mine["trace"]) == TRACE.read_bytes() and mine["bytes"] == TRACE.stat().st_size  # type: ignore[arg-type]
    summary = mine["result"]["summary"]  # type: ignore[index]
    assert summary["idle_percent"] == 77.78 and summary["overlap_percent"] == 14.31, summary  # HTA's figures
    assert "no profiler in this process: ModuleNotFoundError" in str(traces["9402"]["reason"])
    assert report.returncode == 0, report.stderr
    print(report.stdout[report.stdout.index("Flags:"):])
    assert f"trace (n1, capture {mine['id']}, 0.7 MiB kept):" in report.stdout
    assert "GPU idle 78% of 0.436 s (2 steps; of the streams' idle time 100% waiting on the host" in report.stdout
    assert "24% of kernel time in ncclKernel_AllReduce_RING_LL_Sum_float" in report.stdout
    assert "GPU idle 78%" in html.stdout
    assert access == {"admin": 200, "owner": 200, "owner, replayed": 401, "owner, for another capture": 401,
                      "another user": 403, "the job's new owner": 200, "no credential": 401, "no such capture": 404,
                      "cli": "ok"}, access
    assert backtest.returncode == 0, backtest.stderr
    assert "GPU idle 78% of 0.436 s" in backtest.stdout, backtest.stdout  # stored evidence beside the replay
    # The job's end summary (what its end mail carries) says where the GPU time went.
    for command in (["rules", "evaluate", "--rules", str(RULES)], ["summary", "9401"]):
        done = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", *command, "--dsn", dsn],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert "\n    trace: GPU idle 78% of 0.436 s" in done.stdout, done.stdout


def _access(collector: RunningCollector, dsn: str, munge: Path, capture: int, tmp_path: Path) -> dict[str, object]:
    """Who may read the stored trace: the admins (a bearer token) and the job's owner (MUNGE), nobody else."""
    url = f"/v1/captures/{capture}/trace"
    out: dict[str, object] = {}
    with collector.client() as admin, httpx.Client(base_url=collector.url, timeout=30) as anyone:
        got = admin.get(url)
        assert got.content == TRACE.read_bytes() and got.headers["content-type"] == "application/gzip"
        out["admin"] = got.status_code
        mine = munge_daemon.credential(munge, f"jobpulse trace {capture}")  # the job runs as this test's user
        out["owner"] = anyone.get(url, headers={"Authorization": mine}).status_code
        out["owner, replayed"] = anyone.get(url, headers={"Authorization": mine}).status_code
        other = munge_daemon.credential(munge, f"jobpulse trace {capture + 1}")
        out["owner, for another capture"] = anyone.get(url, headers={"Authorization": other}).status_code
        theirs = anyone.get(url, headers={"Authorization": munge_daemon.credential(munge, f"jobpulse trace {capture}",
                                                                                   "nobody")})
        assert "only its owner and the admins" in theirs.text
        out["another user"] = theirs.status_code
        with psycopg.connect(dsn, autocommit=True) as conn:  # were the job nobody's, nobody would read it
            conn.execute("UPDATE jobpulse.jobs SET uid = 65534 WHERE job_id = '9401'")
        out["the job's new owner"] = anyone.get(url, headers={"Authorization": munge_daemon.credential(
            munge, f"jobpulse trace {capture}", "nobody")}).status_code
        out["no credential"] = anyone.get(url).status_code
        out["no such capture"] = admin.get("/v1/captures/999999/trace").status_code
    cli = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "trace", str(capture), "--collector",
                          collector.url, "--munge-socket", str(munge), "-o", str(tmp_path / "mine.json.gz")],
                         capture_output=True, text=True, timeout=60)
    out["cli"] = "ok" if cli.returncode == 0 and (tmp_path / "mine.json.gz").read_bytes() == TRACE.read_bytes() \
        else cli.stderr
    return out


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Tracer, Path]]:
    """The agent's event socket and tracer, in this process, for jobs whose uid is ours."""
    attributor = Attributor(ProcFs(), lambda job: os.getuid())


    listener: list[EventListener] = []
    tracer = Tracer("n1", attributor.job_of, lambda address, data: listener[0].send_to(address, data))
    listener.append(EventListener(tmp_path / "events.sock", attributor, lambda _: None, lambda _r, _n: None,
                                  on_trace=tracer.on_message))
    listener[0].start()
    monkeypatch.setenv("JOBPULSE_EVENTS_SOCKET", str(tmp_path / "events.sock"))
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    try:
        yield tracer, script
    finally:
        listener[0].close()


def _ready(tracer: Tracer, pid: int) -> None:
    deadline = time.monotonic() + 10
    while pid not in tracer._clients:
        assert time.monotonic() < deadline, "the client never said it allows traces"
        time.sleep(0.05)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_what_goes_wrong_in_a_trace_capture_is_answered_with_why(node: tuple[Tracer, Path], tmp_path: Path) -> None:
    tracer, script = node
    fds = _open_fds()

    def capture(pid: int, job: str = "9501", seconds: float = 5, max_bytes: int = 2**20) -> wire.CaptureResult:
        return tracer.run(wire.Capture(id=pid, job_id=job, pids=[pid], seconds=seconds, kind="trace", steps=2,
                                       max_bytes=max_bytes))

    def rank(mode: str, trace: Path = TRACE, job: str = "9501") -> subprocess.Popen[bytes]:
        proc = spawn_rank(job, 0, 0, command=[sys.executable, str(script), mode, str(trace)])
        if mode != "none":
            _ready(tracer, proc.pid)
        return proc

    procs = []
    try:
        ok = rank("replay")
        procs.append(ok)
        small = capture(ok.pid, max_bytes=1000)  # over the collector's cap: the summary, not the trace
        assert small.ok and small.summary is not None and small.trace is None and "over the collector's" in small.reason
        assert capture(ok.pid, job="9599").reason.startswith("no process of this rank allowed traces")  # not its job
        gone = rank("exit")
        procs.append(gone)
        assert capture(gone.pid, seconds=4).reason == f"process {gone.pid} exited before its trace was taken"
        quiet = rank("none")  # no allow_traces(): never asked
        procs.append(quiet)
        assert "allowed traces" in capture(quiet.pid, seconds=1).reason
        garbage = rank("replay", trace=Path("garbage"))  # its profiler writes something that is not a trace
        procs.append(garbage)
        assert capture(garbage.pid).reason.startswith(f"process {garbage.pid}'s trace: not a profiler trace")
        huge = tmp_path / "huge.json.gz"
        huge.write_bytes(gzip.compress(b'{"traceEvents": [' + b'{"ph": "i"},' * 200_000 + b'{}]}'))
        big = rank("replay", trace=huge)
        procs.append(big)
        assert "no GPU kernels" in capture(big.pid).reason  # read and judged, bounded, never kept as a trace
        # A trace nobody asked for (a job sending a file of its own accord) is closed unread.
        unsolicited = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import os
            from jobpulse.agent import client as jp
            jp.allow_traces()
            fd = os.open({str(TRACE)!r}, os.O_RDONLY)
            assert jp._sender.send_file(jp._message("trace_done", "x", "info", "trace", {{"id": 424242}}), fd)
            """)], env={**os.environ, "SLURM_JOB_ID": "9501", "SLURM_PROCID": "0"}, timeout=30)
        assert unsolicited.returncode == 0
        time.sleep(0.5)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert _open_fds() == fds, "every file a client passed was closed"


def _seconds_without_a_sample(dsn: str, gpu: str, since: datetime) -> tuple[int, int]:
    """(whole seconds from ``since`` to the last sample with no GPU sample, samples) of one GPU."""
    with psycopg.connect(dsn) as conn:
        secs = [r[0] for r in conn.execute(
            "SELECT DISTINCT floor(extract(epoch FROM ts))::bigint FROM jobpulse.gpu_samples"
            " WHERE gpu_uuid = %s AND ts >= %s ORDER BY 1", (gpu, since)).fetchall()]
    return (secs[-1] - secs[0] + 1 - len(secs), len(secs)) if secs else (0, 0)


def test_a_trace_gzip_bomb_costs_the_agent_neither_memory_nor_a_gpu_sample(
        fake_nvml: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hole: a rank that allowed traces handed over, through the normal path, 32 KB of gzip unpacking to
    32 MiB of `{"traceEvents": [{},{},...]}`; summarizing it in the agent took 1.7 GiB and 7 of 8 seconds
    of GPU samples. Now the summary is made in a bounded child: the capture fails with why, the agent's
    memory stays flat and the sampler never misses a second."""
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [' + b"{}," * (11 * 2**20) + b"{}]}")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1",
                                "--capture-seconds", "1", "--trace-steps", "3")
    agent_dir = tmp_path / "a"
    monkeypatch.setenv("JOBPULSE_EVENTS_SOCKET", str(agent_dir / "events.sock"))
    rank = spawn_rank("9411", 0, 0, command=[sys.executable, str(script), "replay", str(bomb)])
    scenario = Scenario().gpu(0, "GPU-bomb", "00000000:16:00.0", **LOW).add(f"proc 0 0 {rank.pid} 20000 15 10")
    agent = start_agent(fake_nvml, scenario.write(tmp_path / "s.scn"), agent_dir, "n1",
                        collector=collector.url, token=collector.token)
    since = datetime.now(UTC)
    try:
        assert agent.control("register", "9411", "--uid", str(os.getuid()), "--gpus", "0")["ok"]
        deadline = time.monotonic() + 120
        while _traces(dsn).get("9411", {}).get("state") not in ("done", "failed"):
            assert time.monotonic() < deadline, (_traces(dsn), agent.log.read_text()[-3000:])
            time.sleep(0.5)
        time.sleep(2)  # the samples taken while the child worked have reached the database
        status = Path(f"/proc/{agent.proc.pid}/status").read_text()
        peak_mib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024
        gaps, seconds = _seconds_without_a_sample(dsn, "GPU-bomb", since)
    finally:
        rank.kill()
        agent.stop()
        stop_collector(collector)
    capture = _traces(dsn)["9411"]
    print(f"\ngzip bomb ({bomb.stat().st_size} bytes, 33 MiB unpacked): {capture['reason']!r}; agent peak RSS "
          f"{peak_mib:.0f} MiB; {gaps} of {seconds} seconds without a GPU sample")
    # The child hits its memory ceiling; at the lowest priority on a machine whose cores are busy (a full
    # suite) it may hit its wall-clock bound first: either is the bound refusing the bomb.
    assert capture["state"] == "failed" and re.search(r"needs more memory|took over \d+ s", str(capture["reason"])), capture
    assert peak_mib <= 200 and gaps == 0
