"""The agent's pure parts on given input: /proc parsing, attribution, host lists, job-comment hooks,
the control protocol, the event datagram, the per-GPU schedule, the idle exit and the spool's memory
hold, and the prolog's light imports. No NVML, no network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobpulse.agent.attribution import Attributor, parse_cgroup
from jobpulse.agent.control import backlog
from jobpulse.agent.control.answer import JobControl
from jobpulse.agent.control.jobs import JobRegistry
from jobpulse.agent.idle_exit import IdleExit
from jobpulse.agent.nvml import Gpu, mib
from jobpulse.agent.procfs import IO_MAX, PAGE_SIZE, KeptFiles, ProcFs, StatFiles, parse_io
from jobpulse.agent.schedule import Schedule
from jobpulse.agent.shipping.batch import Batcher
from jobpulse.agent.shipping.spool import Spool
from jobpulse.agent.slurm import admin_comment
from jobpulse.agent.slurm.env import HookError, parse_hooks
from jobpulse.agent.slurm.hooks import expand_hostlist
from jobpulse.agent.slurm.sync import allocation, script_hash
from jobpulse.schema import control, event_datagram

CGROUP_V2 = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_3\n"


def fake_proc(root: Path, pid: int, *, comm: str = "py thon (x)", start: int = 5000, uid_env: str = "",
              cgroup: str = CGROUP_V2, env: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # pid (comm) state ppid ... : utime=14 stime=15 starttime=22 rss=24 processor=39
    fields = ["S"] + ["0"] * 50
    fields[11], fields[12], fields[19], fields[21], fields[36] = "300", "200", str(start), "10", "7"
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()) + b"\0")


def test_proc_stat_parses_a_comm_with_spaces_and_parentheses(tmp_path: Path) -> None:
    fake_proc(tmp_path, 11)
    stat = ProcFs(str(tmp_path)).stat(11)
    assert stat is not None
    assert (stat.comm, stat.cpu_ticks, stat.rss_bytes, stat.processor, stat.start_ticks) == (
        "py thon (x)", 500, 10 * PAGE_SIZE, 7, 5000)
    assert ProcFs(str(tmp_path)).stat(12) is None


def test_kept_stat_files_follow_their_process_and_close_when_it_exits() -> None:
    stats = StatFiles(ProcFs())
    proc = subprocess.Popen(["sleep", "30"])
    open_fds = len(os.listdir("/proc/self/fd"))
    try:
        first = stats.stat(proc.pid)
        again = stats.stat(proc.pid)  # from the kept descriptor
        assert first is not None and again is not None and first.start_ticks == again.start_ticks
        assert again.comm == "sleep" and len(os.listdir("/proc/self/fd")) == open_fds + 1
    finally:
        proc.kill()
        proc.wait()
    assert stats.stat(proc.pid) is None  # the kept descriptor fails (ESRCH); the PID is opened anew: gone
    assert len(os.listdir("/proc/self/fd")) == open_fds
    full = StatFiles(ProcFs(), limit=0)  # no descriptor kept: each read opens the file
    assert full.stat(os.getpid()) is not None and full.stat(os.getpid()) is not None


def test_kept_io_files_read_a_process_counters_anew_each_time(tmp_path: Path) -> None:
    """/proc/PID/io kept open: each read is the counters as they are now (a write moves wchar), and
    text that is not the kernel's two first lines reads as nothing."""
    io = KeptFiles(ProcFs(), "io", IO_MAX)
    before = parse_io(io.read(os.getpid()) or b"")
    (tmp_path / "f").write_bytes(b"x" * 100_000)
    after = parse_io(io.read(os.getpid()) or b"")
    assert before is not None and after is not None and after[1] - before[1] >= 100_000
    assert len(io._fds) == 1  # the descriptor kept, not opened per read
    assert parse_io(b"syscr: 1\nrchar: 2\n") is None and parse_io(b"rchar: x\nwchar: 1\n") is None
    assert parse_io(b"rchar: 5\nwchar: 7\nsyscr: 1\n") == (5, 7)


