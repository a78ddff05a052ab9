"""The hang rules on given statistics: survivors spinning at near-idle power after a rank or node
broke are one `hung` flag naming what broke (with and without GPM); with every rank alive the same
look is the `stalled` note (naming a rank that works on the host, such as one writing a checkpoint)
until it outlasts the job's collective timeout, the rules' or the job's own; what looks like it -- a
straggler the others wait for, a checkpoint, an evaluation pass, model loading, an idle inference
server, a short agent restart -- is not; a silent node is `node_lost` only while its job's others wait."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from jobpulse.collector.rules.engine import judge
from jobpulse.collector.rules.model import Block, GpuStats, JobView, ProcStats
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.store.read.rule_reads import DeclaredTimeout, LastStep, Phase, RankActivity, WorkedPower

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
T = Thresholds()
MINUTES = 21

# (duty %, SM activity % or None, power W, traffic KB/s, memory MiB)
WORK = (97.0, 80.0, 380.0, 90_000.0, 60_000)
SPIN = (100.0, 0.0, 80.0, 40.0, 60_000)
IDLE = (0.0, 0.0, 60.0, 30.0, 60_000)
GONE = (0.0, 0.0, 55.0, 30.0, 0)  # the rank exited: its memory released
LOAD = (4.0, 3.0, 70.0, 300_000.0, 30_000)
EVAL = (45.0, 40.0, 210.0, 40_000.0, 60_000)


def worked(level: float) -> dict[str, list[WorkedPower]]:
    """What the store reads of a job that may hang: its working power since it started."""
    return {"worked_power": [WorkedPower("c", "1", level)]}


def stepped(minute: datetime) -> dict[str, list[LastStep]]:
    return {"last_step": [LastStep("c", "1", minute)]}


def phase(name: str, began: datetime, ended: datetime | None) -> dict[str, list[Phase]]:
    return {"phases": [Phase("c", "1", name, began, ended)]}


def gpu(index: int, profile: list[tuple[float, float | None, float, float | None, int]], *, node: str = "n1",
        gpm: bool = True, reporting: bool = True, limit: float | None = 400.0) -> GpuStats:
    """A GPU whose minutes (oldest first) end at NOW (or, not reporting, where the profile ends)."""
    start = NOW - timedelta(minutes=MINUTES)
    blocks = []
    for i, (duty, sm, power, traffic, fb) in enumerate(profile):
        sm = sm if gpm else None
        act = sm if sm is not None else duty
        blocks.append(Block(start + timedelta(minutes=i), 60, 60 if act <= 5 else 0, 60 if act >= 50 else 0, act, sm,
                            None, fb, 0, power, duty, traffic, limit))
    last = blocks[-1].start + timedelta(seconds=59)
    return GpuStats("c", "1", "gpu", node, f"GPU-{node}-{index}", index, "NVIDIA A100", blocks[0].start, last,
                    NOW - timedelta(minutes=40), tuple(blocks), fb_total_mib=81_920, last_mem_mib=blocks[-1].fb_max,
                    ever_busy=True, reporting=reporting)


def then(*parts: tuple[int, tuple[float, float | None, float, float | None, int]]):  # type: ignore[no-untyped-def]
    return [p for n, p in parts for _ in range(n)]


def rules(view: JobView) -> list[tuple[str, str]]:
    return sorted((h.rule_id, h.scope_key) for h in judge(view, T))


def procs(gpus: list[GpuStats], dead: set[str] = frozenset()) -> list[ProcStats]:  # type: ignore[assignment]
    return [ProcStats(g.node, 100 + i, i, g.gpu_uuid, "python") for i, g in enumerate(gpus) if g.gpu_uuid not in dead]


def test_a_rank_that_exits_leaves_its_peers_spinning_one_flag_naming_it_without_gpm() -> None:
    gpus = [gpu(0, then((16, WORK), (5, GONE)), gpm=False)] + [
        gpu(i, then((16, WORK), (5, SPIN)), gpm=False) for i in range(1, 8)]
    view = JobView(gpus, procs=procs(gpus, {gpus[0].gpu_uuid}))
    found = judge(view, T)
    assert [(h.rule_id, h.scope_key) for h in found] == [("hung", "")]
    ev = found[0].evidence
    assert ev["broken"] == "rank" and ev["gpu"] == "n1/GPU0" and ev["spinning_gpus"] == 7
    assert "SM activity (GPM)" not in ev["evidence_used"] and "power" in ev["evidence_used"]
    assert found[0].started_at == NOW - timedelta(minutes=5)
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in found[0].advice


def test_with_gpm_the_hang_is_one_flag_not_an_idle_flag_per_gpu() -> None:
    gpus = [gpu(0, then((9, WORK), (12, GONE)))] + [gpu(i, then((9, WORK), (12, SPIN))) for i in range(1, 8)]
    found = judge(JobView(gpus, procs=procs(gpus, {gpus[0].gpu_uuid})), T)
    assert [h.rule_id for h in found] == ["hung"]
    assert "SM activity (GPM)" in found[0].evidence["evidence_used"]


def test_a_hang_longer_than_the_look_back_is_judged_by_the_jobs_working_power() -> None:
    gpus = [gpu(i, then((21, SPIN)), gpm=False) for i in range(4)]
    assert rules(JobView(gpus)) == []  # no working level seen: not judged
    assert rules(JobView(gpus, rows=worked(370.0))) == [("hung", "")]


def test_a_silent_node_is_named_and_is_node_lost() -> None:
    alive = [gpu(i, then((15, WORK), (6, SPIN)), gpm=False) for i in range(4)]
    dead = [gpu(i, then((15, WORK)), node="n2", gpm=False, reporting=False) for i in range(4)]
    found = {h.rule_id: h for h in judge(JobView(alive + dead), T)}
    assert set(found) == {"hung", "node_lost"}
    assert found["hung"].evidence["broken"] == "node" and found["hung"].evidence["node"] == "n2"
    assert found["node_lost"].scope_key == "n2" and found["node_lost"].category == "hardware"


def test_a_late_node_whose_peers_work_on_raises_nothing() -> None:
    alive = [gpu(i, then((21, WORK)), gpm=False) for i in range(4)]
    late = [gpu(i, then((15, WORK)), node="n2", gpm=False, reporting=False) for i in range(4)]
    assert rules(JobView(alive + late)) == []


def test_a_short_agent_restart_is_skipped_not_a_gap() -> None:
    """45 s without samples: a partial minute among working ones, on a GPU that keeps reporting."""
    restarted = [dataclasses.replace(x, blocks=tuple(dataclasses.replace(b, n=15) if k == 18 else b
                                                     for k, b in enumerate(x.blocks)))
                 for x in (gpu(i, then((21, WORK)), gpm=False) for i in range(2))]
    assert rules(JobView(restarted)) == []


def test_look_alikes_are_not_hung() -> None:
    straggler = [gpu(0, then((21, WORK)), gpm=False)] + [gpu(i, then((6, WORK), (15, SPIN)), gpm=False)
                                                         for i in range(1, 8)]
    assert "hung" not in {r for r, _ in rules(JobView(straggler))}
    checkpoint = [gpu(i, then((16, WORK), (4, IDLE), (1, WORK))) for i in range(4)]
    assert rules(JobView(checkpoint)) == []
    evaluation = [gpu(i, then((14, WORK), (7, EVAL))) for i in range(4)]
    assert "hung" not in {r for r, _ in rules(JobView(evaluation))}
    loading = [gpu(i, then((21, LOAD))) for i in range(4)]
    assert "hung" not in {r for r, _ in rules(JobView(loading))}
    server = [gpu(i, then((10, WORK), (11, IDLE))) for i in range(2)]
    assert "hung" not in {r for r, _ in rules(JobView(server))}
    working_a100 = [gpu(i, then((21, (99.0, None, 330.0, None, 60_000))), gpm=False, limit=None) for i in range(2)]
    assert rules(JobView(working_a100, rows=worked(340.0))) == []


def exited(minutes: int, n: int = 4, **over: object) -> JobView:
    """``n`` GPUs without GPM that worked; then GPU 0's rank exits (its process gone, its memory
    released) and the others spin for ``minutes``."""
    gpus = [gpu(0, then((MINUTES - minutes, WORK), (minutes, GONE)), gpm=False)] + [
        gpu(i, then((MINUTES - minutes, WORK), (minutes, SPIN)), gpm=False) for i in range(1, n)]
    return JobView(gpus, procs=procs(gpus, {gpus[0].gpu_uuid}), **over)  # type: ignore[arg-type]


def test_a_job_that_ended_hung_keeps_its_verdict_and_loses_no_node() -> None:
    """Cancelled or timed out while hung: the final cycle still sees the hang (no idle flags surface at
    the end); a node is not lost once its job has ended."""
    assert rules(exited(6, ended_at=NOW)) == [("hung", "")]
    gpus = exited(6).gpus
    dead = [gpu(i, then((15, WORK)), node="n2", gpm=False, reporting=False) for i in range(4)]
    assert rules(JobView(gpus + dead, ended_at=NOW)) == [("hung", "")]


def spinning_for(minutes: int) -> JobView:
    """Four GPUs without GPM that worked; GPU 0's rank exits and the 3 others spin for ``minutes`` (the
    rule's edge: three)."""
    return exited(minutes)


