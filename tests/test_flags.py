"""The flag lifecycle in PostgreSQL: a hit opens a flag, later hits refresh the same row, and a
flag of a running job closes only once it has not been hit for the hold time (hysteresis); a sick
GPU no job holds gets a node flag."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psycopg

from jobpulse.collector.grafana import provisioning
from jobpulse.collector.rules.registry import cause_of
from jobpulse.collector.store.state import flags
from jobpulse.collector.store.state.flags import Hit
from jobpulse.schema import wire

from .conftest import RunningCollector


def test_a_flickering_condition_stays_one_flag(dsn: str) -> None:
    hit = Hit("input_bound", "warning", "code", "gpu", "n1/GPU-x", datetime.now(UTC), {"pattern": "stalls"},
              "use more workers")
    key = ("c", "1")
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, start_time) VALUES ('c', '1', now())")
        conn.commit()
        hold = timedelta(minutes=2)
        for found in ([hit], [], [hit], []):  # the condition flickers from cycle to cycle
            flags.write(conn, {key: found}, datetime.now(UTC), hold, cause_of)
        rows = conn.execute("SELECT ended_at IS NULL, last_seen FROM jobpulse.job_flags").fetchall()
        assert len(rows) == 1 and rows[0][0], "one flag, still open within the hold time"
        kept, closed = flags.write(conn, {key: []}, datetime.now(UTC), timedelta(0), cause_of)
        ended, last_seen = conn.execute("SELECT ended_at, last_seen FROM jobpulse.job_flags").fetchone()
    assert (kept, closed) == (0, 1) and ended == last_seen, "closed at its last hit, not at the cycle"


def test_one_flag_per_cause_and_place_for_the_life_of_a_job(dsn: str) -> None:
    """A GPU whose use goes from low to idle, eases, stops and comes back (hours of noise on a
    real recording) keeps one flag: its kind and evidence change in place, and a closed flag of the
    same cause reopens instead of a second one. Another cause on the same GPU is a flag of its own."""
    onset = datetime.now(UTC) - timedelta(hours=2)

    def hit(rule: str, where: str = "n1/GPU-x") -> Hit:
        return Hit(rule, "warning", "code" if rule != "hw_throttling" else "hardware", "gpu", where, onset,
                   {"rule": rule}, f"advice of {rule}")

    key = ("c", "2")
    cycles = [[hit("low_utilization")], [hit("idle_gpu")], [], [hit("imbalance"), hit("hw_throttling")], [],
              [hit("low_utilization", "n1/GPU-y")], [hit("idle_gpu")]]
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, start_time) VALUES ('c', '2', now())")
        conn.commit()
        for found in cycles:
            flags.write(conn, {key: found}, datetime.now(UTC), timedelta(0), cause_of)  # no hold: every gap closes
        rows = conn.execute("SELECT scope_key, rule_id, ended_at IS NULL, started_at, advice FROM jobpulse.job_flags"
                            " ORDER BY id").fetchall()
    assert [r[:3] for r in rows] == [("n1/GPU-x", "idle_gpu", True), ("n1/GPU-x", "hw_throttling", False),
                                     ("n1/GPU-y", "low_utilization", False)]
    assert rows[0][3] == onset and rows[0][4] == "advice of idle_gpu", "the first onset, the latest kind's advice"


def test_a_job_wide_flag_takes_over_the_per_gpu_flags_of_its_cause(dsn: str) -> None:
    """GPUs 0 and 1 of four are flagged low one cycle before all four are: the job-wide flag that forms
    is GPU 0's flag (its id, so its notice stays the one told), GPU 1's is gone, and a flag of another
    cause on GPU 1 stays; a later job-wide hit of a kind of the same cause keeps that one flag."""
    onset = datetime.now(UTC) - timedelta(minutes=20)
    keys = [f"n1/GPU-{i}" for i in range(4)]

    def hit(rule: str, scope: str, where: str, gpus: list[str] | None = None) -> Hit:
        return Hit(rule, "warning", "code", scope, where, onset, {"gpus": gpus} if gpus else {}, f"advice of {rule}")

    key = ("c", "3")
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, start_time) VALUES ('c', '3', now())")
        conn.commit()
        hold = timedelta(minutes=2)
        flags.write(conn, {key: [hit("low_utilization", "gpu", keys[0]), hit("low_utilization", "gpu", keys[1]),
                                 hit("no_tensor_cores", "gpu", keys[1])]}, datetime.now(UTC), hold, cause_of)
        first = conn.execute("SELECT id FROM jobpulse.job_flags WHERE scope_key = %s", (keys[0],)).fetchone()
        conn.execute("INSERT INTO jobpulse.notifications (flag_id, channel, url, format)"
                     " VALUES (%s, 'ops', 'http://x', 'json')", first)
        conn.commit()
        for rule in ("low_utilization", "idle_gpu"):
            flags.write(conn, {key: [hit(rule, "job", "", keys), hit("no_tensor_cores", "gpu", keys[1])]},
                        datetime.now(UTC), hold, cause_of)
        rows = conn.execute("SELECT id, rule_id, scope, scope_key, ended_at IS NULL, started_at"
                            " FROM jobpulse.job_flags WHERE job_id = '3' ORDER BY id").fetchall()
        told = conn.execute("SELECT flag_id FROM jobpulse.notifications").fetchall()
    assert [r[1:5] for r in rows] == [("idle_gpu", "job", "", True), ("no_tensor_cores", "gpu", keys[1], True)]
    assert rows[0][0] == first[0] and rows[0][5] == onset and told == [first]


def test_a_sick_gpu_no_job_holds_raises_a_node_flag_and_the_hardware_alert(collector: RunningCollector,
                                                                           dsn: str) -> None:
    """An XID and uncorrectable ECC errors on a GPU between jobs: no job to flag, so the node is, and
    the admins' "hardware trouble" alert query sees it."""
    now = datetime.now(UTC).replace(microsecond=0)
    agent = wire.AgentInfo(instance="nf-1", node="spare1", cluster="nf", version="0.1.0", started_at=now)
    samples = [wire.GpuSample(ts=now - timedelta(seconds=s), gpu_uuid=uuid, gpu_index=i, sm_util=0,
                              fb_used_mib=0, fb_total_mib=81_559, ecc_dbe_total=(3 if s < 60 and i == 0 else 0))
               for s in range(180) for i, uuid in enumerate(("GPU-sick", "GPU-fine"))]
    xid = wire.HealthEvent(ts=now - timedelta(seconds=30), kind="xid", gpu_uuid="GPU-sick", code=79,
                           message="XID 79")
    batch = wire.Batch(version=1, agent=agent, seq=0, created_at=now, gpu_samples=samples, health_events=[xid])
    with collector.client() as http:
        assert http.post("/v1/batches", content=wire.encode(batch)).status_code == 200
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "rules", "evaluate", "--dsn", dsn],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT rule_id, scope_key, category, evidence FROM jobpulse.node_flags"
                            " WHERE cluster = 'nf' AND ended_at IS NULL").fetchall()
        alert = next(a for a in provisioning.ALERTS if a["uid"] == "jobpulse-hardware")
        alerted = conn.execute(alert["sql"]).fetchall()
    # One cause, one flag: the XID explains the ECC counter it reports.
    assert [(r, k, c) for r, k, c, _ in rows] == [("xid_error", "spare1/GPU-sick", "hardware")]
    assert rows[0][3]["xids"] == [79]
    assert ("nf", "spare1", "xid_error", "critical", "hardware", 1) in alerted
    print(f"\nnode flags: {out.stdout.strip()}")
