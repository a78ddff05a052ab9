"""A user on a compute node cannot cost us data. Each test reproduces one hole found by probing the
real agent and collector as an unprivileged local user would (each failed before its fix):

1. lone surrogates in an event emptied a whole batch (GPU samples lost, nothing counted);
2. one NUL in an event got the whole batch refused (its GPU samples dropped);
3. a stop with the spool disk full and the collector down lost the batches held in memory, uncounted;
4. a connection flood on the control socket made the prolog start a second agent on the same GPUs;
5. a token bound to one node could shadow another node's batches by posting its instance id.

The senders run as ``nobody`` when the suite runs as root (CI), else as the test's own user (the
payloads, not the uid, did the damage in holes 1 and 2; holes 3 and 4 need root and skip elsewhere).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import msgspec
import psycopg
import pytest

from jobpulse.collector.embedded.postgres import free_port

from .agents import FULL_H100, Scenario, start_agent
from .batches import AGENT, as_dict, full_batch, gpu_batch
from .conftest import TOKEN, start_collector, stop_collector
from .test_agent_e2e import wait_for
from .test_disk_full import fill

NOBODY = 65534
ROOT = os.geteuid() == 0


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder every local user can reach (pytest's own are private to the test's user)."""
    d = Path(tempfile.mkdtemp(prefix="jobpulse-user-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_user(work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child, as ``nobody`` when we are root; returns its PID."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            if ROOT:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            work()
        except BaseException:  # noqa: BLE001 - the child's exit status tells the parent
            code = 1
        os._exit(code)
    return pid


def wait_children(pids: list[int]) -> None:
    for pid in pids:
        os.waitpid(pid, 0)


def datagrams(kind: str) -> list[bytes]:
    """What a hostile or careless job sends to the events socket."""
    if kind == "surrogates":
        return [b'{"kind": "log", "message": "bad \\udcff byte", "attrs": {"\\ud800": "\\udfff x"}}',
                b'{"message": "pair \\ud83d\\ude00 ok", "name": "n\\udcff"}']
    if kind == "nul":
        return [b'{"message": "nul \\u0000 here", "name": "n\\u0000", "attrs": {"k\\u0000": ["v\\u0000"]}}']
    return [b'\xff\xfe{"message": 1}', b'{"message": "\xff\xfe not utf-8"}',
            json.dumps({"message": "huge", "attrs": {"blob": "x" * 58_000}}).encode(),
            b'{"message": "deep", "attrs": ' + b"[" * 600 + b"]" * 600 + b"}",
            b'{"message": "big numbers", "attrs": {"n": 1208925819614629174706176, "f": NaN, "g": -Infinity}}']


def sender(path: Path, payloads: list[bytes], seconds: float, pause: float) -> Callable[[], None]:
    def send() -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for p in payloads:
                try:
                    s.sendto(p, str(path))
                except OSError:  # the agent's queue is full: a flood sends on
                    pass
            if pause:
                time.sleep(pause)
    return send


def stored_and_reported(dsn: str) -> tuple[int, int, int, int]:
    with psycopg.connect(dsn) as conn:
        gpu, distinct = conn.execute("SELECT count(*), count(DISTINCT (gpu_uuid, ts)) FROM jobpulse.gpu_samples").fetchone()
        dropped_gpu, dropped_events = conn.execute(
            "SELECT coalesce(sum((dropped->>'gpu_samples')::int), 0), coalesce(sum((dropped->>'events')::int), 0)"
            " FROM jobpulse.ingest_batches").fetchone()
    assert gpu == distinct, "nothing stored twice"
    return gpu, dropped_gpu, dropped_events, distinct


@pytest.mark.parametrize("kind", ["surrogates", "nul", "garbage", "flood"])
def test_a_users_events_never_cost_a_gpu_sample(fake_nvml: Path, dsn: str, tmp_path: Path, open_dir: Path,
                                                kind: str) -> None:
    c = start_collector(dsn, tmp_path, "--max-body-mb", "4")
    scn = Scenario().gpu(0, "GPU-u0", "00000000:17:00.0", **FULL_H100).gpu(1, "GPU-u1", "00000000:18:00.0",
                                                                           **FULL_H100).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, open_dir / "agent", "n1", collector=c.url, token=TOKEN)
    try:
        (open_dir / "agent").chmod(0o755)
        if kind == "flood":  # ~10,000 events a second from four processes, small and 50 KB ones
            small = b'{"message": "step", "attrs": {"step": 1}}'
            big = json.dumps({"message": "big", "attrs": {"blob": "y" * 50_000}}).encode()
            pids = [as_user(sender(agent.events_socket, [small] * 24 + [big], 5, 0.01)) for _ in range(4)]
        else:
            pids = [as_user(sender(agent.events_socket, datagrams(kind), 5, 0.05))]
        wait_children(pids)
        time.sleep(1.5)
        produced = agent.stop()
    finally:
        agent.kill_if_running()
        stop_collector(c)
    log = agent.log.read_text()
    stored, dropped_gpu, dropped_events, _ = stored_and_reported(dsn)
    with psycopg.connect(dsn) as conn:
        events, replaced, users = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE message LIKE '%' || chr(65533) || '%'"
            "  OR name LIKE '%' || chr(65533) || '%' OR attrs::text LIKE '%' || chr(65533) || '%'), array_agg(DISTINCT uid) FROM jobpulse.events").fetchone()
    print(f"\n{kind}: GPU samples produced {produced['gpu_samples']}, stored {stored}; events stored {events} "
          f"(text replaced in {replaced}), dropped and reported {dropped_events}")
    assert "collector refused batch" not in log and "source failed" not in log, log[-3000:]
    assert dropped_gpu == 0 and stored == produced["gpu_samples"] > 0, "every GPU sample stored"
    assert "Traceback" not in c.log.read_text(), c.log.read_text()[-3000:]
    if kind in ("surrogates", "nul"):
        assert events > 0 and replaced == events, "the events kept, their unstorable text replaced"
        assert users == [NOBODY if ROOT else os.getuid()]
    if kind == "flood":
        assert dropped_events > 0, "what the rate limits and the batch's event budget refused is counted"