def alive_spinning_for(minutes: int) -> JobView:
    """Four GPUs without GPM that worked, then spin for ``minutes``, every rank's process alive (the
    note's edge: three)."""
    gpus = [gpu(i, then((MINUTES - minutes, WORK), (minutes, SPIN)), gpm=False) for i in range(4)]
    return JobView(gpus, procs=procs(gpus))


def node_silent(minutes: int) -> JobView:
    """n2 silent, n1's GPUs spinning ``minutes`` since, no working level seen: node_lost alone."""
    alive = [gpu(i, then((MINUTES - minutes, EVAL), (minutes, SPIN)), gpm=False) for i in range(2)]
    return JobView(alive + [gpu(i, then((MINUTES - minutes, EVAL)), node="n2", gpm=False, reporting=False)
                            for i in range(2)])


def test_steps_that_go_on_are_work_and_steps_that_stopped_are_evidence() -> None:
    assert rules(exited(6, rows=stepped(NOW - timedelta(minutes=1)))) == []
    found = judge(exited(6, rows=stepped(NOW - timedelta(minutes=7))), T)
    assert [h.rule_id for h in found] == ["hung"]
    assert "no step since 11:53" in found[0].evidence["evidence_used"]


def test_a_long_start_up_is_told_as_start_up_not_as_a_gpu_to_give_back() -> None:
    """A 1-minute GPU check, then 20 minutes loading: idle flags say start-up (stage the data), not
    "request fewer GPUs"; a GPU that worked for minutes before idling is not start-up."""
    start = NOW - timedelta(minutes=MINUTES)
    loading = [dataclasses.replace(gpu(i, then((1, WORK), (20, IDLE)), gpm=False), job_start=start) for i in range(2)]
    found = judge(JobView(loading), T)
    assert [(h.rule_id, h.scope, h.evidence["gpus_flagged"]) for h in found] == [("idle_gpu", "job", 2)]
    assert all(h.evidence.get("start_up") and "local disk" in h.advice and "fewer GPUs" not in h.advice
               for h in found)
    worked = [dataclasses.replace(gpu(i, then((6, WORK), (15, IDLE)), gpm=False), job_start=start) for i in range(2)]
    assert all("start_up" not in h.evidence and "fewer GPUs" in h.advice for h in judge(JobView(worked), T))


