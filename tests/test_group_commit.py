"""Group commit through a real collector: batches sent together share a transaction, each is
answered after it, a batch the database refuses fails alone, and a replay stays a duplicate."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from jobpulse.schema import wire

from .batches import AGENT, gpu_batch, now
from .conftest import RunningCollector, start_collector, stop_collector

AGENTS = 16


def _send_together(c: RunningCollector, bodies: list[bytes]) -> list[httpx.Response]:
    def post(body: bytes) -> httpx.Response:
        with c.client() as http:
            return http.post("/v1/batches", content=body, headers={"Content-Type": "application/json"})

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def _largest_group(c: RunningCollector) -> int:
    text = httpx.get(f"{c.url}/metrics").text
    counts = {float(le): float(n) for le, n in re.findall(
        r'jobpulse_collector_group_batches_bucket\{le="([0-9.]+)"\} ([0-9.e+]+)', text)}
    total = float(re.search(r"jobpulse_collector_group_batches_count ([0-9.e+]+)", text).group(1))
    return int(min(le for le, n in counts.items() if n == total))  # the smallest bucket holding every group


def test_batches_sent_together_commit_together_and_a_refused_one_fails_alone(dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:  # a refusal validation cannot foresee
        conn.execute("ALTER TABLE jobpulse.gpu_samples ADD CONSTRAINT poison CHECK (gpu_uuid <> 'GPU-poison')")
    t0 = now() - timedelta(seconds=5)
    batches = [gpu_batch(0, t0, n_gpus=8, agent=wire.AgentInfo(
        instance=f"gc-{i}", node=f"n{i}", cluster="gc", version="0.1.0", started_at=t0)) for i in range(AGENTS)]
    poison = batches[5].gpu_samples[3]
    batches[5].gpu_samples[3] = wire.GpuSample(ts=poison.ts, gpu_uuid="GPU-poison", gpu_index=3)
    bodies = [wire.encode(b) for b in batches]
    # The same batch twice in one group: stored once, the other answer says duplicate.
    bodies.append(bodies[0])
    c = start_collector(dsn, tmp_path, "--group-wait-ms", "300")
    try:
        first = _send_together(c, bodies)
        largest = _largest_group(c)
        again = _send_together(c, bodies[:AGENTS])
    finally:
        stop_collector(c)
    assert first[5].status_code == 422 and "rejected by the database" in first[5].json()["error"], first[5].text
    stored = [r.json()["status"] for i, r in enumerate(first) if i != 5]
    assert sorted(stored) == ["duplicate"] + ["stored"] * (AGENTS - 1), stored
    assert largest > 1, "the concurrent batches shared a transaction"
    assert again[5].status_code == 422
    assert [r.json()["status"] for i, r in enumerate(again) if i != 5] == ["duplicate"] * (AGENTS - 1)
    with psycopg.connect(dsn) as conn:
        ledger = conn.execute("SELECT count(*), count(DISTINCT agent_instance) FROM jobpulse.ingest_batches").fetchone()
        samples = conn.execute("SELECT count(*), count(DISTINCT (node, gpu_uuid, ts)) FROM jobpulse.gpu_samples"
                               ).fetchone()
        folded = conn.execute("SELECT sum(n) FROM jobpulse.gpu_rollup_10s").fetchone()[0]
        refused = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples WHERE node = 'n5'").fetchone()[0]
    assert ledger == (AGENTS - 1, AGENTS - 1)
    assert samples == ((AGENTS - 1) * 8, (AGENTS - 1) * 8) and folded == samples[0], "each batch stored and folded once"
    assert refused == 0, "nothing of the refused batch is stored"


def _groups(c: RunningCollector) -> int:
    return int(float(re.search(r"jobpulse_collector_group_batches_count ([0-9.e+]+)",
                               httpx.get(f"{c.url}/metrics").text).group(1)))


def _send_spread(c: RunningCollector, bodies: list[bytes], gap_s: float) -> list[httpx.Response]:
    """Each body on its own connection, ``gap_s`` after the one before (agents' batches of a tick
    arrive spread over tens of milliseconds), without waiting for the answers. The times are fixed
    before the clients are made, so a client slow to start cannot widen a gap."""
    start = time.monotonic() + 1.0

    def post(k: int) -> httpx.Response:
        with c.client() as http:
            http.get("/healthz")  # connected before the tick, as an agent's keep-alive connection is
            time.sleep(max(0.0, start + k * gap_s - time.monotonic()))
            return http.post("/v1/batches", content=bodies[k], headers={"Content-Type": "application/json"})

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, range(len(bodies))))


@pytest.mark.parametrize(("max_wait_ms", "one_group"), [(10_000, True), (300, False)])
def test_a_group_gathers_until_batches_stop_coming_for_at_most_its_longest_wait(
        dsn: str, tmp_path: Path, max_wait_ms: int, one_group: bool) -> None:
    """Ten batches 60 ms apart with a quiet time of 300 ms: one group while the longest wait allows
    (a fixed wait after the first batch would close it after six), several once that is 300 ms
    (the ten span 540 ms)."""
    t0 = now() - timedelta(seconds=5)
    bodies = [wire.encode(gpu_batch(0, t0, agent=wire.AgentInfo(
        instance=f"spread-{max_wait_ms}-{i}", node=f"s{i}", cluster="spread", version="0.1.0", started_at=t0)))
        for i in range(10)]
    c = start_collector(dsn, tmp_path, "--group-wait-ms", "300", "--group-max-wait-ms", str(max_wait_ms))
    try:
        with c.client() as http:  # warm: the pool, the partitions
            http.post("/v1/batches", content=wire.encode(gpu_batch(0, t0, agent=wire.AgentInfo(
                instance=f"warm-{max_wait_ms}", node="w", cluster="spread", version="0.1.0", started_at=t0))))
        before = _groups(c)
        answers = _send_spread(c, bodies, 0.06)
        groups = _groups(c) - before
    finally:
        stop_collector(c)
    assert [r.json()["status"] for r in answers] == ["stored"] * 10
    assert (groups == 1) if one_group else (groups >= 2), groups


def test_a_lone_batch_waits_no_longer_than_the_group_wait(collector: RunningCollector) -> None:
    with collector.client() as http:
        http.post("/v1/batches", content=wire.encode(gpu_batch(0, agent=AGENT)))  # warm: pool, partitions
        times = []
        for seq in range(1, 6):
            r = http.post("/v1/batches", content=wire.encode(gpu_batch(seq, agent=AGENT)))
            assert r.json()["status"] == "stored"
            times.append(r.elapsed.total_seconds())
    assert min(times) < 0.25, times  # the default quiet gap is 5 ms; a shared CI machine adds its own


def test_names_with_array_syntax_are_stored_and_replays_found(dsn: str, tmp_path: Path) -> None:
    """The ledger takes a group's names as array parameters: names that array text syntax would
    have to quote (or read as NULL) arrive intact, and their replays are still duplicates."""
    nodes = ["NULL", "a,b", "{x}", 'q"uote', "back\\slash", "é'"]
    t0 = now() - timedelta(seconds=5)
    batches = [gpu_batch(0, t0, n_gpus=2, agent=wire.AgentInfo(
        instance=f"arr-{i}", node=node, cluster="c{,}", version='0.1"0', started_at=t0))
        for i, node in enumerate(nodes)]
    bodies = [wire.encode(b) for b in batches]
    c = start_collector(dsn, tmp_path, "--group-wait-ms", "300")
    try:
        first = _send_together(c, bodies)
        again = _send_together(c, bodies)
    finally:
        stop_collector(c)
    assert [r.json()["status"] for r in first] == ["stored"] * len(nodes), [r.text for r in first]
    assert [r.json()["status"] for r in again] == ["duplicate"] * len(nodes)
    with psycopg.connect(dsn) as conn:
        ledger = conn.execute("SELECT node, cluster, agent_version FROM jobpulse.ingest_batches"
                              " WHERE agent_instance LIKE 'arr-%'").fetchall()
        sampled = {n for (n,) in conn.execute("SELECT DISTINCT node FROM jobpulse.gpu_samples WHERE cluster = 'c{,}'")}
    assert sorted(ledger) == sorted((node, "c{,}", '0.1"0') for node in nodes)
    assert sampled == set(nodes)


def test_a_replayed_batch_does_not_wait_for_the_live_gather(dsn: str, tmp_path: Path) -> None:
    """With another agent connected that could still send, a live batch waits the whole quiet gap for
    it; one made minutes ago (an agent replaying its spool one batch at a time, each after the last
    one's answer) does not, or the gap would set the pace of a replay."""
    c = start_collector(dsn, tmp_path, "--group-wait-ms", "1000", "--group-max-wait-ms", "2000")
    try:
        with c.client() as http, c.client() as neighbour:
            neighbour.get("/healthz")  # a second agent's keep-alive connection, idle
            http.post("/v1/batches", content=wire.encode(gpu_batch(0, now() - timedelta(minutes=10))))  # warm
            replayed = [http.post("/v1/batches", content=wire.encode(gpu_batch(seq, now() - timedelta(minutes=10))))
                        for seq in range(1, 4)]
            live = http.post("/v1/batches", content=wire.encode(gpu_batch(4)))
    finally:
        stop_collector(c)
    assert [r.json()["status"] for r in [*replayed, live]] == ["stored"] * 4
    assert max(r.elapsed.total_seconds() for r in replayed) < 0.6, [r.elapsed for r in replayed]
    assert live.elapsed.total_seconds() >= 1.0, live.elapsed


def test_no_batch_waits_once_every_connected_client_has_one_waiting(dsn: str, tmp_path: Path) -> None:
    """A client sends its next batch only after the last one's answer: once every open connection has
    a batch waiting, no other can come, and the group commits at once instead of idling the gap (many
    agents catching up after a short outage would otherwise each wait it every batch)."""
    c = start_collector(dsn, tmp_path, "--group-wait-ms", "1000", "--group-max-wait-ms", "2000")
    try:
        with c.client() as http:
            answers = [http.post("/v1/batches", content=wire.encode(gpu_batch(seq))) for seq in range(4)]
    finally:
        stop_collector(c)
    assert [r.json()["status"] for r in answers] == ["stored"] * 4
    assert max(r.elapsed.total_seconds() for r in answers[1:]) < 0.6, [r.elapsed for r in answers]