@pytest.mark.parametrize("full_from_start", [False, True])
def test_a_stop_with_the_disk_full_and_the_collector_down_loses_nothing_silently(
        fake_nvml: Path, dsn: str, tmp_path: Path, tiny_disk: Path, full_from_start: bool) -> None:
    """Full from the start (a partial failure found by a probe): the spool had no room for its tally
    file either, so the loss at stop was logged but never reached the ledger; the count now goes to
    the agent's runtime folder, where the next start reads it."""
    port = free_port()  # the collector is down for the first agent's whole life
    scn = Scenario().gpu(0, "GPU-f0", "00000000:17:00.0", **FULL_H100).gpu(1, "GPU-f1", "00000000:18:00.0",
                                                                           **FULL_H100).write(tmp_path / "s.scn")
    spool = ["--spool-dir", str(tiny_disk / "spool"), "--spool-max-mb", "0.06"]
    if full_from_start:
        (tiny_disk / "spool").mkdir()
        fill(tiny_disk)
    first = start_agent(fake_nvml, scn, tmp_path / "a", "n1", *spool, collector=f"http://127.0.0.1:{port}",
                        token=TOKEN)
    try:
        deadline = time.monotonic() + 30
        while "spool disk refused a batch" not in first.log.read_text():
            assert time.monotonic() < deadline, "the tiny disk never filled"
            time.sleep(0.5)
        time.sleep(3)  # batches now wait in memory only
        produced_first = first.stop()
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert "could not be kept" not in first.log.read_text()
    collector = start_collector(dsn, tmp_path, port=port)
    second = start_agent(fake_nvml, scn, tmp_path / "a", "n1", *spool, collector=collector.url, token=TOKEN)
    try:
        second.wait_drained()
        produced_second = second.stop()
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
        stop_collector(collector)
    stored, dropped_gpu, _, _ = stored_and_reported(dsn)
    produced = produced_first["gpu_samples"] + produced_second["gpu_samples"]
    print(f"\nfull disk, collector down, stop: produced {produced}, stored {stored}, counted as dropped {dropped_gpu}")
    assert stored + dropped_gpu == produced, "every sample stored or counted as dropped"


