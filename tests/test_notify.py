"""Flags told while jobs run: site webhooks by category (hardware to the admins only) and a job's own
opt-in URL, through a real HTTP receiver that fails, hangs and recovers, across a collector killed
with -9 between the flag and its delivery: every notice arrives once, none is lost, none twice."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest

from jobpulse.collector.embedded.postgres import free_port
from jobpulse.schema import wire

from .conftest import RunningCollector, start_collector, stop_collector

RULES = Path(__file__).parent / "data" / "rules_fast.toml"


class Receiver(ThreadingHTTPServer):
    """A chat server's incoming webhooks: ``mode`` down (500), hang (answers nothing for 3 s) or up."""

    def __init__(self) -> None:
        self.mode = "down"
        self.got: list[tuple[str, str, dict[str, object], float]] = []  # path, key, body, when
        self.attempts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.attempts += 1
                if receiver.mode == "hang":
                    receiver.mode = "up"  # once
                    time.sleep(3)
                    return
                if receiver.mode == "down":
                    self.send_response(500)
                    self.end_headers()
                    return
                receiver.got.append((self.path, self.headers["Idempotency-Key"], body, time.time()))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", free_port()), Handler)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.serve_forever, daemon=True)
    thread.start()
    yield r
    r.shutdown()


def seed(c: RunningCollector, url: str) -> None:
    """Job 8101 (its owner opted in) holds a GPU it never uses beside one it uses; job 8102's GPU
    reports XID 79 (fallen off the bus: the admins' to hear of)."""
    now = datetime.now(UTC)
    agent = wire.AgentInfo(instance="notify-1", node="n1", cluster="nt", version="0.1.0", started_at=now)
    start = now - timedelta(seconds=60)
    jobs = [wire.JobRecord(job_id="8101", user_name="ann", job_name="llm <@here> & co", start_time=start,
                           state="RUNNING", tags={"notify": f"{url}/user"},
                           gpus=[wire.JobGpu("GPU-a", 0), wire.JobGpu("GPU-b", 1)]),
            wire.JobRecord(job_id="8102", user_name="ben", start_time=start, state="RUNNING",
                           gpus=[wire.JobGpu("GPU-c", 2)])]
    samples = [wire.GpuSample(ts=start + timedelta(seconds=s), gpu_uuid=uuid, gpu_index=i, job_id=job,
                              sm_util=util, fb_used_mib=20_000, fb_total_mib=81_559)
               for s in range(60) for i, (uuid, job, util) in enumerate((("GPU-a", "8101", 90), ("GPU-b", "8101", 0),
                                                                         ("GPU-c", "8102", 90)))]
    xid = wire.HealthEvent(ts=now - timedelta(seconds=5), kind="xid", gpu_uuid="GPU-c", job_id="8102", code=79,
                           message="GPU has fallen off the bus")
    batch = wire.Batch(version=1, agent=agent, seq=0, created_at=now, gpu_samples=samples, jobs=jobs,
                       health_events=[xid])
    with c.client() as http:
        assert http.post("/v1/batches", content=wire.encode(batch)).status_code == 200


def outbox(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT n.channel, f.job_id, f.rule_id, n.attempts, n.delivered_at IS NOT NULL"
                            " FROM jobpulse.notifications n JOIN jobpulse.job_flags f ON f.id = n.flag_id"
                            " ORDER BY 1, 2").fetchall()


def channels_file(where: Path, url: str, everyone: bool) -> Path:
    """The site's channels: the admins' webhook (hardware, JSON), optionally everyone's (Slack-style),
    and users' own URLs on this host over plain http."""
    path = where / "notify.toml"
    hooks = '[[webhook]]\nname = "admins"\nurl = "{0}/admins"\nformat = "json"\ncategories = ["hardware"]\n'
    if everyone:
        hooks += '[[webhook]]\nname = "everyone"\nurl = "{0}/all"\n'
    users = f'[users]\nhosts = ["{url.removeprefix("http://")}"]\nallow_http = true\n'  # host:port, as listed
    path.write_text("timeout_s = 1.0\n" + hooks.format(url) + users)
    return path


