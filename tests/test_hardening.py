"""Holes found by probing the collector as an attacker and as a new user would: each was reproduced
before the fix; each answer is now a clear 4xx (or a warning) and nothing bad is stored."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg
import pytest

from jobpulse.collector.embedded.postgres import EmbeddedPostgres
from jobpulse.schema import wire

from .batches import AGENT, as_dict, full_batch, gpu_batch
from .conftest import TOKEN, RunningCollector, Shared, start_collector, stop_collector


def post(c: RunningCollector, body: bytes | dict[str, Any], token: str | None = None,
         **headers: str) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    auth = {"Authorization": f"Bearer {token or c.token}"}
    with httpx.Client(base_url=c.url, timeout=30) as http:
        return http.post("/v1/batches", content=data,
                         headers={"Content-Type": "application/json", **auth, **headers})


def stored_batches(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM jobpulse.ingest_batches").fetchone()[0]


@pytest.mark.parametrize("field", ["submit_time", "start_time", "end_time"])
@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59",
                                  "1969-07-20T20:17:00Z", "2999-01-01T00:00:00Z"])
def test_far_job_times_are_refused_naming_the_field(shared_collector: Shared, field: str, when: str) -> None:
    collector, dsn = shared_collector.collector, shared_collector.dsn
    body = as_dict(full_batch())
    body["jobs"][0][field] = when
    r = post(collector, body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == f"$.jobs[0].{field}"
    body = as_dict(gpu_batch(0))
    body["agent"]["started_at"] = when
    r = post(collector, body)
    assert r.status_code == 422 and r.json()["field"] == "$.agent.started_at", r.text
    assert stored_batches(dsn) == 0


def test_a_bad_stored_time_does_not_break_listings_or_other_jobs(collector: RunningCollector, dsn: str) -> None:
    assert post(collector, as_dict(full_batch(job_id="1001"))).status_code == 200
    with psycopg.connect(dsn) as conn:  # as an older version or a hand-written UPDATE could have left it
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, start_time, end_time)"
                     " VALUES ('testcluster', '666', '0001-01-01 00:00:00+00 BC', '20000-01-01 00:00:00+00')")
    with collector.client() as http:
        listed = http.get("/v1/jobs")
        assert listed.status_code == 200, listed.text
        bad = next(j for j in listed.json() if j["job_id"] == "666")
        assert bad["start_time"] is None and bad["end_time"] is None
        assert http.get("/v1/jobs/666").status_code == 200
        assert http.get("/v1/jobs/1001").json()["user_name"] == "alice"
    report = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "666", "--dsn", dsn],
                            capture_output=True, text=True, timeout=60)
    assert "Traceback" not in report.stderr, report.stderr


@pytest.mark.parametrize("path", ["/v1/jobs?user=%00", "/v1/jobs?cluster=a%00", "/v1/jobs/1%00",
                                  "/v1/jobs?limit=%C2%B2", "/v1/jobs?limit=0", "/v1/jobs?user=",
                                  "/v1/jobs/12x", "/v1/jobs/" + "1" * 80, "/v1/jobs/1?cluster=%0A"])
def test_bad_query_and_path_values_get_a_4xx(shared_collector: Shared, path: str) -> None:
    with shared_collector.collector.client() as http:
        r = http.get(path)
    assert r.status_code == 422, (path, r.status_code, r.text)
    assert r.json()["field"] in ("user", "cluster", "limit", "job_id")


def test_a_replay_with_a_new_created_at_is_a_duplicate(collector: RunningCollector, dsn: str) -> None:
    batch = gpu_batch(7)
    assert post(collector, wire.encode(batch)).json()["status"] == "stored"
    later = msgspec.structs.replace(batch, created_at=batch.created_at - timedelta(hours=30))
    r = post(collector, wire.encode(later))
    assert r.status_code == 200 and r.json()["status"] == "duplicate", r.text
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0] == 2


@pytest.mark.parametrize("extra", [gzip.compress(b"{}", mtime=0), b"garbage", b"\x00"], ids=["gzip member", "garbage", "NUL"])
def test_bytes_after_the_gzip_stream_are_refused(shared_collector: Shared, extra: bytes) -> None:
    body = gzip.compress(wire.encode(gpu_batch(0))) + extra
    r = post(shared_collector.collector, body, **{"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "follow the gzip stream" in r.json()["error"], r.text
    assert stored_batches(shared_collector.dsn) == 0


def test_a_token_bound_to_nodes_and_a_cluster_writes_only_as_them(dsn: str, tmp_path: Path) -> None:
    c = start_collector(dsn, tmp_path)
    try:
        (tmp_path / "tokens").write_text(f"{TOKEN}\nnode-token-0123456789 cluster=testcluster nodes=n[0-9],gpu*\n")
        os.utime(tmp_path / "tokens", (time.time() + 5, time.time() + 5))
        mine = post(c, wire.encode(gpu_batch(0)), token="node-token-0123456789")  # AGENT is n1 of testcluster
        assert mine.status_code == 200, mine.text
        other = msgspec.structs.replace(AGENT, node="login1")
        r = post(c, wire.encode(gpu_batch(1, agent=other)), token="node-token-0123456789")
        assert r.status_code == 403 and "login1" in r.json()["error"], r.text
        r = post(c, wire.encode(gpu_batch(2, agent=msgspec.structs.replace(AGENT, cluster="beta"))),
                 token="node-token-0123456789")
        assert r.status_code == 403
        assert stored_batches(dsn) == 1
    finally:
        stop_collector(c)


def test_token_file_warnings_deletion_and_emptying_are_loud(dsn: str, tmp_path: Path) -> None:
    c = start_collector(dsn, tmp_path)  # the suite writes its token file world-readable (umask 022)
    tokens = tmp_path / "tokens"
    try:
        assert post(c, wire.encode(gpu_batch(0))).status_code == 200
        tokens.write_text("# rotated out\n")
        os.utime(tokens, (time.time() + 5, time.time() + 5))
        assert post(c, wire.encode(gpu_batch(1))).status_code == 401
        tokens.write_text(f"{TOKEN}\n")
        os.utime(tokens, (time.time() + 10, time.time() + 10))
        assert post(c, wire.encode(gpu_batch(2))).status_code == 200
        tokens.unlink()
        assert post(c, wire.encode(gpu_batch(3))).status_code == 401, "a deleted token file must revoke its tokens"
    finally:
        stop_collector(c)
    events = [json.loads(line) for line in c.log.read_text().splitlines() if line.startswith("{")]
    said = {e["event"] for e in events}
    assert {"token file readable by others", "token file holds no token: every agent is refused",
            "token file deleted: every token revoked, agents are refused"} <= said, said


def test_first_requests_after_a_database_restart_succeed(private_postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    """Pooled connections that died with the server are checked on checkout, not handed out."""
    pg = private_postgres
    c = start_collector(pg.dsn, tmp_path)
    for seq in range(3):  # fill the pool
        assert post(c, wire.encode(gpu_batch(seq))).status_code == 200
    pg.stop(mode="immediate")
    pg.start()
    answers = [post(c, wire.encode(gpu_batch(seq))).status_code for seq in range(3, 8)]
    with c.client() as http:
        answers.append(http.get("/v1/jobs").status_code)
    stop_collector(c)
    assert answers == [200] * 6, answers


def _trickle(sock: socket.socket, data: bytes, until: float) -> bytes:
    """Send a byte every 0.2 s until the server answers or closes; what it said."""
    sock.settimeout(0.2)
    for i in range(len(data)):
        if time.monotonic() > until:
            break
        try:
            sock.sendall(data[i:i + 1])
            got = sock.recv(4096)
            return got or b"<closed>"
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return b"<closed>"
    return b""


def test_slow_clients_are_cut_off(dsn: str, tmp_path: Path) -> None:
    c = start_collector(dsn, tmp_path, "--request-timeout", "2")
    host, port = c.url.removeprefix("http://").split(":")
    headers = (f"POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
               "Content-Type: application/json\r\nContent-Length: 5000\r\n" + "X-Pad: y\r\n" * 200 + "\r\n").encode()
    try:
        started = time.monotonic()
        socks = [socket.create_connection((host, int(port))) for _ in range(6)]
        silent = socket.create_connection((host, int(port)))  # connects and says nothing at all
        said = [_trickle(s, headers, started + 30) for s in socks[:3]]
        assert said == [b"<closed>"] * 3, said
        body_sock = socket.create_connection((host, int(port)))
        body_sock.sendall(headers)
        answer = _trickle(body_sock, b"{" * 5000, time.monotonic() + 30)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        silent.settimeout(5)
        assert silent.recv(10) == b"", "a silent connection must be closed too"
        assert time.monotonic() - started < 20
        with c.client() as http:  # the service is still there for everyone else
            assert http.get("/v1/jobs").status_code == 200
        for s in [*socks, silent, body_sock]:
            s.close()
    finally:
        stop_collector(c)


def jobpulse(*args: str, blocked: str = "") -> subprocess.CompletedProcess[str]:
    """The CLI in a child process; ``blocked`` names a package to hide, as if not installed."""
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked.split()!r})); "
            "from jobpulse.collector.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [("report", "1"), ("db", "upgrade"), ("db", "maintain"), ("rules", "evaluate"),
                                  ("validate", "report"), ("collector", "serve", "--token-file", "/dev/null")])
def test_a_malformed_dsn_is_a_message_not_a_traceback(args: tuple[str, ...]) -> None:
    r = jobpulse(*args, "--dsn", "not a dsn")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "--dsn" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [("--help",), ("grafana", "build", "--help"), ("report", "--help")])
def test_help_works_without_the_database_stack(args: tuple[str, ...]) -> None:
    r = jobpulse(*args, blocked="psycopg psycopg_pool")
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


def test_the_text_report_shows_control_characters_escaped(collector: RunningCollector, dsn: str) -> None:
    evil = "\x1b]0;owned\x07\x1b[2J\x1b[32mjob OK\x1b[0m\x9b"
    body = as_dict(full_batch(job_id="4040"))
    job = body["jobs"][0]
    job.update(job_name=evil, user_name="u" + evil, account="a" + evil, partition="p" + evil, tags={"t": evil})
    body["events"][0]["name"] = "phase" + evil
    body["process_samples"][0]["command"] = "py" + evil
    assert post(collector, body).status_code == 200
    for fmt in ("text", "json"):
        r = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "4040", "--dsn", dsn,
                            "--format", fmt], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert not any(ch in r.stdout for ch in "\x1b\x07\x9b"), repr(r.stdout[:300])
    assert "\\x1b]0;owned\\x07" in r.stdout or "\\u001b]0;owned" in r.stdout


def test_the_agent_warns_about_a_token_file_others_can_read(fake_nvml: Path, tmp_path: Path) -> None:
    from .agents import Scenario, start_agent

    scn = Scenario().gpu(0, "GPU-t", "00000000:17:00.0", sm=10).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, tmp_path / "a", "n1", collector="http://127.0.0.1:9", token="t" * 20)
    try:
        deadline = time.monotonic() + 20
        while "token file readable by others" not in agent.log.read_text():
            assert time.monotonic() < deadline, agent.log.read_text()
            time.sleep(0.2)
    finally:
        agent.stop()