def agents_on(control: Path) -> list[int]:
    """PIDs of the agent processes serving this control socket."""
    out = subprocess.run(["pgrep", "-f", "--", f"--control-socket {control}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_a_control_socket_flood_never_yields_two_agents_nor_a_failed_prolog(fake_nvml: Path, tmp_path: Path,
                                                                            open_dir: Path) -> None:
    if not ROOT:
        pytest.skip("the prolog runs as root and the flood as another user; CI runs this as root")
    scn = Scenario().gpu(0, "GPU-p0", "00000000:17:00.0", minor=0, **FULL_H100).write(tmp_path / "s.scn")
    runtime = open_dir / "run"
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_SCENARIO": str(scn),
           "SLURMD_NODENAME": "n1", "JOBPULSE_RUNTIME_DIR": str(runtime), "JOBPULSE_SPOOL_DIR": str(tmp_path / "spool"),
           "JOBPULSE_LOG_DIR": str(tmp_path / "log"), "JOBPULSE_GRES_CONF": str(tmp_path / "none"),
           "SLURM_JOB_GPUS": "0", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000"}
    control = runtime / "agent.sock"

    def hook(what: str, job: str) -> tuple[str, float]:
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "jobpulse.agent.slurm", what], env={**env, "SLURM_JOB_ID": job},
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0
        return out.stderr, time.monotonic() - started

    try:
        line, _ = hook("prolog", "101")
        assert "registered on n1" in line, line
        runtime.chmod(0o755)
        (agent,) = agents_on(control)

        def flood() -> None:  # ~40 connections held open, renewed as the agent closes them
            held: list[socket.socket] = []
            end = time.monotonic() + 8
            while time.monotonic() < end:
                try:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.setblocking(False)
                    s.connect(str(control))
                    held.append(s)
                except OSError:
                    time.sleep(0.01)
                held = held[-40:]
        flooders = [as_user(flood) for _ in range(2)]
        time.sleep(1)
        line, took = hook("prolog", "102")
        status = subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", "status", "--control-socket",
                                 str(control)], capture_output=True, text=True, timeout=30)
        wait_children(flooders)
        assert "registered on n1" in line, line
        assert agents_on(control) == [agent], "one agent per node"
        assert json.loads(status.stdout)["jobs"] == ["101", "102"], status

        # "cannot tell" is never "not running": a stopped agent is neither replaced nor its socket unlinked,
        # and the job the prolog could not hand over waits for it, with its end queued behind it
        os.kill(agent, signal.SIGSTOP)
        try:
            line, took = hook("prolog", "103")
            assert "left for the agent on n1, which did not answer in time" in line, line
            assert agents_on(control) == [agent] and control.exists()
            line, _ = hook("epilog", "103")
            assert "end (ended; slurmctld has the state) left for the agent on n1, behind its registration" in line
        finally:
            os.kill(agent, signal.SIGCONT)
        line, _ = hook("prolog", "104")
        assert "registered on n1" in line, line
        wait_for(lambda: not any(control.with_name("agent.sock.queue").iterdir()), 10, "the queue to be taken")
        log = (tmp_path / "log" / "agent.log").read_text()
        assert "Traceback" not in log, log[-3000:]  # the prolog that gave up on 103 hung up before its reply
        taken = [json.loads(x) for x in log.splitlines() if "queued control request taken" in x]
        assert [(t["job"], t["op"], t["ok"]) for t in taken] == [("103", "register", True), ("103", "unregister", True)]
        status = subprocess.run([sys.executable, "-m", "jobpulse.agent.cli", "status", "--control-socket",
                                 str(control)], capture_output=True, text=True, timeout=30)
        assert json.loads(status.stdout)["jobs"] == ["101", "102", "104"], status
        print(f"\nflooded prolog: one agent (pid {agent}); a stopped agent's prolog left its job after {took:.1f} s")
    finally:
        for pid in agents_on(control):
            os.kill(pid, signal.SIGTERM)