def test_environ_reads_only_the_names_asked_for(tmp_path: Path) -> None:
    fake_proc(tmp_path, 11, env={"SLURM_PROCID": "3", "SECRET": "x", "SLURM_JOB_ID": "4242"})
    assert ProcFs(str(tmp_path)).environ(11, frozenset({"SLURM_PROCID", "SLURM_JOB_ID"})) == {
        "SLURM_PROCID": "3", "SLURM_JOB_ID": "4242"}
    # A name is matched whole (not as the end of another), set twice the later one counts, and the
    # last variable needs no trailing NUL.
    (tmp_path / "11" / "environ").write_bytes(b"SLURM_PROCID=1\0MY_SLURM_JOB_ID=9\0SLURM_PROCID=2\0SLURM_JOB_ID=5")
    assert ProcFs(str(tmp_path)).environ(11, frozenset({"SLURM_PROCID", "SLURM_JOB_ID", "SLURM_LOCALID"})) == {
        "SLURM_PROCID": "2", "SLURM_JOB_ID": "5"}


@pytest.mark.parametrize(("text", "expected"), [
    (CGROUP_V2, ("4242", "0", 3)),
    ("12:devices:/slurm/uid_1000/job_77/step_batch/task_0\n", ("77", "batch", 0)),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", (None, None, None)),
])
def test_cgroup_paths_name_job_step_and_task(text: str, expected: tuple[object, ...]) -> None:
    assert parse_cgroup(text) == expected


def test_attribution_follows_the_cgroup_and_a_reused_pid_is_a_new_process(tmp_path: Path) -> None:
    me = os.getuid()
    fake_proc(tmp_path, 21, env={"SLURM_JOB_ID": "4242", "SLURM_PROCID": "5", "SLURM_LOCALID": "1"})
    att = Attributor(ProcFs(str(tmp_path)), lambda job: me if job in ("4242", "99") else None)
    owner = att.owner(21)
    assert owner is not None and (owner.job_id, owner.step, owner.rank, owner.local_rank) == ("4242", "0", 5, 1)
    # The rank ends; another process gets PID 21 (a later start time), outside any job.
    fake_proc(tmp_path, 21, start=9000, cgroup="0::/user.slice\n", env={"SLURM_JOB_ID": "4242"})
    (tmp_path / "21" / "environ").write_bytes(b"HOME=/root\0")
    assert att.owner(21) is None
    # A job's process of another user is not the job's.
    att_other = Attributor(ProcFs(str(tmp_path)), lambda job: me + 1)
    fake_proc(tmp_path, 22)
    assert att_other.owner(22) is None


def test_a_task_is_resolved_again_after_its_exec_and_a_renaming_process_keeps_one_entry(tmp_path: Path) -> None:
    me = os.getuid()
    att = Attributor(ProcFs(str(tmp_path)), lambda job: me if job == "4242" else None)
    # slurmstepd forked the task and runs the task prolog: its name and environment, no job yet
    fake_proc(tmp_path, 31, comm="slurmstepd", cgroup="0::/system.slice/slurmstepd.scope\n", env={"HOME": "/"})
    assert att.owner(31) is None
    fake_proc(tmp_path, 31, comm="python3", cgroup="0::/system.slice/slurmstepd.scope\n",
              env={"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3"})  # exec'd: same PID and start, the job's
    owner = att.owner(31)
    assert owner is not None and (owner.job_id, owner.rank) == ("4242", 3)
    for step in range(50):  # setproctitle-style renames: resolved again, one cache entry all along
        fake_proc(tmp_path, 31, comm=f"train step {step}", env={"SLURM_JOB_ID": "4242", "SLURM_PROCID": "3"})
        assert att.job_of(31) == "4242"
    assert len(att._cache) == 1
    att.forget(set())
    assert not att._cache


def test_memory_is_whole_mib_rounded_up_as_nvidia_smi_prints_it() -> None:
    assert [mib(0), mib(1), mib(2**20), mib(2**20 + 1), mib(644_939_776)] == [0, 1, 1, 2, 616]  # 615.06 MiB


