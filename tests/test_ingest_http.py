"""A real collector process over HTTP into real PostgreSQL: round trip, dedupe, bad input."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest

from jobpulse.schema import wire

from .batches import as_dict, full_batch, gpu_batch, now
from .conftest import RunningCollector, Shared

TABLES = ["gpu_samples", "process_samples", "gpu_health_events", "events", "topology", "jobs", "job_gpus",
          "ingest_batches"]


def counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM jobpulse.{t}").fetchone()[0] for t in TABLES}


def post(c: RunningCollector, body: bytes | dict[str, Any], **headers: str) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with c.client() as http:
        return http.post("/v1/batches", content=data, headers={"Content-Type": "application/json", **headers})


def test_round_trip_into_every_table(collector: RunningCollector, dsn: str) -> None:
    batch = full_batch()
    r = post(collector, gzip.compress(wire.encode(batch)), **{"Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "stored"
    assert counts(dsn) == {"gpu_samples": 2, "process_samples": 1, "gpu_health_events": 1, "events": 1,
                           "topology": 2, "jobs": 1, "job_gpus": 2, "ingest_batches": 1}
    with psycopg.connect(dsn) as conn:
        # Every GPU field arrives with its value (no column silently NULL or shifted).
        cols = [f for f in wire.GpuSample.__struct_fields__]
        row = conn.execute(f"SELECT cluster, node, {', '.join(cols)} FROM jobpulse.gpu_samples"
                           " WHERE gpu_uuid = 'GPU-0000'").fetchone()
        sent = batch.gpu_samples[0]
        assert row[:2] == ("testcluster", "n1")
        for name, value in zip(cols, row[2:]):
            expected = getattr(sent, name)
            assert value is not None, name
            assert value == (pytest.approx(expected) if isinstance(expected, float) else expected), name
        proc = conn.execute("SELECT pid, job_id, step, rank, local_rank, gpu_mem_mib, cpu_percent, command"
                            " FROM jobpulse.process_samples").fetchone()
        assert proc == (4242, "1001", "0", 3, 1, 39_000, pytest.approx(180.5), "python")
        ev = conn.execute("SELECT ts, job_id, rank, pid, level, kind, name, message, attrs FROM jobpulse.events").fetchone()
        assert ev[0] == batch.events[0].ts and ev[1:8] == ("1001", 3, 4242, "info", "phase_start", "epoch",
                                                           "epoch 4 started")
        assert ev[8] == {"epoch": 4, "nested": {"lr": 0.001}}
        assert conn.execute("SELECT kind, code, gpu_uuid FROM jobpulse.gpu_health_events").fetchone() == (
            "xid", 79, "GPU-0001")
        assert conn.execute("SELECT links, nvlinks_up FROM jobpulse.topology WHERE gpu_uuid = 'GPU-0000'"
                            ).fetchone() == ({"GPU-0001": "NV18"}, 18)
        job = conn.execute("SELECT user_name, account, partition, nodes, gpus_total, state, tags, end_time"
                           " FROM jobpulse.jobs").fetchone()
        assert job == ("alice", "ml", "gpu", ["n1", "n2"], 4, "RUNNING", {"project": "llm"}, None)
        assert conn.execute("SELECT array_agg(gpu_uuid ORDER BY gpu_index) FROM jobpulse.job_gpus").fetchone()[0] == [
            "GPU-0000", "GPU-0001"]


def _flag_rules(dsn: str, job_id: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute("SELECT rule_id FROM jobpulse.job_flags WHERE job_id = %s", (job_id,))}


def test_job_end_updates_without_erasing(collector: RunningCollector, dsn: str) -> None:
    assert post(collector, wire.encode(full_batch(seq=0))).status_code == 200
    end = wire.Batch(version=1, agent=full_batch().agent, seq=1, created_at=now(), jobs=[
        wire.JobRecord(job_id="1001", end_time=now(), state="COMPLETED", exit_code=0, tags={"phase": "done"})])
    assert post(collector, wire.encode(end)).status_code == 200
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT user_name, state, exit_code, end_time IS NOT NULL, tags FROM jobpulse.jobs").fetchone()
    assert row == ("alice", "COMPLETED", 0, True, {"project": "llm", "phase": "done"})
    with collector.client() as http:
        assert http.get("/v1/jobs", params={"state": "running"}).json() == []
        ended = http.get("/v1/jobs", params={"state": "ended"}).json()
        assert [j["job_id"] for j in ended] == ["1001"]
        # The batch's Xid 79 earns a flag if a rule cycle ran while the job did (the leader's timing):
        # the detail lists the job's stored flags, those stored before the request and after it.
        before = _flag_rules(dsn, "1001")
        one = http.get("/v1/jobs/1001").json()
        assert one["state"] == "COMPLETED" and len(one["gpus"]) == 2
        assert before <= {f["rule_id"] for f in one["flags"]} <= _flag_rules(dsn, "1001") <= {"xid_error"}
        assert http.get("/v1/jobs/999").status_code == 404
        assert http.get("/v1/jobs", params={"limit": "0"}).status_code == 422


def test_duplicate_batch_is_acknowledged_and_stored_once(collector: RunningCollector, dsn: str) -> None:
    body = wire.encode(full_batch(seq=7))
    first, second = post(collector, body), post(collector, gzip.compress(body), **{"Content-Encoding": "gzip"})
    assert (first.status_code, first.json()["status"]) == (200, "stored")
    assert (second.status_code, second.json()["status"]) == (200, "duplicate")
    assert counts(dsn)["gpu_samples"] == 2 and counts(dsn)["ingest_batches"] == 1
    # Same seq from another agent instance is a different batch.
    other = full_batch(seq=7, agent=wire.AgentInfo("inst-2", "n2", "testcluster", "0.1.0", now()))
    assert post(collector, wire.encode(other)).json()["status"] == "stored"
    assert counts(dsn)["gpu_samples"] == 4


def _bad_inputs() -> list[tuple[str, int, bytes, dict[str, str], str | None]]:
    good = as_dict(full_batch())

    def mutate(fn: Any) -> bytes:
        d = json.loads(json.dumps(good))
        fn(d)
        return json.dumps(d).encode()

    future = (now() + timedelta(hours=2)).isoformat()
    ancient = (now() - timedelta(days=400)).isoformat()
    return [
        ("malformed json", 400, b'{"version": 1, "agent": ', {}, None),
        ("not utf-8", 400, json.dumps(good).replace("epoch 4 started", "\udcff").encode("utf-8", "surrogateescape"),
         {}, None),
        ("wrong type", 422, mutate(lambda d: d["gpu_samples"][0].__setitem__("sm_util", "high")), {},
         "$.gpu_samples[0].sm_util"),
        ("out of range", 422, mutate(lambda d: d["gpu_samples"][1].__setitem__("sm_util", 101)), {},
         "$.gpu_samples[1].sm_util"),
        ("missing field", 422, mutate(lambda d: d["process_samples"][0].pop("pid")), {}, None),
        ("naive timestamp", 422, mutate(lambda d: d["events"][0].__setitem__("ts", "2026-01-01T00:00:00")), {},
         "$.events[0].ts"),
        ("unknown version", 422, mutate(lambda d: d.__setitem__("version", 99)), {}, "$.version"),
        ("future timestamp", 422, mutate(lambda d: d["gpu_samples"][0].__setitem__("ts", future)), {},
         "$.gpu_samples[0].ts"),
        ("older than retention", 422, mutate(lambda d: d["health_events"][0].__setitem__("ts", ancient)), {},
         "$.health_events[0].ts"),
        ("NUL in text", 422, mutate(lambda d: d["events"][0].__setitem__("message", "a\u0000b")), {}, None),
        ("bad job id", 422, mutate(lambda d: d["jobs"][0].__setitem__("job_id", "abc; drop")), {},
         "$.jobs[0].job_id"),
        ("too big", 413, b"[" + b"1," * 1_100_000 + b"1]", {}, None),
        ("gzip bomb", 413, gzip.compress(b" " * 3 * 1024 * 1024), {"Content-Encoding": "gzip"}, None),
        ("bad gzip", 400, b"not gzip at all", {"Content-Encoding": "gzip"}, "Content-Encoding"),
        ("wrong content type", 415, wire.encode(full_batch()), {"Content-Type": "text/plain"}, "Content-Type"),
    ]


@pytest.mark.parametrize("name,status,body,headers,field", _bad_inputs(), ids=[b[0] for b in _bad_inputs()])
def test_bad_input_gets_4xx_and_stores_nothing(shared_collector: Shared, name: str, status: int, body: bytes,
                                                headers: dict[str, str], field: str | None) -> None:
    collector, dsn = shared_collector.collector, shared_collector.dsn
    r = post(collector, body, **headers)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["error"]
    if field:
        assert err["field"] == field
    assert set(counts(dsn).values()) == {0}


@pytest.mark.parametrize("auth", [None, "Bearer wrong-token", "Basic dGVzdA==", "Bearer"])
def test_missing_or_wrong_token_is_401(shared_collector: Shared, auth: str | None) -> None:
    collector, dsn = shared_collector.collector, shared_collector.dsn
    headers = {"Content-Type": "application/json"} | ({"Authorization": auth} if auth else {})
    r = httpx.post(f"{collector.url}/v1/batches", content=wire.encode(full_batch()), headers=headers)
    assert r.status_code == 401 and r.json()["field"] == "Authorization"
    assert httpx.get(f"{collector.url}/v1/jobs", headers=headers).status_code == 401
    assert set(counts(dsn).values()) == {0}


def test_second_token_in_file_works(collector: RunningCollector) -> None:
    r = httpx.post(f"{collector.url}/v1/batches", content=wire.encode(gpu_batch(0)),
                   headers={"Authorization": "Bearer other-token"})
    assert r.status_code == 200


def test_metrics_health_and_openapi(collector: RunningCollector) -> None:
    assert post(collector, wire.encode(full_batch())).status_code == 200
    assert post(collector, b"{").status_code == 400
    with collector.client() as http:
        health = http.get("/healthz")
        assert health.status_code == 200 and health.json()["database"] == "ok"
        text = http.get("/metrics").text
        assert 'jobpulse_collector_batches_total{outcome="stored"} 1.0' in text
        assert 'jobpulse_collector_rows_total{table="gpu_samples"} 2.0' in text
        assert 'jobpulse_collector_rejects_total{status="400"} 1.0' in text
        assert "jobpulse_collector_batch_seconds_count 1.0" in text
        doc = http.get("/openapi.json").json()
    logged = [json.loads(line) for line in collector.log.read_text().splitlines() if line.startswith("{")]
    assert any(e.get("event") == "rejected" and e.get("status") == 400 for e in logged), logged
    assert doc["openapi"].startswith("3.")
    assert {"/v1/batches", "/v1/jobs", "/v1/jobs/{job_id}", "/healthz", "/metrics"} <= set(doc["paths"])
    gpu = doc["components"]["schemas"]["GpuSample"]["properties"]
    assert "watts" in json.dumps(gpu["power_w"]) and "MiB" in json.dumps(gpu["fb_used_mib"])


def test_agent_reported_drops_are_counted(collector: RunningCollector, dsn: str) -> None:
    b = gpu_batch(0)
    b = wire.Batch(version=1, agent=b.agent, seq=0, created_at=b.created_at, gpu_samples=b.gpu_samples,
                   dropped=wire.Dropped(gpu_samples=120, batches=3))
    assert post(collector, wire.encode(b)).status_code == 200
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT dropped FROM jobpulse.ingest_batches").fetchone()[0]["gpu_samples"] == 120
    with collector.client() as http:
        assert 'jobpulse_collector_agent_dropped_total{kind="gpu_samples"} 120.0' in http.get("/metrics").text


def test_chunked_body_over_limit_is_413(shared_collector: Shared) -> None:
    """Without Content-Length the limit is enforced while reading the stream."""
    collector, dsn = shared_collector.collector, shared_collector.dsn
    def chunks() -> Any:
        for _ in range(40):
            yield b" " * 65536

    with collector.client() as http:
        r = http.post("/v1/batches", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]
    assert set(counts(dsn).values()) == {0}