def test_a_bound_token_cannot_shadow_another_nodes_batches(dsn: str, tmp_path: Path) -> None:
    c = start_collector(dsn, tmp_path)
    (tmp_path / "tokens").write_text("n1-token-0123456789 cluster=testcluster nodes=n1\n"
                                     "n2-token-0123456789 cluster=testcluster nodes=n2\n"
                                     "other-token-0123456789 cluster=othercluster\n")
    time.sleep(0.05)  # a new mtime: the collector re-reads the token file

    def post(token: str, node: str, seq: int) -> httpx.Response:
        batch = full_batch(seq, agent=msgspec.structs.replace(AGENT, node=node)) if seq == 0 else \
            gpu_batch(seq, agent=msgspec.structs.replace(AGENT, node=node))
        body = as_dict(batch)
        return httpx.post(f"{c.url}/v1/batches", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    try:
        assert post("n1-token-0123456789", "n1", 0).status_code == 200
        # n2's token posts n1's instance with n1's next sequence numbers, as itself and as n1
        shadow = post("n2-token-0123456789", "n2", 1)
        assert shadow.status_code == 409 and shadow.json()["field"] == "$.agent.instance", shadow.text
        assert post("n2-token-0123456789", "n1", 1).status_code == 403
        real = post("n1-token-0123456789", "n1", 1)
        assert real.status_code == 200 and real.json()["status"] == "stored", real.text
        again = post("n1-token-0123456789", "n1", 1)
        assert again.json()["status"] == "duplicate"

        # a bound token reads only its cluster
        other = {"Authorization": "Bearer other-token-0123456789"}
        n1 = {"Authorization": "Bearer n1-token-0123456789"}
        assert httpx.get(f"{c.url}/v1/jobs", headers=other).json() == []
        assert httpx.get(f"{c.url}/v1/jobs?cluster=testcluster", headers=other).status_code == 403
        assert httpx.get(f"{c.url}/v1/jobs/1001", headers=other).status_code == 404
        assert [j["cluster"] for j in httpx.get(f"{c.url}/v1/jobs", headers=n1).json()] == ["testcluster"]
    finally:
        stop_collector(c)
    with psycopg.connect(dsn) as conn:
        ledger = conn.execute("SELECT node, seq FROM jobpulse.ingest_batches ORDER BY seq").fetchall()
    assert ledger == [("n1", 0), ("n1", 1)]


def test_the_html_report_shows_control_characters_as_escapes() -> None:
    from jobpulse.collector.report.html import escape

    shown = escape("train\x1b]0;pwned\x07 <b>\x1b[2J")
    assert "\x1b" not in shown and "\x07" not in shown and "<b>" not in shown
    assert shown == "train\\x1b]0;pwned\\x07 &lt;b&gt;\\x1b[2J"


def test_a_long_job_name_is_clipped_never_costs_the_job(fake_nvml: Path, dsn: str, tmp_path: Path) -> None:
    """Hole: a 2,000-character SLURM_JOB_NAME failed the prolog's validation (`job_name` <= 1,024), so
    the job was never registered: no row, no attributed sample, no flag, no policy. A descriptive
    field is clipped (and the prolog says so); the job's identity is never lost."""
    c = start_collector(dsn, tmp_path)
    scn = Scenario().gpu(0, "GPU-n0", "00000000:17:00.0", minor=0, **FULL_H100).write(tmp_path / "s.scn")
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_SCENARIO": str(scn),
           "SLURMD_NODENAME": "n1", "JOBPULSE_RUNTIME_DIR": str(tmp_path / "run"),
           "JOBPULSE_SPOOL_DIR": str(tmp_path / "spool"), "JOBPULSE_LOG_DIR": str(tmp_path / "log"),
           "JOBPULSE_GRES_CONF": str(tmp_path / "none"), "JOBPULSE_COLLECTOR": c.url,
           "JOBPULSE_TOKEN_FILE": str(tmp_path / "tokens"), "JOBPULSE_CLUSTER": "lc",
           "SLURM_JOB_GPUS": "0", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NAME": "n" * 1990 + "-the-end", "SLURM_JOB_ACCOUNT": "a" * 300}
    control = tmp_path / "run" / "agent.sock"
    try:
        out = subprocess.run([sys.executable, "-m", "jobpulse.agent.slurm", "prolog"], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0 and "registered on n1" in out.stderr, out.stderr
        assert "clipped account (300 characters, kept 255), job_name (1998 characters, kept 1024)" in out.stderr
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM jobpulse.gpu_samples WHERE job_id = '4242'")
                     .fetchone()[0] >= 3, 30, "the job's samples")
            name, account, user = conn.execute("SELECT job_name, account, user_name FROM jobpulse.jobs"
                                               " WHERE job_id = '4242'").fetchone()
            unattributed = conn.execute("SELECT count(*) FROM jobpulse.gpu_samples WHERE job_id IS NULL"
                                        " AND ts > (SELECT start_time FROM jobpulse.jobs WHERE job_id = '4242')"
                                        " + interval '2 s'").fetchone()[0]
        assert (len(name), len(account), user) == (1024, 255, "alice") and name == "n" * 1024
        assert unattributed == 0
    finally:
        for pid in agents_on(control):
            os.kill(pid, signal.SIGTERM)
        stop_collector(c)


FLOODER = """
import json, socket, sys, time
path, seconds, kind = sys.argv[1], float(sys.argv[2]), sys.argv[3]
body = (json.dumps({"message": "m", "attrs": {"a": [{}] * 15_500}}) if kind == "objects" else
        json.dumps({"message": "m", "attrs": {str(i): 0 for i in range(5_400)}})).encode()
assert len(body) < 63_000
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        s.sendto(body, path)
    except OSError:  # the agent's queue is full: a flood sends on
        time.sleep(0.001)
"""


def test_events_held_for_unregistered_jobs_are_bounded_by_what_they_cost_in_memory(
        fake_nvml: Path, dsn: str, tmp_path: Path, open_dir: Path) -> None:
    """Hole: 20 users' processes claiming jobs that never register sent 62 KB datagrams of `[{},...]` or
    5,400-key objects; the agent counted them by datagram bytes while each cost ~30 times that parsed,
    and grew to 665 MiB. Now every event is counted by what it holds in memory, an event's attributes
    past 1,000 values are kept as their text, and what is read and handed on at once is bounded."""
    c = start_collector(dsn, tmp_path)
    scn = Scenario().gpu(0, "GPU-h0", "00000000:17:00.0", **FULL_H100).write(tmp_path / "s.scn")
    agent = start_agent(fake_nvml, scn, open_dir / "agent", "n1", collector=c.url, token=TOKEN)
    script = open_dir / "flood.py"
    script.write_text(FLOODER)
    since = datetime.now(UTC)
    try:
        (open_dir / "agent").chmod(0o755)
        python = "/usr/bin/python3" if ROOT and os.access("/usr/bin/python3", os.X_OK) else sys.executable  # stdlib only
        senders = [subprocess.Popen([python, str(script), str(agent.events_socket), "12",
                                     "objects" if i % 2 else "keys"],
                                    env={**os.environ, "SLURM_JOB_ID": str(7700 + i), "SLURM_PROCID": "0"},
                                    **({"user": NOBODY, "group": NOBODY} if ROOT else {}))  # type: ignore[arg-type]
                   for i in range(20)]
        while any(p.poll() is None for p in senders):
            time.sleep(0.5)
        status = Path(f"/proc/{agent.proc.pid}/status").read_text()
        peak = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) / 1024
        time.sleep(2)
        produced = agent.stop()
    finally:
        agent.kill_if_running()
        stop_collector(c)
    stored, dropped_gpu, dropped_events, _ = stored_and_reported(dsn)
    with psycopg.connect(dsn) as conn:
        secs = [r[0] for r in conn.execute("SELECT DISTINCT floor(extract(epoch FROM ts))::bigint"
                                           " FROM jobpulse.gpu_samples WHERE ts >= %s ORDER BY 1", (since,))]
        events = conn.execute("SELECT count(*) FROM jobpulse.events").fetchone()[0]
    gaps = secs[-1] - secs[0] + 1 - len(secs)
    print(f"\n20 users' held-event flood: agent peak RSS {peak:.0f} MiB; {gaps} of {len(secs)} seconds without a GPU "
          f"sample; events stored {events}, dropped and reported {dropped_events}")
    assert stored == produced["gpu_samples"] and dropped_gpu == 0
    assert peak <= 200 and gaps == 0
    assert events > 0 and dropped_events > 0, agent.log.read_text()[-6000:]