def test_a_gpu_that_fell_off_the_bus_is_named_beside_its_own_flag() -> None:
    """XID 79: the node's flag for the admins, and the hang for the owner naming the lost GPU."""
    lost = dataclasses.replace(gpu(3, then((15, WORK)), gpm=False, reporting=False),
                               xids={79: NOW - timedelta(minutes=6)}, lost_at=NOW - timedelta(minutes=6))
    waiting = [gpu(i, then((15, WORK), (6, SPIN)), gpm=False) for i in range(3)]
    found = {h.rule_id: h for h in judge(JobView([*waiting, lost]), T)}
    assert set(found) == {"hung", "xid_error", "gpu_lost"} - {"gpu_lost"}  # the XID explains the lost GPU
    assert found["hung"].evidence["broken"] == "gpu" and found["hung"].evidence["gpu"] == "n1/GPU3"
    assert "was lost (XID 79)" in found["hung"].advice


def test_a_declared_checkpoint_the_others_wait_for_is_not_a_hang_until_it_runs_too_long() -> None:
    """12 minutes of waiting, past the collective timeout: the declared phase explains it while it is
    shorter than hang_phase_minutes."""
    gpus = [gpu(0, then((9, WORK), (12, IDLE)), gpm=False)] + [gpu(i, then((9, WORK), (12, SPIN)), gpm=False)
                                                              for i in range(1, 4)]
    saving = JobView(gpus, rows=phase("final_checkpoint", NOW - timedelta(minutes=12), None))
    assert not {r for r, _ in rules(saving)} & {"hung", "stalled"}
    saved = JobView(gpus, rows=phase("final_checkpoint", NOW - timedelta(minutes=12), NOW - timedelta(minutes=1)))
    assert not {r for r, _ in rules(saved)} & {"hung", "stalled"}, "the ranks leave the barrier after the save"
    stuck = JobView(gpus, rows=phase("final_checkpoint", NOW - timedelta(minutes=31), None))
    assert rules(stuck) == [("hung", "")]
    assert rules(JobView(gpus, rows=phase("train", NOW - timedelta(minutes=12), None))) == [("hung", "")]


