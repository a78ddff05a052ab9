"""`jobpulse rules backtest` replays stored history through the live rules at a simulated clock:
a GPU that went idle is flagged once its idle run reached the threshold, a healthy job never is,
and the replay reads nothing from after its clock."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from jobpulse.schema import wire

from .conftest import RunningCollector

MINUTES = 40
ONSET = 10  # minute at which GPU-b1 of job 7001 goes idle for good


def seed(c: RunningCollector, start: datetime | None = None) -> datetime:
    start = start or (datetime.now(UTC) - timedelta(minutes=MINUTES + 5)).replace(second=0, microsecond=0)
    agent = wire.AgentInfo(instance="bt-1", node="n1", cluster="bt", version="0.1.0", started_at=start)
    jobs = [wire.JobRecord(job_id="7001", user_name="ann", partition="gpu", gpus_total=2, start_time=start,
                           state="RUNNING", gpus=[wire.JobGpu("GPU-a1", 0), wire.JobGpu("GPU-b1", 1)]),
            wire.JobRecord(job_id="7002", user_name="ben", partition="gpu", gpus_total=1, start_time=start,
                           state="RUNNING", gpus=[wire.JobGpu("GPU-c1", 2)])]
    with c.client() as http:
        for minute in range(MINUTES):
            samples = []
            for s in range(60):
                ts = start + timedelta(minutes=minute, seconds=s)
                for i, (uuid, job, busy) in enumerate((("GPU-a1", "7001", True), ("GPU-b1", "7001", minute < ONSET),
                                                       ("GPU-c1", "7002", True))):
                    samples.append(wire.GpuSample(
                        ts=ts, gpu_uuid=uuid, gpu_index=i, job_id=job, sm_util=95 if busy else 0,
                        gpm_sm_active=85.0 if busy else 0.0, gpm_tensor_active=40.0 if busy else 0.0,
                        fb_used_mib=40_000, fb_total_mib=81_559, power_w=500.0 if busy else 70.0))
            batch = wire.Batch(version=1, agent=agent, seq=minute, created_at=start + timedelta(minutes=minute + 1),
                               gpu_samples=samples, jobs=jobs if minute == 0 else [])
            r = http.post("/v1/batches", content=wire.encode(batch))
            assert r.status_code == 200, r.text
    return start


def backtest(dsn: str, start: datetime, end: datetime, *extra: str) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "rules", "backtest", "--dsn", dsn,
                          "--from", start.isoformat(), "--to", end.isoformat(), "--step", "30", "--cluster", "bt",
                          *extra], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if "--format" in extra else {"text": out.stdout}


def test_backtest_flags_the_idle_gpu_when_its_run_reaches_the_threshold(collector: RunningCollector,
                                                                        dsn: str) -> None:
    start = seed(collector)
    end = start + timedelta(minutes=MINUTES)
    got = backtest(dsn, start, end, "--format", "json")["replayed"]
    by_rule = {(f["job_id"], f["rule_id"], f["scope_key"]): f for f in got}
    assert not [f for f in got if f["job_id"] == "7002"], "the healthy job raises nothing"
    idle = by_rule[("7001", "idle_gpu", "n1/GPU-b1")]
    onset = start + timedelta(minutes=ONSET)
    raised = datetime.fromisoformat(idle["raised_at"])
    # Sufficient evidence at onset + idle_minutes (10, the default); one 30 s cycle and one 10 s
    # roll-up bucket of slack.
    assert onset + timedelta(minutes=10) <= raised <= onset + timedelta(minutes=10, seconds=45), raised - onset
    assert abs(datetime.fromisoformat(idle["started_at"]) - onset) <= timedelta(seconds=10)
    assert idle["closed_at"] is None and idle["evidence"]["idle_minutes"] >= 19
    print(f"\nbacktest: idle GPU flagged {(raised - onset).total_seconds() - 600:.0f} s after its idle run "
          f"reached 10 min; flags {sorted(k[1] for k in by_rule)}")
    # The replay stops at its clock: up to minute 15, nothing about the idling yet.
    early = backtest(dsn, start, start + timedelta(minutes=15), "--format", "json")["replayed"]
    assert not [f for f in early if f["rule_id"] == "idle_gpu"]
    # Text for admins: one line per flag, and whether the live rules raised it too.
    text = backtest(dsn, start, end)["text"]
    assert "idle_gpu" in text and "n1/GPU-b1" in text and "would have been raised" in text
    print(text)


def test_backtest_refuses_a_bad_range(dsn: str) -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    r = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "rules", "backtest", "--dsn", dsn,
                        "--from", t.isoformat(), "--to", (t - timedelta(hours=1)).isoformat()],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--to must be after --from" in r.stderr
    r = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "rules", "backtest", "--dsn", dsn,
                        "--from", "2026-01-01T00:00:00", "--to", "2026-01-02T00:00:00+00:00"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "UTC offset" in r.stderr
