"""Evidence for a flag, asked of the job while it runs: a real rank whose main process spends its time
decoding in pure Python, a real agent on the fake NVML library, a real collector running its rules,
real PostgreSQL and real py-spy. The flag fires, the collector asks the rank's node for its stacks in
the answer to a batch, the agent samples them and the report names the slow function; a process that
is not Python, a job that opted out and a forged answer each get what they should."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from jobpulse.agent.capture.stacks import Capturer, parse_raw, py_spy, top_paths
from jobpulse.agent.shipping.batch import Batcher
from jobpulse.schema import wire

from .agents import Scenario, spawn_rank, start_agent
from .conftest import start_collector, stop_collector
from .test_rules_live import BUSY, RULES

LOW = {**BUSY, "sm": 15, "gpm_sm": 12}  # a starved GPU: low_utilization, whatever its rank's CPU
SLOW_LOADER = textwrap.dedent("""
    import time
    def decode_jpeg(blob):
        out = 0
        for ch in blob:
            out = (out * 31 + ord(ch)) % 1000003
        return out
    def next_batch():
        return decode_jpeg("x" * 20000)
    while True:  # about half a core: decoding, then a pause
        started = time.monotonic()
        while time.monotonic() - started < 0.01:
            next_batch()
        time.sleep(0.01)