def test_each_flag_is_told_once_to_each_channel_that_wants_it(dsn: str, tmp_path: Path, receiver: Receiver) -> None:
    url = f"http://127.0.0.1:{receiver.server_address[1]}"
    notify = channels_file(tmp_path, url, everyone=True)
    args = ("--rules", str(RULES), "--rules-interval", "1", "--notify", str(notify))
    collector = start_collector(dsn, tmp_path, *args)
    try:
        seed(collector, url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (len(outbox(dsn)) == 4 and receiver.attempts >= 4):
            time.sleep(0.5)
        queued = outbox(dsn)
        assert [(c, j, r) for c, j, r, *_ in queued] == [
            ("admins", "8102", "xid_error"), ("everyone", "8101", "over_allocation"),
            ("everyone", "8102", "xid_error"), ("user", "8101", "over_allocation")], queued
        assert not any(done for *_, done in queued), "the receiver is down: nothing delivered yet"
        collector.proc.kill()  # -9 between the flags and their delivery
        collector.proc.wait()
        collector = start_collector(dsn, tmp_path, *args)
        receiver.mode = "hang"  # one attempt hangs past the timeout, then the receiver is up
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(done for *_, done in outbox(dsn)):
            time.sleep(0.5)
        collector.wait_for_rule_cycles(3)  # and delivery passes beside them: nothing may be told twice
    finally:
        stop_collector(collector)
    got = sorted((path, body.get("rule") or body["text"].split(": ")[1].split(" at ")[0])  # type: ignore[union-attr]
                 for path, _, body, _ in receiver.got)
    assert got == [("/admins", "xid_error"), ("/all", "over_allocation"), ("/all", "xid_error"),
                   ("/user", "over_allocation")], receiver.got
    assert len({key for _, key, _, _ in receiver.got}) == 4, "one Idempotency-Key each"
    slack = next(body for path, _, body, _ in receiver.got if path == "/user")
    assert "&lt;@\u200bhere&gt; &amp; co" in str(slack["text"]) and "@here" not in str(slack["text"])
    admins = next(body for path, _, body, _ in receiver.got if path == "/admins")
    assert admins["job_id"] == "8102" and admins["category"] == "hardware" and admins["severity"] == "critical"
    print(f"\n{receiver.attempts} attempts for 4 notices: "
          f"{[(c, j, r, a) for c, j, r, a, _ in outbox(dsn)]}")


def test_a_poison_note_never_holds_up_the_notices_behind_it(dsn: str, tmp_path: Path, receiver: Receiver) -> None:
    """Hole: a note whose URL the HTTP client refuses (a tab in it: `urlsplit` drops it, httpx raises
    InvalidURL, not an HTTPError) killed every delivery pass before it was marked, oldest first, so no
    later notice was ever sent. Now each note fails alone, with its backoff, and a job's URL is read at
    store time by the client that sends it: a tab or a port other than the scheme's is never queued."""
    url = f"http://127.0.0.1:{receiver.server_address[1]}"
    notify = channels_file(tmp_path, url, everyone=False)
    receiver.mode = "up"
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1")
    try:  # flags first, without channels: then the poison is queued ahead of every real notice
        seed(collector, f"http://127.0.0.1\t:{receiver.server_address[1]}")
        deadline = time.monotonic() + 60
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.monotonic() < deadline and not conn.execute(
                    "SELECT 1 FROM jobpulse.job_flags WHERE rule_id = 'xid_error'").fetchone():
                time.sleep(0.3)
            flag = conn.execute("SELECT id FROM jobpulse.job_flags WHERE rule_id = 'over_allocation'").fetchone()
            assert flag is not None
            conn.execute("INSERT INTO jobpulse.notifications (flag_id, channel, url, format)"
                         " VALUES (%s, 'poison', %s, 'json')", (flag[0], f"{url}\t/x"))
    finally:
        stop_collector(collector)
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1", "--notify", str(notify))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not receiver.got:
            time.sleep(0.2)
        time.sleep(2.5)  # more passes: the poison is retried with its backoff, never in the way
    finally:
        stop_collector(collector)
    assert [(path, body["rule"]) for path, _, body, _ in receiver.got] == [("/admins", "xid_error")], receiver.got
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT channel, attempts, delivered_at, last_error, next_at - now() > interval '1 s'"
                            " FROM jobpulse.notifications ORDER BY id").fetchall()
    (poison, attempts, delivered, error, backing_off), (admins, *_) = rows  # the job's tab URL: never queued
    assert (poison, attempts, delivered, backing_off) == ("poison", 1, None, True) and "InvalidURL" in error, rows
    assert admins == "admins"
    print(f"\npoison note: {error!r}; the notice behind it delivered in the same pass")
    assert "Traceback" not in collector.log.read_text()


def test_a_stall_that_becomes_a_hang_is_told_again_and_only_when_it_rises(dsn: str) -> None:
    """The hang claim's weak form (`stalled`, info) turns into `hung` (critical) in the same flag row:
    a channel told of the note hears of the hang; a flag that falls back, or stays, is not told again."""
    from jobpulse.collector.notify import channels as notify_channels

    everyone = notify_channels.Channels(webhooks=(notify_channels.Webhook(
        "everyone", "https://chat.example/hook", severities=("info", "warning", "critical")),))
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, user_name) VALUES ('nt', '8201', 'ann')")
        flag = conn.execute(
            "INSERT INTO jobpulse.job_flags (cluster, job_id, rule_id, severity, scope, started_at, last_seen)"
            " VALUES ('nt', '8201', 'stalled', 'info', 'job', now(), now()) RETURNING id").fetchone()[0]  # type: ignore[index]
        told = [notify_channels.enqueue(conn, everyone)]
        told.append(notify_channels.enqueue(conn, everyone))  # the next cycle: nothing new
        conn.execute("UPDATE jobpulse.job_flags SET rule_id = 'hung', severity = 'critical' WHERE id = %s", (flag,))
        told.append(notify_channels.enqueue(conn, everyone))  # risen: told again
        conn.execute("UPDATE jobpulse.job_flags SET severity = 'warning' WHERE id = %s", (flag,))
        told.append(notify_channels.enqueue(conn, everyone))  # fallen: told already
        rows = conn.execute("SELECT channel, severity FROM jobpulse.notifications WHERE flag_id = %s ORDER BY id",
                            (flag,)).fetchall()
    assert told == [1, 0, 1, 0]
    assert rows == [("everyone", "info"), ("everyone", "critical")]