def writing(pid: int = 100, rank: int = 0, state: str = "R", write_bps: int = 150_000_000) -> RankActivity:
    """Rank 0's main process over the last minute: running and writing its checkpoint."""
    return RankActivity("c", "1", "n1", pid, rank, "GPU-n1-0", "python", NOW, state, 1.0, 60.0, 0, write_bps)


def barrier(minutes: int, **rows: list[object]) -> JobView:
    """2 nodes x 8 GPUs without GPM: rank 0 writes a checkpoint (its GPU quiet, memory held, its process
    alive and writing) while the 15 others spin in a barrier for ``minutes``."""
    gpus = [gpu(i % 8, then((MINUTES - minutes, WORK), (minutes, IDLE if i == 0 else SPIN)), node=f"n{1 + i // 8}",
                gpm=False) for i in range(16)]
    return JobView(gpus, procs=procs(gpus), rows={"rank_activity": [writing()], **rows})  # type: ignore[dict-item]


def test_a_checkpoint_barrier_with_every_rank_alive_is_a_note_naming_the_writer_until_the_timeout() -> None:
    """The weak form: no part broken, every rank alive, the stall shorter than the 10-minute default;
    rank 0 works on the host. Past the timeout the same look is the strong form."""
    found = judge(barrier(7), T)
    assert [(h.rule_id, h.severity) for h in found] == [("stalled", "info")]
    ev = found[0].evidence
    assert ev["form"] == "weak" and ev["timeout_minutes"] == 10.0 and ev["timeout_from"] == "hang_timeout_minutes"
    assert [(r["rank"], r["write_bps"]) for r in ev["working_ranks"]] == [(0, 150_000_000)]
    assert "rank 0 on n1 (python, state R, 60 % CPU) writes 150 MB/s" in found[0].advice
    assert found[0].started_at == NOW - timedelta(minutes=7) and ev["hang_at"] == (NOW + timedelta(minutes=3)).isoformat()
    idle_writer = barrier(7, rank_activity=[writing(write_bps=1_000)])
    assert judge(idle_writer, T)[0].evidence["working_ranks"] == [], "logging a few KB/s is not work"
    late = judge(barrier(12), T)
    assert [h.rule_id for h in late] == ["hung"]
    assert late[0].evidence["form"] == "strong" and late[0].evidence["basis"] == "timeout"
    assert "past the job's collective timeout of 10 min" in late[0].evidence["acts_on"]
    assert rules(alive_spinning_for(3)) == [("stalled", "")] and rules(alive_spinning_for(2)) == []


def test_the_job_declares_its_collective_timeout() -> None:
    def declared(value: str, minutes: int) -> list[object]:
        view = barrier(minutes, declared_timeout=[DeclaredTimeout("c", "1", value)])
        return [(h.rule_id, h.evidence["timeout_minutes"], h.evidence["timeout_from"]) for h in judge(view, T)]
    assert declared("30m", 12) == [("stalled", 30.0, "the job's tag collective_timeout=30m")]
    assert declared("300s", 6) == [("hung", 5.0, "the job's tag collective_timeout=300s")]
    assert declared("1h", 12)[0][:2] == ("stalled", 60.0)
    assert declared("soon", 6) == [("stalled", 10.0, "hang_timeout_minutes (the job's tag collective_timeout='soon' "
                                                     "is not a duration)")]


def test_a_broken_part_is_the_strong_form_at_once() -> None:
    """A rank whose process is a zombie has exited: the fast verdict, whatever the timeout."""
    found = judge(exited(4), T)
    assert [h.rule_id for h in found] == ["hung"]
    assert found[0].evidence["form"] == "strong" and found[0].evidence["basis"] == "broken part"
    assert found[0].evidence["acts_on"] == "the rank on n1/GPU0 exited (its memory released) first"
    zombie = barrier(4, rank_activity=[writing(state="Z", write_bps=0)])
    found = judge(zombie, T)
    assert [h.rule_id for h in found] == ["hung"] and found[0].evidence["how"] == "exited"