""")
needs_py_spy = pytest.mark.skipif(py_spy() is None, reason="py-spy is installed by `make setup` (the agent extra)")


def _captures(dsn: str) -> dict[str, dict[str, object]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT job_id, state, pids, result, reason FROM jobpulse.flag_captures").fetchall()
    return {r[0]: {"state": r[1], "pids": r[2], "result": r[3], "reason": r[4]} for r in rows}


@needs_py_spy
def test_a_flagged_rank_s_stacks_name_its_slow_function(fake_nvml: Path, dsn: str, tmp_path: Path) -> None:
    loader = tmp_path / "loader.py"
    loader.write_text(SLOW_LOADER)
    main = spawn_rank("9301", 0, 0, command=[sys.executable, str(loader)])
    worker = spawn_rank("9301", 0, 0)  # `sleep`: a process of the rank that is not Python
    other = spawn_rank("9302", 0, 0)  # opted out: never sampled, so it need not spend a CPU decoding
    scenario = (Scenario().gpu(0, "GPU-c0", "00000000:10:00.0", **LOW).gpu(1, "GPU-c1", "00000000:11:00.0", **LOW)
                .add(f"proc 0 0 {main.pid} 20000 15 10").add(f"proc 0 1 {other.pid} 20000 15 10"))
    collector = agent = None
    uid = str(os.getuid())
    try:  # the ranks run from here on: whatever fails to start next, they are killed
        collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1",
                                    "--capture-seconds", "2")
        agent = start_agent(fake_nvml, scenario.write(tmp_path / "s.scn"), tmp_path / "a", "n1",
                            collector=collector.url, token=collector.token)
        # Job 9302 opted out (`capture=off` in its comment reaches the collector as a tag).
        opt_out = wire.Batch(version=1, agent=wire.AgentInfo(instance="prolog-n1", node="n1", cluster="testcluster",
                                                             version="0", started_at=datetime.now(UTC)),
                             seq=0, created_at=datetime.now(UTC),
                             jobs=[wire.JobRecord(job_id="9302", tags={"capture": "off"})])
        with collector.client() as http:
            assert http.post("/v1/batches", content=wire.encode(opt_out)).status_code == 200
        for job, gpu in (("9301", "0"), ("9302", "1")):
            assert agent.control("register", job, "--uid", uid, "--gpus", gpu, "--partition", "gpu")["ok"]
        deadline = time.monotonic() + 90

        def flagged_jobs() -> set[str]:
            with psycopg.connect(dsn) as conn:
                return {r[0] for r in conn.execute("SELECT job_id FROM jobpulse.job_flags WHERE rule_id IN"
                                                   " ('low_utilization', 'input_bound')").fetchall()}
        # Each job's flag in its own cycle (9302 registered after 9301), and 9301's capture answered.
        while (_captures(dsn).get("9301", {}).get("state") not in ("done", "failed")
               or flagged_jobs() != {"9301", "9302"}):
            assert time.monotonic() < deadline, (_captures(dsn), flagged_jobs(), agent.log.read_text()[-2000:])
            time.sleep(0.5)
        flagged = flagged_jobs()
        report = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "9301", "--dsn", dsn],
                                capture_output=True, text=True, timeout=60)
        html = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "9301", "--dsn", dsn,
                               "--format", "html"], capture_output=True, text=True, timeout=60)
        captured = _captures(dsn)
        with psycopg.connect(dsn) as conn:  # from the rule cycle that raised the flag to its evidence stored
            (after_flag,) = conn.execute("SELECT extract(epoch FROM c.done_at - f.opened_at)::float8 FROM"
                                         " jobpulse.flag_captures c JOIN jobpulse.job_flags f ON f.id = c.flag_id"
                                         " WHERE c.job_id = '9301'").fetchone()
        # An answer for this capture from another node's batch changes nothing.
        forged = wire.Batch(version=1, agent=wire.AgentInfo(instance="forger", node="n9", cluster="testcluster",
                                                            version="0", started_at=datetime.now(UTC)),
                            seq=0, created_at=datetime.now(UTC),
                            captures=[wire.CaptureResult(id=1, job_id="9301", ok=False, reason="forged")])
        with collector.client() as http:
            assert http.post("/v1/batches", content=wire.encode(forged)).status_code == 200
        agent.end_jobs("9301", "9302")
    finally:
        for p in (main, worker, other):
            p.kill()
        if agent is not None:
            agent.stop()
        stop_collector(collector)

    print(f"\nthe stacks were stored {after_flag:.1f} s after the flag was raised (2 s of sampling)")
    assert after_flag < 60
    assert flagged == {"9301", "9302"}
    assert "9302" not in captured, "a job that opted out is not sampled"
    mine = captured["9301"]
    assert mine["state"] == "done", mine
    assert mine["pids"] == [main.pid, worker.pid]  # the GPU's process first, then the rank's others
    result = mine["result"]
    assert isinstance(result, dict) and result["samples"]["main"] > 20
    top = result["top"][0]
    assert top["role"] == "main" and "decode_jpeg" in top["frames"] and top["share"] > 0.5, result
    assert f"process {worker.pid} is not a Python process" in str(mine["reason"])
    assert report.returncode == 0, report.stderr
    print(report.stdout[report.stdout.index("Flags:"):])
    # The seconds it sampled: 2 asked, 3 when a loaded machine starts py-spy late (as CI's once did).
    assert re.search(r"stacks \([23] s on n1", report.stdout) and "of the main process's time in" in report.stdout
    assert "decode_jpeg (loader.py)" in report.stdout, report.stdout
    assert "decode_jpeg" in html.stdout and "class='stacks'" in html.stdout
    assert _captures(dsn)["9301"] == captured["9301"]  # the forged answer was not taken
    # The job's end summary (what its end mail carries) names it too.
    evaluated = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "rules", "evaluate", "--dsn", dsn,
                                "--rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert evaluated.returncode == 0, evaluated.stderr
    summary = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "summary", "9301", "--dsn", dsn],
                             capture_output=True, text=True, timeout=60)
    assert re.search(r"\n    stacks: \d+% of the main process.s time in .*decode_jpeg \(loader.py\)", summary.stdout), \
        summary.stdout


def test_the_stacks_summary_is_by_leaf_and_caller() -> None:
    raw = ("<module> (train.py);main (train.py);next_batch (data.py);decode (img.py) 60\n"
           "<module> (train.py);main (train.py);step (train.py);synchronize (torch/cuda.py) 30\n"
           "<module> (train.py);main (train.py);log (train.py) 3\n"
           "garbage line\n")
    stacks = parse_raw(raw)
    assert sum(stacks.values()) == 93
    top = top_paths("main", stacks)
    assert [s.frames for s in top] == ["next_batch (data.py) > decode (img.py)",
                                       "step (train.py) > synchronize (torch/cuda.py)"]  # 3 % is left out
    assert [s.share for s in top] == [pytest.approx(60 / 93, abs=0.001), pytest.approx(30 / 93, abs=0.001)]


def _capture(pids: list[int], seconds: float = 1.0) -> wire.Capture:
    return wire.Capture(id=7, job_id="42", pids=pids, seconds=seconds)


@needs_py_spy
def test_a_capture_says_why_it_found_nothing(tmp_path: Path) -> None:
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        answers: list[wire.CaptureResult] = []
        mine = Capturer("n1", lambda pid: "42", answers.append)
        gone = mine.run(_capture([quick.pid], seconds=3))  # exits mid-capture
        assert f"process {quick.pid} exited during the capture" in gone.reason  # what it sampled before stays
        missing = Capturer("n1", lambda pid: "42", answers.append, binary=None)
        missing.binary = None
        assert "py-spy is not installed on node n1" in missing.run(_capture([os.getpid()])).reason
        stranger = Capturer("n1", lambda pid: "43", answers.append).run(_capture([os.getpid()]))
        assert not stranger.ok and "belongs to job 42" in stranger.reason  # never another job's process
        # The agent's own say, whatever the collector asks: the node's --no-capture, the job's capture=off.
        opted_out = Capturer("n1", lambda pid: "42", answers.append, lambda job: f"job {job} opted out")
        assert opted_out.run(_capture([os.getpid()])).reason == "job 42 opted out"
    finally:
        quick.kill()


def test_answers_beyond_what_a_batch_may_carry_wait_for_the_next() -> None:
    batcher = Batcher("n1", "c1")
    batcher.add("captures", [wire.CaptureResult(id=i + 1, job_id="42", ok=False, reason="x") for i in range(20)])
    first, second = batcher.take(), batcher.take()
    assert first is not None and second is not None
    assert [c.id for c in first.batch.captures] == list(range(1, 17))
    assert [c.id for c in second.batch.captures] == [17, 18, 19, 20] and batcher.take() is None