@pytest.mark.parametrize(("spec", "hosts"), [
    ("n[1-3,7],gpu01", ["n1", "n2", "n3", "n7", "gpu01"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu[008-010]", ["gpu008", "gpu009", "gpu010"]),
    ("a,b", ["a", "b"]),
    ("", []),
])
def test_hostlist_expansion(spec: str, hosts: list[str]) -> None:
    assert expand_hostlist(spec) == hosts


def test_hostlist_with_a_bad_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="bad host list"):
        expand_hostlist("n[a-3]")


def test_job_comment_hooks() -> None:
    assert parse_hooks("jobpulse: off") == {"off": True}
    assert parse_hooks(None) == {}
    with pytest.raises(HookError, match="interval"):
        parse_hooks("jobpulse: interval=99999")
    hook = "https://hooks.slack.com/services/T0/B0/xyz"
    assert parse_hooks(f"jobpulse: tags=project:llm notify={hook}") == {"tags": {"project": "llm", "notify": hook}}
    for bad in ("http://hooks.slack.com/x", "https://a<b&c", "https://h/" + "x" * 600, "javascript:alert(1)"):
        with pytest.raises(HookError, match="notify must be an https"):
            parse_hooks(f"jobpulse: notify={bad}")


@pytest.mark.parametrize(("tres", "expected"), [
    ("cpu=8,mem=64G,node=2,billing=8,gres/gpu=4", {"cpus": 8, "mem_mib": 65536}),
    ("cpu=2,mem=1000M,node=1", {"cpus": 2, "mem_mib": 1000}),
    ("cpu=1,mem=1.5T", {"cpus": 1, "mem_mib": 1572864}),
    ("cpu=4,mem=512K", {"cpus": 4, "mem_mib": 0}),
    ("cpu=x,mem=lots", {}), ("", {}), (None, {}),
])
def test_cpus_and_memory_are_read_from_the_allocated_tres(tres: object, expected: dict[str, int]) -> None:
    assert allocation(tres) == expected


def test_the_script_hash_ignores_sbatch_lines_and_trailing_blanks() -> None:
    script = "#!/bin/bash\n#SBATCH --gres=gpu:4\n#SBATCH --mem=64G\nsrun python train.py  \n\n"
    assert script_hash(script) == script_hash("#!/bin/bash\n#SBATCH --gres=gpu:1\nsrun python train.py\n")
    assert script_hash(script) != script_hash(script.replace("train.py", "eval.py"))
    assert len(script_hash(script)) == 64


def test_the_admin_comment_survives_lower_casing_and_keeps_under_its_limit() -> None:
    summary = {"gpu_hours": {"held": 8.0, "used": 2.5, "wasted": {"idle": 5.1}},
               "gpus": [{"where": f"n{i}/GPU{j}", "busy_percent": (i * 37 + j * 11) % 97 + j / 10,
                         "memory_peak_mib": 1000 + (i * 7919 + j * 104_729) % 80_000}
                        for i in range(16) for j in range(8)],
               "flags": [{"rule": "idle_gpu", "where": "n1/GPU3"}], "sbatch": ["#SBATCH --gres=gpu:2"]}
    full = admin_comment.encode(summary, limit=100_000)
    assert admin_comment.decode(full.upper())["gpus"][-1] == ["n15/GPU7", 50.7, 52_888]  # any case decodes
    fitted = admin_comment.decode(admin_comment.encode(summary))  # 128 GPUs do not fit in 1,024
    assert fitted["gpus"] == [] and fitted["flags"] == [["idle_gpu", "n1/GPU3"]] and fitted["held"] == 8.0
    kept = f"jobpulse: cancelled, n1/GPU0 idle 2 h {full}"  # after the policy's reason, as the writer keeps it
    assert admin_comment.decode(kept) == admin_comment.decode(full)
    for bad in ("JS1:abc", "jp1:not-base32!", "jp1:" + "a" * 16, "", "xjp1:" + full[4:]):
        with pytest.raises(ValueError):
            admin_comment.decode(bad)


def test_control_messages_round_trip_and_bad_ones_are_named() -> None:
    reg = control.Register(job=control.job_spec(job_id="123_4", uid="1000", gpus="0,1", interval_s=0.5))
    assert control.decode_request(control.encode(reg)) == reg
    assert isinstance(control.decode_request(b'{"op": "status"}'), control.Status)
    # What prologs of this version send is exactly what older agents read: only the set keys.
    assert json.loads(control.encode(reg)) == {"op": "register", "job": {
        "job_id": "123_4", "uid": 1000, "gpus": "0,1", "interval_s": 0.5}}
    for bad, why in ((b'{"op": "reboot"}', "op"), (b'{"op": "unregister"}', "job_id"),
                     (b'{"op": "register", "job": {"job_id": "1", "extra": 1}}', "extra"),
                     (b"x" * (control.MAX_REQUEST_BYTES + 1), "exceeds")):
        with pytest.raises(control.BadRequest, match=why):
            control.decode_request(bad)


def test_event_datagram_parse() -> None:
    sent = event_datagram.build("step", "step 3", "loud", "step", {"step": 3}, 1767225600.5)
    got = event_datagram.parse(json.dumps(sent).encode())
    assert (got.kind, got.level, got.name, got.attrs, got.ts) == ("step", "info", "step", {"step": 3}, 1767225600.5)
    odd = event_datagram.parse(b'{"kind": "Bad Kind!", "message": 42, "attrs": [1], "ts": true}')
    assert (odd.kind, odd.message, odd.attrs, odd.ts) == ("log", "42", {"value": [1]}, None)
    for garbage, why in ((b"[1, 2]", "expected a JSON object, got list"), (b"not json", "Expecting value"),
                         (b"\xff\xfe", "Expecting value")):
        with pytest.raises(ValueError, match=why):
            event_datagram.parse(garbage)


def test_the_prolog_imports_nothing_heavy() -> None:
    """`python -m jobpulse.agent.slurm` runs on every node of every job under a hard timeout."""
    code = ("import sys; before = set(sys.modules); import jobpulse.agent.slurm.hooks; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(' '.join(sorted(new - set(sys.stdlib_module_names) - {'jobpulse'})))")
    extra = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert extra <= {"msgspec", "typing_extensions", "hostlist"}, extra  # hostlist: one pure module


def test_schedule_samples_a_fast_jobs_gpus_faster_without_bursts() -> None:
    fast = {"GPU-a": 0.5}
    s = Schedule(1.0, fast.get, lambda: list(fast.values()))
    assert s.tick_s() == 0.5
    due = [t for t in (0.0, 0.5, 1.0, 1.5) if s.gpu_due("GPU-a", t)]
    slow = [t for t in (0.0, 0.5, 1.0, 1.5) if s.gpu_due("GPU-b", t)]
    assert due == [0.0, 0.5, 1.0, 1.5] and slow == [0.0, 1.0]
    assert s.gpu_due("GPU-b", 10.0) and not s.gpu_due("GPU-b", 10.5)  # late: no catch-up burst


def test_ticks_fall_on_the_wall_clocks_grid_and_jitter_skips_no_sample() -> None:
    s = Schedule(1.0, lambda uuid: None, lambda: [])
    assert s.next_tick(1000.3) == pytest.approx(0.7)  # every node: the next whole second
    assert s.next_tick(1000.998) == pytest.approx(1.002)  # woke 2 ms early and sampled: not again at once
    assert s.next_tick(1002.8) == pytest.approx(0.2)  # the tick at 1002 took 0.8 s: the next one all the same
    assert s.next_tick(1004.3) == pytest.approx(0.7)  # 1003's took 1.3 s (1004 passed): the next ahead, no burst
    fast = Schedule(1.0, lambda uuid: None, lambda: [0.25])
    assert fast.next_tick(1000.3) == pytest.approx(0.2)  # a job's faster interval: its own grid
    assert fast.next_tick(1000.5 + 0.2) == pytest.approx(0.05)  # 0.2 s of sampling at 0.25 s: no tick lost
    # a tick that starts 30 ms late, then one 20 ms early: both sample (the old 10 ms slack skipped one)
    assert [t for t in (0.0, 1.03, 1.98, 3.0) if s.gpu_due("GPU-a", t)] == [0.0, 1.03, 1.98, 3.0]


def test_idle_exit_waits_for_the_last_batches() -> None:
    idle = IdleExit(True, flush_s=1.0, linger_s=60.0)
    assert not idle.done(jobs=0, spooled=0, now=100.0)
    assert idle.done(jobs=0, spooled=0, now=104.0)
    idle.busy()
    assert not idle.done(jobs=0, spooled=3, now=200.0) and not idle.done(jobs=0, spooled=3, now=230.0)
    assert idle.done(jobs=0, spooled=3, now=261.0)
    assert not IdleExit(False, 1.0, 60.0).done(jobs=0, spooled=0, now=1e9)


def test_spool_holds_batches_in_memory_while_the_disk_refuses_them(tmp_path: Path) -> None:
    folder = tmp_path / "spool"
    spool = Spool(folder, 10_000)
    spool.put(b"a" * 100, {"gpu_samples": 1})
    shutil.rmtree(folder)  # every write fails now, as on a full or read-only disk
    assert spool.put(b"b" * 100, {"gpu_samples": 2}) == {"gpu_samples": 0, "process_samples": 0, "events": 0,
                                                          "batches": 0}
    assert spool.held_in_memory() == 1 and len(spool) == 2
    item = spool.oldest()
    assert item is not None and item.counts["gpu_samples"] == 1
    spool.remove(item)
    assert spool.oldest().read() == b"b" * 100  # type: ignore[union-attr]  # shippable from memory
    folder.mkdir()
    spool.put(b"c" * 100, {"gpu_samples": 3})
    assert spool.held_in_memory() == 0 and len(list(folder.glob("*.json.gz"))) == 2


def test_a_registration_maps_slurm_indexes_by_minor_number_and_fills_defaults(tmp_path: Path) -> None:
    gpus = [Gpu(0, None, "GPU-a", "H100", "00000000:17:00.0", 1), Gpu(1, None, "GPU-b", "H100", "00000000:65:00.0", 0)]
    jobs = JobRegistry(gpus)
    batcher = Batcher("n1", "c1")
    handle = JobControl("n1", lambda: [g.uuid for g in gpus], jobs, Attributor(ProcFs(str(tmp_path)), jobs.uid_of),
                        batcher, lambda: 0, lambda: None)
    reply = handle(control.decode_request(b'{"op": "register", "job": {"job_id": "9", "uid": "1000", "gpus": "0"}}'))
    assert reply.ok and reply.gpus == ["GPU-b"]  # Slurm's GPU 0 is /dev/nvidia0: minor 0, NVML index 1
    ready = batcher.take()
    assert ready is not None
    record = ready.batch.jobs[0]
    assert record.start_time is not None and record.state is None and record.uid == 1000
    refused = handle(control.Register(job=control.job_spec(job_id="10", gpus=["7"])))
    assert not refused.ok and "no GPU '7'" in (refused.error or "")
    assert handle(control.Unregister(job_id="9", state="TIMEOUT")).ok and jobs.job_ids() == set()


def test_requests_left_in_the_queue_are_taken_in_order_once_their_hook_lets_go(tmp_path: Path) -> None:
    gpus = [Gpu(0, None, "GPU-a", "H100", "00000000:17:00.0", 0)]
    jobs = JobRegistry(gpus)
    handle = JobControl("n1", lambda: ["GPU-a"], jobs, Attributor(ProcFs(str(tmp_path)), jobs.uid_of),
                        Batcher("n1", "c1"), lambda: 0, lambda: None)
    sock = tmp_path / "agent.sock"
    stale = control.Register(job=control.job_spec(job_id="5", gpus="0"), sent=time.time())
    first = backlog.put(sock, control.Register(job=control.job_spec(job_id="5", gpus="0"), sent=time.time()))
    assert backlog.drain(sock, handle) == [] and jobs.job_ids() == set()  # its hook still tries the socket
    backlog.put(sock, control.Unregister(job_id="5", state="COMPLETED")).let_go()
    first.let_go()
    taken = backlog.drain(sock, handle)
    assert [(t.job, t.op, t.error) for t in taken] == [("5", "register", None), ("5", "unregister", None)]
    assert jobs.job_ids() == set() and backlog.waiting(sock, "5") == []
    # The prolog's own request, read from the socket's backlog after the job ended: refused, not a live job again.
    late = handle(stale)
    assert not late.ok and "stale" in (late.error or "") and jobs.job_ids() == set()
    assert handle(control.Register(job=control.job_spec(job_id="5", gpus="0"), sent=time.time())).ok  # requeued
    # What only root or the agent's user may leave: another's file is dropped unread.
    taken_back = backlog.put(sock, control.Unregister(job_id="5"))
    taken_back.take_back()
    status = backlog.queue_dir(sock) / "00000000000000000001-6.json"
    status.write_bytes(b'{"op": "status"}')
    expected = [(None, "a status request cannot wait")]
    if os.geteuid() == 0:  # a file another user left (as root only: a test user cannot give files away)
        foreign = backlog.queue_dir(sock) / "00000000000000000002-5.json"
        foreign.write_bytes(control.encode(control.Unregister(job_id="5")))
        os.chown(foreign, 65534, 65534)
        expected.append((None, "left by uid 65534, who may not control the agent"))
    assert [(t.op, t.error) for t in backlog.drain(sock, handle)] == expected
    assert jobs.job_ids() == {"5"} and not list(backlog.queue_dir(sock).iterdir())
    # Half-written by a hook killed before its rename: removed once surely abandoned, never read.
    old, fresh = backlog.queue_dir(sock) / "1-7.tmp", backlog.queue_dir(sock) / "2-7.tmp"
    old.write_bytes(b'{"op": "unreg')
    fresh.write_bytes(b'{"op": "unreg')
    os.utime(old, (time.time() - 2 * backlog.STALE_TMP_S,) * 2)
    assert backlog.drain(sock, handle) == [] and [p.name for p in backlog.queue_dir(sock).iterdir()] == [
        "2-7.tmp"]
