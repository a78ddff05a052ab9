"""A labelled library of simulated GPU jobs for judging the rules: what each job does second by
second (GPU samples, processes, health events, topology) and which flags a careful human, applying
each rule as documented, would raise -- where, and how many seconds after the job started the
evidence became sufficient.

Labels come from how such jobs behave in practice, not from the rule code:

* idle_gpu: >= 95 % of the last 10 min idle (activity <= 5 %: a keep-alive kernel now and then is idle),
  bursts do not reset it, and the newest minute is at least half idle (not raised once work resumed);
  onset + 10 min.
* over_allocation (job-wide): a GPU never busy since the start; job start + 10 min.
* low_utilization: a >= 3 min stretch after warm-up (2 min, longer while memory grows, at most 10;
  a rank whose memory was released and filled again warms up again) whose mean's upper bound
  (mean + 2 sd/sqrt(k) of whole minute means) is below 30 %; max(warm-up end, onset) + 3 min. Sparse
  work (the stretch >= 50 % idle samples) must last 10 min; a GPU going idle is idle_gpu instead.
* input_bound: stalls (every minute >= 25 % idle and >= 25 % busy) or low use, while the GPU's own
  rank's loader workers average >= 90 % CPU (or, without workers, its main process's threads keep
  >= 90 % of every CPU it may run on busy, or it sits at 90-110 % of one core while the GPU stalls);
  onset + 3 min.
* imbalance: a GPU below half the median of the job's other GPUs (median >= 40 %) for >= 3 min.
* held_back (job-wide): two thirds or more of a job's GPUs low while at most a third run at >= 40 %: one
  flag naming the busy few instead of low use on each waiting GPU; when both are evident (3 min). Without
  GPM, a GPU at busy utilization drawing under half the job's working power (the highest GPU's median
  busy power) counts at its utilization times that power share: it spins, waiting.
* xid_application: XID 45 alone within 2 min of the job's end (a cancellation's cleanup) is not one.
* no_tensor_cores: GPM SM activity >= 50 % with tensor activity < 1 % for >= 3 min after warm-up.
* memory_underused (job-wide): peak framebuffer share < 10 %, decided once each working GPU worked (idle in
  under half its samples) 5 whole minutes after its warm-up (2 min: job start + 7 min when busy throughout)
  where the peak is under 5 %, 10 minutes of work where it is nearer the bar.
* pcie_downgraded: the link below its max gen or width in >= half of >= 10 samples under load.
* hw_throttling: hardware slowdown in >= 10 % of the samples of a >= 3 min trailing stretch (the
  same bound as a mean, on each minute's share); onset + 3 min.
* hung (job-wide): every reporting GPU of a running multi-GPU job waits -- at least half spinning (duty
  cycle >= 80 % while SM activity <= 5 % where GPM measures it, traffic <= 5 MB/s where measured, power
  <= 40 % of its limit and under half the job's working level), the rest idle -- for 3 whole minutes;
  onset (the first whole minute all wait) + 3 min. Evidence names the broken node or rank.
  Strong only: a broken part seen (a node silent, a GPU's hardware fault, a rank whose process exited)
  -- onset + 3 min -- or every rank alive and the waiting as long as the job's collective timeout (10 min,
  or its tag collective_timeout) -- onset + the timeout.
* stalled (job-wide): the same waiting with every rank alive and shorter than the timeout: the note, onset
  + 3 min (the same flag as hung, which it becomes past the timeout). A checkpoint barrier that resumes.
* node_lost (scope_key = node): a node of a running multi-node job silent (no sample for 2 min) while the
  job's other GPUs wait since it fell silent: silence + 3 min. A late node or a 45 s agent restart: none.
* hw_throttling, xid_error, xid_application, gpu_lost, ecc_uncorrectable,
  ecc_correctable, topology_no_nvlink (scope_key = node), numa_far (scope_key = NODE/pidPID).

A hardware fault (xid_error, gpu_lost, ecc_uncorrectable) suppresses every utilization flag of its
job from then on: one cause, one flag.

Everything is deterministic: each scenario draws from ``random.Random(name)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from jobpulse.schema import wire

ALL_RULES = frozenset({
    "idle_gpu", "over_allocation", "low_utilization", "input_bound", "imbalance", "held_back", "no_tensor_cores",
    "memory_underused", "hw_throttling", "pcie_downgraded", "xid_error", "xid_application", "gpu_lost",
    "ecc_uncorrectable", "ecc_correctable", "topology_no_nvlink", "numa_far", "hung", "node_lost",
    "communication_bound", "fabric_degraded", "stalled",
})
UTILIZATION = frozenset({"idle_gpu", "over_allocation", "low_utilization", "input_bound", "imbalance", "held_back",
                         "no_tensor_cores", "memory_underused"})

H100 = ("NVIDIA H100 80GB HBM3", 81_559, 700.0, 5)  # model, framebuffer MiB, power limit W, PCIe gen
A100 = ("NVIDIA A100-SXM4-80GB", 81_920, 400.0, 4)
CORES = 64  # two sockets of 32

# Clock event reason bits (NVML).
GPU_IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x4, 0x8, 0x20, 0x40, 0x80


@dataclass(frozen=True)
class Expect:
    """A flag that must be raised: ``where`` is its scope_key (an fnmatch pattern; "" = job-wide).
    While a scenario is being defined, ``where`` may name a GPU, node or rank symbolically
    (``@gpu:NODE_I:INDEX``, ``@node:NODE_I``, ``@rank:NODE_I:LOCAL_RANK``); the scenario resolves it."""

    rule_id: str  # "a|b": one flag of either rule (one cause seen twice); a flag of the other is tolerated
    scope: str  # gpu | job | rank
    where: str
    evidence_at_s: float  # seconds after job start when the evidence is first sufficient


def on_gpu(rule: str, node_i: int, index: int, at: float) -> Expect:
    return Expect(rule, "gpu", f"@gpu:{node_i}:{index}", at)


def on_job(rule: str, at: float) -> Expect:
    return Expect(rule, "job", "", at)


def on_node(rule: str, node_i: int, at: float) -> Expect:
    return Expect(rule, "job", f"@node:{node_i}", at)


def on_rank(rule: str, node_i: int, local_rank: int, at: float) -> Expect:
    return Expect(rule, "rank", f"@rank:{node_i}:{local_rank}", at)


@dataclass(frozen=True)
class G:
    """One GPU of a job, with the rank that drives it."""

    node: str
    node_i: int
    index: int  # NVML index on the node
    uuid: str
    rank: int
    local_rank: int
    node_gpus: int  # GPUs on the node (for CPU affinity)


Act = Callable[[G, int, random.Random], "float | None"]  # activity % at second t; None = no sample
Record = tuple[str, Any]  # (node, wire record)
Fabric = Callable[[int, int, random.Random], list[dict[str, Any]]]  # node_i, second -> its ports' values


# ---------------------------------------------------------------------------------------- activity


def clip(x: float, lo: float = 0.0, hi: float = 100.0) -> float:
    return max(lo, min(x, hi))


def steady(level: float, sd: float = 3.0) -> Act:
    return lambda g, t, r: clip(r.gauss(level, sd), 3.0 if level >= 10 else 0.0)


def idle() -> Act:
    return lambda g, t, r: r.uniform(0.0, 0.6)


def loading(peak: float = 8.0) -> Act:
    """Reading a checkpoint, building the model: a few copies and kernels, mostly waiting."""
    return lambda g, t, r: r.uniform(0.0, peak)


def noisy(level: float, sec_sd: float, minute_sd: float, lo: float = 0.0, hi: float = 100.0) -> Act:
    drift: dict[tuple[str, int], float] = {}

    def act(g: G, t: int, r: random.Random) -> float:
        key = (g.uuid, t // 60)
        if key not in drift:
            drift[key] = r.gauss(0, minute_sd)
        return clip(r.gauss(level + drift[key], sec_sd), lo, hi)
    return act


def stalls(busy_share: float = 0.5, level: float = 88.0, period: int = 10) -> Act:
    """Bursts of work with gaps between them: in every ``period`` s, about busy_share of it busy."""
    n_busy = round(busy_share * period)

    def act(g: G, t: int, r: random.Random) -> float:
        phase = t % period
        busy = phase < n_busy
        if r.random() < 0.06:
            busy = not busy
        return clip(r.gauss(level, 4)) if busy else r.uniform(0.0, 0.8)
    return act


def phases(*parts: tuple[float, Act]) -> Act:
    """Piecewise: each part (start_s, act) holds from its start to the next part's."""
    starts = [s for s, _ in parts]

    def act(g: G, t: int, r: random.Random) -> float | None:
        i = len(starts) - 1
        while starts[i] > t:
            i -= 1
        return parts[i][1](g, t, r)
    return act


def trained(act: Act, load_s: int = 75) -> Act:
    """``load_s`` of loading, then ``act``."""
    return phases((0, loading()), (load_s, act))


def per_gpu(default: Act, **by: Act) -> Act:
    """Per GPU: keys ``g{node_i}_{index}``."""
    return lambda g, t, r: by.get(f"g{g.node_i}_{g.index}", default)(g, t, r)


def with_gaps(base: Act, every: int, length: int, first: int, gap: Act | None = None) -> Act:
    """``base``, but ``gap`` (idle) for ``length`` s every ``every`` s from ``first``."""
    gap = gap or idle()
    return lambda g, t, r: gap(g, t, r) if t >= first and (t - first) % every < length else base(g, t, r)


def stops_at(base: Act, at: int, which: set[str] | None = None) -> Act:
    """No samples after ``at`` (for GPUs ``g{node_i}_{index}`` in which; all when None)."""
    return lambda g, t, r: None if t >= at and (which is None or f"g{g.node_i}_{g.index}" in which) \
        else base(g, t, r)


# ------------------------------------------------------------------------------------- processes


@dataclass
class Procs:
    """The processes of one rank: its GPU process ("python") and its loader workers."""

    workers: int | Callable[[G, int], int] = 2
    worker_cpu: Callable[[G, int, random.Random], float] = lambda g, t, r: clip(r.gauss(42, 8), 1, 100)
    main_cpu: Callable[[G, int, random.Random, float], float] = \
        lambda g, t, r, a: clip(r.gauss(106, 7), 1, 400)
    generation: Callable[[G, int], int] = lambda g, t: 0  # a restart gives the rank new PIDs
    alive: Callable[[G, int], bool] = lambda g, t: True
    far_share: Callable[[G], float] = lambda g: 0.0  # share of samples the GPU process runs on far CPUs
    workers_start_s: int = 75  # loader workers start with the first iteration
    cpus_allowed: int | None = 8  # the CPUs Slurm gave each task (its processes' affinity)
    # What /proc says the GPU process does (no random draws: the library's other numbers stay as they were):
    # its state letter and its read and write rates through system calls, B/s (a training rank logs a little).
    state: Callable[[G, int], str] = lambda g, t: "R"
    io_read: Callable[[G, int], int] = lambda g, t: 0
    io_write: Callable[[G, int], int] = lambda g, t: 4_096


# ---------------------------------------------------------------------------------------- scenario


@dataclass
class Scenario:
    name: str
    description: str
    minutes: float
    gpus: list[list[int]]  # NVML indices the job holds, per node
    act: Act
    expect: list[Expect] = field(default_factory=list)
    forbid: frozenset[str] = ALL_RULES
    state: str = "COMPLETED"
    gpu: tuple[str, int, float, int] = H100
    gpm: bool = True
    tensor: Callable[[G, int, random.Random, float], float] | None = None
    fb_peak: Callable[[G], int] | int = 60_000
    fb: Callable[[G, int, random.Random], int] | None = None
    fb_ramp_s: int = 70
    procs: Procs = field(default_factory=Procs)
    tweak: Callable[[G, int, random.Random, dict[str, Any]], None] | None = None
    events: list[tuple[int, int, int, str, int | None, str]] = field(default_factory=list)  # s, node_i, index, kind, code, msg
    app_events: list[tuple[int, str, str]] = field(default_factory=list)  # s, kind, name (rank 0)
    node_gpus: int = 0  # GPUs on each node; 0: as many as the job holds (max 8)
    topology: str | None = None  # nvswitch | nvlink_pairs | pcie: send a topology snapshot
    agent_restarts: list[tuple[int, int, int]] = field(default_factory=list)  # node_i, silent from s, back at s
    fabric: Fabric | None = None  # the RDMA ports of each node, second by second (the fabric block below)
    tags: dict[str, str] = field(default_factory=dict)  # the job's tags (its comment's), beside "scenario"
    suspended: list[tuple[int, int]] = field(default_factory=list)  # (from s, to s): Slurm held the job suspended
    nodes: list[str] = field(default_factory=list)  # filled by the library
    job_id: str = ""
    pid_base: int = 0
    uuid_key: str = ""  # GPU UUIDs are GPU-{uuid_key or job_id}-{node_i}-{index}
    _started: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)  # (GPU, generation) -> first s

    # ------------------------------------------------------------------ identities
    def uuid(self, node_i: int, index: int) -> str:
        return f"GPU-{self.uuid_key or self.job_id}-{node_i}-{index}"

    def main_pid(self, local_rank: int, generation: int = 0) -> int:
        return self.pid_base + 20 * local_rank + 10 * generation

    @property
    def duration_s(self) -> int:
        return round(self.minutes * 60)

    @property
    def gpus_total(self) -> int:
        return sum(len(x) for x in self.gpus)

    def all_gpus(self) -> list[G]:
        out, rank = [], 0
        for node_i, indices in enumerate(self.gpus):
            n_node = self.node_gpus or max(len(indices), max(indices) + 1)
            for local, index in enumerate(indices):
                out.append(G(self.nodes[node_i], node_i, index, self.uuid(node_i, index), rank, local, n_node))
                rank += 1
        return out

    def resolve(self, e: Expect) -> Expect:
        parts = e.where.split(":")
        if parts[0] == "@gpu":
            n, i = int(parts[1]), int(parts[2])
            where = f"{self.nodes[n]}/{self.uuid(n, i)}"
        elif parts[0] == "@node":
            where = self.nodes[int(parts[1])]
        elif parts[0] == "@rank":
            n, lr = int(parts[1]), int(parts[2])
            where = f"{self.nodes[n]}/pid{self.main_pid(lr)}"
        else:
            return e
        return Expect(e.rule_id, e.scope, where, e.evidence_at_s)

    def expected(self) -> list[Expect]:
        return [self.resolve(e) for e in self.expect]

    # ------------------------------------------------------------------ records
    def job_record(self, node_i: int, t0: datetime, end: bool) -> wire.JobRecord:
        return wire.JobRecord(
            job_id=self.job_id, user_name=f"u{int(self.job_id) % 17}", uid=20_000 + int(self.job_id) % 17,
            account="ml", partition="gpu", job_name=self.name, nodes=list(self.nodes), gpus_total=self.gpus_total,
            time_limit_s=4 * 3600, submit_time=t0 - timedelta(minutes=3), start_time=t0,
            end_time=t0 + timedelta(seconds=self.duration_s) if end else None,
            state=self.state if end else "RUNNING", exit_code=(0 if self.state == "COMPLETED" else 1) if end else None,
            tags={"scenario": self.name, **self.tags},
            gpus=[wire.JobGpu(self.uuid(node_i, i), i) for i in self.gpus[node_i]])

    def state_records(self, t0: datetime) -> list[tuple[int, wire.JobRecord]]:
        """What slurm-sync says when Slurm suspends and resumes the job: (second, record of its first node)."""
        return [(at, wire.JobRecord(job_id=self.job_id, state=state, state_since=t0 + timedelta(seconds=at)))
                for a, b in self.suspended for at, state in ((a, "SUSPENDED"), (b, "RUNNING"))]

    def topology_records(self, t0: datetime) -> list[Record]:
        if not self.topology:
            return []
        out: list[Record] = []
        model, _, _, gen = self.gpu
        for node_i, node in enumerate(self.nodes):
            n = self.node_gpus or len(self.gpus[node_i])
            uuids = [self.uuid(node_i, i) for i in range(n)]
            for i in range(n):
                links = {uuids[j]: link(self.topology, i, j, n) for j in range(n) if j != i}
                lo, hi = affinity(i, n)
                out.append((node, wire.TopologyGpu(
                    ts=t0 - timedelta(minutes=5), gpu_uuid=uuids[i], gpu_index=i,
                    pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0", model=model, driver_version="550.90.07",
                    cuda_version="12.4", numa_node=socket(i, n), cpu_affinity=f"{lo}-{hi}", pcie_gen_max=gen,
                    pcie_width_max=16, nvlinks_up={"nvswitch": 18, "nvlink_pairs": 4}.get(self.topology, 0),
                    mig_mode=False, links=links, p2p={u: "OK" for u in links})))
        return out

    def generate(self, t0: datetime) -> Iterator[list[Record]]:
        """One list of records per second of the job, from its start."""
        r = random.Random(self.name)
        gpus = self.all_gpus()
        _, fb_total, power_limit, gen_max = self.gpu
        events = sorted(self.events)
        app = sorted(self.app_events)
        sbe = {g.uuid: 0 for g in gpus}
        for t in range(self.duration_s):
            ts = t0 + timedelta(seconds=t)
            out: list[Record] = []
            for g in gpus:
                if any(n == g.node_i and at <= t < back for n, at, back in self.agent_restarts):
                    continue  # the node's agent is restarting: nothing sampled
                a = self.act(g, t, r)
                if a is not None:
                    out.append((g.node, self._gpu_sample(g, t, ts, r, a, fb_total, power_limit, gen_max, sbe)))
                out.extend(self._processes(g, t, ts, r, a))
            if self.fabric:
                out.extend((self.nodes[n], wire.FabricSample(ts=ts, job_id=self.job_id, **d))
                           for n in range(len(self.nodes)) for d in self.fabric(n, t, r))
            while events and events[0][0] <= t:
                s, node_i, index, kind, code, msg = events.pop(0)
                out.append((self.nodes[node_i], wire.HealthEvent(
                    ts=t0 + timedelta(seconds=s), kind=kind, gpu_uuid=self.uuid(node_i, index), job_id=self.job_id,
                    code=code, message=msg, attrs={"pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0"})))
            while app and app[0][0] <= t:
                s, kind, name = app.pop(0)
                out.append((self.nodes[0], wire.AppEvent(
                    ts=t0 + timedelta(seconds=s), pid=self.main_pid(0), level="info", kind=kind,
                    uid=20_000 + int(self.job_id) % 17, job_id=self.job_id, step="0", rank=0, local_rank=0,
                    name=name, message=f"{name} {kind.split('_')[-1]}")))
            yield out

    def _fb(self, g: G, t: int, r: random.Random) -> int:
        """Memory the rank holds: none while its process is gone (a dead process frees its memory),
        filling up again over fb_ramp_s after each (re)start."""
        if self.fb is not None:
            return self.fb(g, t, r)
        if not self.procs.alive(g, t):
            return 0
        started = self._started.setdefault((g.uuid, self.procs.generation(g, t)), t)
        peak = self.fb_peak(g) if callable(self.fb_peak) else self.fb_peak
        return round(peak * min(1.0, (t - started + 1) / self.fb_ramp_s))

    def _gpu_sample(self, g: G, t: int, ts: datetime, r: random.Random, a: float, fb_total: int,
                    power_limit: float, gen_max: int, sbe: dict[str, int]) -> Any:
        busy = a >= 20
        sm = 0 if a <= 1 else round(clip(a * 1.12 + 4)) if self.gpm else round(a)
        tensor = None
        if self.gpm:
            tensor = self.tensor(g, t, r, a) if self.tensor else (clip(a * 0.48 + r.gauss(0, 2)) if a > 2 else 0.0)
        reasons = GPU_IDLE if a <= 2 else (SW_POWER_CAP if r.random() < 0.25 else 0)
        d: dict[str, Any] = {
            "ts": ts, "gpu_uuid": g.uuid, "gpu_index": g.index, "job_id": self.job_id, "sm_util": sm,
            "mem_util": round(clip(a * 0.45 + r.gauss(0, 2))), "enc_util": 0, "dec_util": 0,
            "power_w": round(68 + (power_limit - 90) * a / 100 + r.gauss(0, 6), 1), "power_limit_w": power_limit,
            "gpu_temp_c": round(32 + 0.35 * a + r.gauss(0, 1)), "mem_temp_c": round(38 + 0.3 * a),
            "sm_clock_mhz": 1980 if busy else 345, "mem_clock_mhz": 2619, "sm_clock_max_mhz": 1980,
            "mem_clock_max_mhz": 2619, "fb_used_mib": self._fb(g, t, r), "fb_total_mib": fb_total,
            "pcie_rx_kbs": round(a * 900 + r.uniform(0, 500)), "pcie_tx_kbs": round(a * 300 + r.uniform(0, 200)),
            "pcie_gen": gen_max if sm >= 10 else 1, "pcie_width": 16, "pcie_gen_max": gen_max, "pcie_width_max": 16,
            "pcie_replay": 0, "clock_event_reasons": reasons, "ecc_sbe_total": sbe[g.uuid], "ecc_dbe_total": 0,
            "remapped_correctable": 0, "remapped_uncorrectable": 0, "remap_pending": False, "remap_failure": False,
        }
        if self.gpm:
            d.update(gpm_sm_active=round(a, 2), gpm_sm_occupancy=round(a * 0.4, 2), gpm_tensor_active=round(tensor, 2),
                     gpm_dram_bw=round(clip(a * 0.5 + r.gauss(0, 2)), 2),
                     gpm_fp16_active=round(tensor * 0.2, 2), gpm_fp32_active=round(a * 0.1, 2), gpm_fp64_active=0.0)
        if self.tweak:
            self.tweak(g, t, r, d)
        return wire.GpuSample(**d)

    def _processes(self, g: G, t: int, ts: datetime, r: random.Random, a: float | None) -> list[Record]:
        p = self.procs
        if not p.alive(g, t):
            return []
        gen = p.generation(g, t)
        pid = self.main_pid(g.local_rank, gen)
        lo, hi = affinity(g.index, g.node_gpus)
        if r.random() < p.far_share(g):
            cpu = r.randint(0, CORES - 1)
            while lo <= cpu <= hi:
                cpu = r.randint(0, CORES - 1)
        else:
            cpu = r.randint(lo, hi)
        act = a or 0.0
        common: dict[str, Any] = {"job_id": self.job_id, "step": "0", "rank": g.rank, "local_rank": g.local_rank}
        out: list[Record] = [(g.node, wire.ProcessSample(
            ts=ts, pid=pid, gpu_uuid=g.uuid if a is not None else None, gpu_mem_mib=max(0, self._fb(g, t, r) - 520),
            sm_util=round(clip(act * 1.1)), mem_util=round(clip(act * 0.45)), cpu_percent=round(p.main_cpu(g, t, r, act), 1),
            rss_mib=14_000 + g.local_rank * 37, command="python", cpu=cpu, cpus_allowed=p.cpus_allowed,
            state=p.state(g, t), io_read_bps=p.io_read(g, t), io_write_bps=p.io_write(g, t), **common))]
        n = p.workers(g, t) if callable(p.workers) else (p.workers if t >= p.workers_start_s else 0)
        for k in range(n):
            out.append((g.node, wire.ProcessSample(
                ts=ts, pid=pid + 1 + k, gpu_uuid=None, cpu_percent=round(p.worker_cpu(g, t, r), 1),
                rss_mib=2_300, command="pt_data_worker", cpu=r.randint(0, CORES - 1), cpus_allowed=p.cpus_allowed,
                state="R", io_read_bps=0, io_write_bps=0, **common)))
        return out


def socket(index: int, node_gpus: int) -> int:
    return 0 if node_gpus < 2 else index * 2 // node_gpus


def affinity(index: int, node_gpus: int) -> tuple[int, int]:
    s = socket(index, node_gpus)
    return s * 32, s * 32 + 31


def link(kind: str, i: int, j: int, n: int) -> str:
    if kind == "nvswitch":
        return "NV18"
    if kind == "nvlink_pairs" and i // 2 == j // 2:
        return "NV12"
    if socket(i, n) != socket(j, n):
        return "SYS"
    return "NODE" if kind == "nvlink_pairs" else "PHB"


# ------------------------------------------------------------------------------------ the library


def _saturated(level: float = 97.0, sd: float = 1.5) -> Callable[[G, int, random.Random], float]:
    return lambda g, t, r: clip(r.gauss(level, sd), 1, 100)


def _fp32(g: G, t: int, r: random.Random, a: float) -> float:
    return r.uniform(0.0, 0.35)


def _thermal(uuid_suffix: str, start: int) -> Callable[[G, int, random.Random, dict[str, Any]], None]:
    def tweak(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
        if g.uuid.endswith(uuid_suffix) and t >= start and (t % 10) < 3:
            d["clock_event_reasons"] |= HW_THERMAL
            d["sm_clock_mhz"] = 1410
            d["gpu_temp_c"] = 88
    return tweak


def _pcie_gen3x8(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
    d["pcie_gen"] = 3 if d["sm_util"] >= 10 else 1
    d["pcie_width"] = 8


def _sw_throttle(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
    if d["sm_util"] >= 50:
        d["clock_event_reasons"] = (SW_POWER_CAP if r.random() < 0.6 else 0) | (SW_THERMAL if r.random() < 0.15 else 0)


def _sbe(rate_per_min: float, start: int, base: int) -> Callable[[G, int, random.Random, dict[str, Any]], None]:
    def tweak(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
        if g.index == 0:
            d["ecc_sbe_total"] = base + (int((t - start) * rate_per_min / 60) if t >= start else 0)
    return tweak


def _dbe_at(at: int) -> Callable[[G, int, random.Random, dict[str, Any]], None]:
    def tweak(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
        if g.index == 0 and t >= at:
            d.update(ecc_dbe_total=1, remapped_uncorrectable=1, remap_pending=True)
    return tweak


def _remap_pending(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
    if g.index == 1:
        d.update(remapped_uncorrectable=1, remap_pending=True)


def _restart(rank_index: str, at: int, back: int) -> tuple[Act, Procs]:
    """Rank on GPU ``rank_index`` dies at ``at`` and is back (new PIDs) at ``back``."""
    busy = trained(steady(86))

    def act(g: G, t: int, r: random.Random) -> float | None:
        if f"g{g.node_i}_{g.index}" == rank_index and at <= t < back:
            return idle()(g, t, r)
        if f"g{g.node_i}_{g.index}" == rank_index and back <= t < back + 60:
            return loading()(g, t, r)
        return busy(g, t, r)
    procs = Procs(generation=lambda g, t: int(f"g{g.node_i}_{g.index}" == rank_index and t >= back),
                  alive=lambda g, t: not (f"g{g.node_i}_{g.index}" == rank_index and at <= t < back))
    return act, procs


def library() -> list[Scenario]:
    """Every labelled scenario, with job ids, nodes and PID ranges assigned."""
    S = Scenario
    busy = trained(steady(86))
    lst: list[Scenario] = []

    # --- healthy jobs of many shapes: nothing may be raised -----------------------------------
    lst += [
        S("h1_bf16", "1 GPU bf16 fine-tuning, tensor cores busy, 2 loader workers", 30, [[0]], busy,
          fb_peak=62_000),
        S("h2_ddp", "2-GPU DDP training", 25, [[0, 1]], trained(steady(84, 4)), fb_peak=55_000),
        S("h4_ddp", "4-GPU DDP training, 4 workers per rank", 35, [[0, 1, 2, 3]], trained(steady(88)),
          procs=Procs(workers=4, worker_cpu=lambda g, t, r: clip(r.gauss(55, 10), 1, 100))),
        S("h8_nvswitch", "8-GPU HGX node, NVSwitch, FSDP bf16", 40, [list(range(8))], trained(steady(91, 2)),
          fb_peak=74_000, topology="nvswitch"),
        S("h2x4_multinode", "2 nodes x 4 GPUs, NCCL over InfiniBand", 40, [[0, 1, 2, 3], [0, 1, 2, 3]],
          trained(steady(80, 4)), node_gpus=4),
        S("h_compile_warmup", "torch.compile and sharded-checkpoint load for 5 min at low use (memory growing), "
          "then busy", 30, [[0, 1, 2, 3]],
          phases((0, lambda g, t, r: r.uniform(15, 35) if (t // 7) % 2 else r.uniform(0, 2)), (300, steady(88))),
          fb=lambda g, t, r: round(70_000 * min(1.0, (t + 1) / 300)), procs=Procs(workers_start_s=300)),
        S("h_checkpoint_90s", "2-GPU training, 90 s idle for a checkpoint every 10 min", 40, [[0, 1]],
          with_gaps(busy, 600, 90, 600), app_events=[(s, k, "checkpoint") for c in (600, 1200, 1800)
                                                    for s, k in ((c, "phase_start"), (c + 90, "phase_end"))]),
        S("h_checkpoint_2min", "1 GPU, 2 min checkpoint every 10 min", 40, [[0]], with_gaps(busy, 600, 120, 540)),
        S("h_eval_passes", "4-GPU training with a 90 s evaluation pass at ~40 % every 8 min", 35, [[0, 1, 2, 3]],
          with_gaps(busy, 480, 90, 480, gap=steady(42, 5)),
          app_events=[(s, k, "eval") for c in (480, 960, 1440, 1920) for s, k in ((c, "phase_start"), (c + 90, "phase_end"))]),
        S("h_short_6min", "1 GPU, a 6-minute run that finishes", 6, [[0]], busy),
        S("h_short_lowmem_6min", "2 GPUs, 2.5 GB each, finishes after 6 min (before a memory verdict)", 6,
          [[0, 1]], busy, fb_peak=2_500),
        S("h_shared_a", "4 GPUs of a node shared with another job", 30, [[0, 1, 2, 3]], trained(steady(87)),
          node_gpus=8, topology="nvswitch"),
        S("h_shared_b", "the other 4 GPUs of that node, another user", 35, [[4, 5, 6, 7]], trained(steady(82, 4)),
          node_gpus=8, procs=Procs(workers=3, worker_cpu=lambda g, t, r: clip(r.gauss(70, 8), 1, 100))),
        S("h_rank_restart", "4 GPUs; rank 2 crashes at 15 min, is restarted with new PIDs 90 s later",
          30, [[0, 1, 2, 3]], _restart("g0_2", 900, 990)[0], procs=_restart("g0_2", 900, 990)[1]),
        S("h_inference_service", "an inference server: moderate request load in bursts, short lulls, idle CPU",
          40, [[0]], trained(with_gaps(stalls(0.6, 82), 300, 45, 200)), fb_peak=72_000,
          procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(22, 6), 1, 100))),
        S("h_a100_nogpm", "2 A100s without GPM, fp32, 96 % duty cycle (tensor use not measurable)", 30, [[0, 1]],
          trained(steady(96, 2)), gpu=A100, gpm=False),
        S("h_topo_nvlink_pair", "2 GPUs that are an NVLink pair on an NVLink-pairs node", 30, [[2, 3]], busy,
          node_gpus=8, topology="nvlink_pairs"),
        S("h_topo_pcie_only", "2 GPUs across sockets on a PCIe-only node (no NVLink anywhere)", 30, [[0, 3]], busy,
          node_gpus=4, topology="pcie", gpu=A100, gpm=False),
        S("h_mem_grows", "6 GB for 8 min, then a larger stage at 45 GB", 30, [[0]], busy,
          fb=lambda g, t, r: 6_000 if t < 480 else 45_000),
        S("h_sbe_few", "a handful of corrected ECC errors", 30, [[0]], busy,
          tweak=lambda g, t, r, d: d.update(ecc_sbe_total=3 + t // 300)),
        S("h_sw_powercap", "2 GPUs at their power cap (software slowdown bits only)", 30, [[0, 1]],
          trained(steady(93, 2)), tweak=_sw_throttle),
        S("h_numa_occasional", "rank 1 runs on the far socket in 15 % of samples only", 30, [[0, 1]], busy,
          topology="nvswitch", procs=Procs(far_share=lambda g: 0.15 if g.local_rank == 1 else 0.0)),
    ]

    # --- idle ------------------------------------------------------------------------------------
    never = idle()
    lst += [
        S("idle_overalloc_4of2", "4 GPUs requested, the code uses 2 (GPUs 2 and 3 never busy)", 30,
          [[0, 1, 2, 3]], per_gpu(busy, g0_2=never, g0_3=never),
          fb=lambda g, t, r: 0 if g.index >= 2 else round(60_000 * min(1.0, (t + 1) / 70)),
          procs=Procs(alive=lambda g, t: g.index < 2),
          expect=[on_job("over_allocation", 600)], forbid=ALL_RULES - {"over_allocation"}),
        S("idle_overalloc_8of1", "8 GPUs requested, single-GPU code", 30, [list(range(8))],
          per_gpu(never, g0_0=busy), fb=lambda g, t, r: 0 if g.index else round(60_000 * min(1.0, (t + 1) / 70)),
          procs=Procs(alive=lambda g, t: g.index == 0),
          expect=[on_job("over_allocation", 600)], forbid=ALL_RULES - {"over_allocation"}),
        S("idle_midrun_2gpu", "training ends at 12 min, the job sits idle holding the GPUs", 35, [[0, 1]],
          phases((0, busy), (720, never)),
          procs=Procs(main_cpu=lambda g, t, r, a: clip(r.gauss(106, 7)) if t < 720 else r.uniform(0, 2),
                      workers=lambda g, t: 2 if 75 <= t < 720 else 0),
          expect=[on_job("idle_gpu", 1320)], forbid=ALL_RULES - {"idle_gpu"}),
        S("idle_one_of_4", "4 independent tasks, the one on GPU 3 finishes at 8 min", 30, [[0, 1, 2, 3]],
          per_gpu(busy, g0_3=phases((0, busy), (480, never))),
          procs=Procs(alive=lambda g, t: not (g.index == 3 and t >= 480)),
          fb=lambda g, t, r: 0 if g.index == 3 and t >= 480 else round(60_000 * min(1.0, (t + 1) / 70)),
          expect=[on_gpu("idle_gpu", 0, 3, 1080)], forbid=ALL_RULES - {"idle_gpu"}),
        S("idle_shield_trick", "idle from 5 min but a 4 s burst every 150 s to dodge idle detection", 30, [[0]],
          phases((0, busy), (300, lambda g, t, r: clip(r.gauss(95, 2)) if (t - 375) % 150 < 4 else r.uniform(0, 0.6))),
          fb_peak=40_000, procs=Procs(workers=lambda g, t: 2 if 75 <= t < 300 else 0),
          expect=[on_gpu("idle_gpu", 0, 0, 900)], forbid=ALL_RULES - {"idle_gpu"}),
        S("idle_debug_session", "interactive debugging: three 20 s test runs, then left open", 30, [[0]],
          lambda g, t, r: clip(r.gauss(80, 5)) if any(s <= t < s + 20 for s in (60, 200, 330)) else r.uniform(0, 0.6),
          fb_peak=30_000, procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(100, 3)) if a > 2
                                      else r.uniform(0, 1.5)),
          expect=[on_gpu("idle_gpu", 0, 0, 815)], forbid=ALL_RULES - {"idle_gpu"}),
        S("idle_postproc_cpu", "training ends at 10 min; the single-threaded main process then post-processes "
          "on the CPU at 100 % while the GPU idles (trap: not input_bound)", 30, [[0]],
          phases((0, busy), (600, never)),
          procs=Procs(workers=lambda g, t: 3 if 75 <= t < 600 else 0,
                      main_cpu=lambda g, t, r, a: clip(r.gauss(100, 2), 1, 400)),
          expect=[on_gpu("idle_gpu", 0, 0, 1200)], forbid=ALL_RULES - {"idle_gpu"}),
    ]

    # --- low utilization -----------------------------------------------------------------------
    not_low = ALL_RULES - {"low_utilization"}
    lst += [
        S("low_steady_15", "tiny batches: steady 15 % all along", 30, [[0]], trained(steady(15, 2)), fb_peak=20_000,
          procs=Procs(worker_cpu=lambda g, t, r: clip(r.gauss(30, 6), 1, 100)),
          expect=[on_gpu("low_utilization", 0, 0, 300)], forbid=not_low),
        S("low_noisy_22", "noisy 10-40 % around 22 %", 30, [[0]], trained(noisy(22, 7, 2.5, 8, 45)),
          fb_peak=24_000, expect=[on_gpu("low_utilization", 0, 0, 300)], forbid=not_low),
        S("low_midrun_drop", "2 GPUs busy, then from 12 min a phase at 18 %", 30, [[0, 1]],
          phases((0, busy), (720, steady(18, 2))),
          expect=[on_job("low_utilization", 900)], forbid=not_low),
        S("low_busywait_main100", "steady 12 %, host thread busy-waiting at 100 % of a core, no workers, no stalls "
          "(trap: not input_bound)", 30, [[0]], trained(steady(12, 1.5)), fb_peak=18_000,
          procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(100, 1.5), 1, 400)),
          expect=[on_gpu("low_utilization", 0, 0, 300)], forbid=not_low),
        S("low_main130", "steady 20 %, multi-threaded main at 130 %, no workers (trap: not input_bound)", 30,
          [[0]], trained(steady(20, 2)), fb_peak=18_000,
          procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(130, 5), 1, 400)),
          expect=[on_gpu("low_utilization", 0, 0, 300)], forbid=not_low),
        S("low_a100_nogpm", "A100 without GPM, duty cycle steady 18 %", 30, [[0]], trained(steady(18, 2)),
          gpu=A100, gpm=False, fb_peak=20_000, expect=[on_gpu("low_utilization", 0, 0, 300)], forbid=not_low),
    ]

    # --- input bound, and the traps ------------------------------------------------------------
    not_ib = ALL_RULES - {"input_bound"}
    lst += [
        S("ib_workers0", "num_workers=0: GPU stalls, main process at ~100 % of one core loading data", 30, [[0]],
          phases((0, loading()), (120, stalls(0.5))), fb_ramp_s=100,
          procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(100, 2), 1, 400)),
          expect=[on_gpu("input_bound", 0, 0, 300)], forbid=not_ib),
        S("ib_too_few_workers", "2 GPUs, 2 workers per rank at 97 %, GPUs stall", 30, [[0, 1]],
          phases((0, loading()), (120, stalls(0.4))), fb_ramp_s=100,
          procs=Procs(workers=2, worker_cpu=_saturated(), workers_start_s=120),
          expect=[on_job("input_bound", 300)], forbid=not_ib),
        S("ib_4workers_95", "4 GPUs, 4 workers per rank at 95 %, stalls", 30, [[0, 1, 2, 3]],
          phases((0, loading()), (120, stalls(0.45))), fb_ramp_s=100,
          procs=Procs(workers=4, worker_cpu=_saturated(95, 2.5), workers_start_s=120),
          expect=[on_job("input_bound", 300)], forbid=not_ib),
        S("ib_midrun", "busy until 10 min, then heavier augmentation saturates the 4 workers and the GPU stalls",
          30, [[0]], phases((0, busy), (600, stalls(0.5))),
          procs=Procs(workers=4, worker_cpu=lambda g, t, r: clip(r.gauss(55 if t < 600 else 97, 6 if t < 600 else 1.5), 1, 100)),
          expect=[on_gpu("input_bound", 0, 0, 780)], forbid=not_ib),
        S("ib_low_steady", "steady 14 % while 3 workers per rank are saturated (input_bound, not low)", 30, [[0]],
          phases((0, loading()), (90, steady(14, 2))), fb_ramp_s=80,
          procs=Procs(workers=3, worker_cpu=_saturated(), workers_start_s=90),
          expect=[on_gpu("input_bound", 0, 0, 300)], forbid=not_ib),
        S("trap_bursty_inference", "batch inference in bursts (stalls) with an idle CPU: not input_bound", 30, [[0]],
          trained(stalls(0.5, 84)), fb_peak=70_000,
          procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(9, 3), 0.5, 100))),
        S("trap_other_rank_cpu", "rank 0 stalls with its own workers at 30 %; rank 1 on the same node is busy with "
          "saturated workers: nobody is input_bound", 30, [[0, 1]],
          per_gpu(trained(steady(86)), g0_0=trained(stalls(0.65, 88))),
          procs=Procs(workers=lambda g, t: (2 if g.index == 0 else 3) if t >= 75 else 0,
                      worker_cpu=lambda g, t, r: clip(r.gauss(30, 6) if g.index == 0 else r.gauss(97, 1.5), 1, 100))),
    ]

    # --- imbalance, tensor cores, memory -------------------------------------------------------
    lst += [
        S("imb_straggler_2x4", "2x4 GPUs; GPU 2 of the second node falls to ~34 % from 6 min while the rest run at 90 %",
          40, [[0, 1, 2, 3], [0, 1, 2, 3]], per_gpu(trained(steady(90)), g1_2=phases((0, trained(steady(90))),
                                                                                    (360, steady(34, 2)))),
          node_gpus=4, expect=[on_gpu("imbalance", 1, 2, 540)], forbid=ALL_RULES - {"imbalance"}),
        S("imb_straggler_4gpu", "4 GPUs; GPU 0 runs at ~35 % against 88 % for the others all along", 30,
          [[0, 1, 2, 3]], per_gpu(trained(steady(88)), g0_0=trained(steady(35, 2))),
          expect=[on_gpu("imbalance", 0, 0, 300)], forbid=ALL_RULES - {"imbalance"}),
        S("fp32_busy_2gpu", "2 H100s busy in fp32 (no tensor cores)", 30, [[0, 1]], trained(steady(85)),
          tensor=_fp32, expect=[on_job("no_tensor_cores", 300)],
          forbid=ALL_RULES - {"no_tensor_cores"}),
        S("fp32_busy_1gpu", "1 H100 busy in fp32, TF32 disabled", 25, [[0]], trained(steady(78, 4)), tensor=_fp32,
          expect=[on_gpu("no_tensor_cores", 0, 0, 300)], forbid=ALL_RULES - {"no_tensor_cores"}),
        S("mem_underused_1gpu", "busy, but 1.5 GB of 80 GB", 20, [[0]], busy, fb_peak=1_500,
          expect=[on_job("memory_underused", 420)], forbid=ALL_RULES - {"memory_underused"}),
        S("mem_underused_2gpu", "2 GPUs busy with 4 GB each", 30, [[0, 1]], busy, fb_peak=4_000,
          expect=[on_job("memory_underused", 420)], forbid=ALL_RULES - {"memory_underused"}),
    ]

    # --- hardware ------------------------------------------------------------------------------
    lost_at = 840
    lst += [
        S("hw_xid79_lost", "XID 79 on GPU 1 at 14 min, the GPU is lost; other ranks hang idle until the NCCL "
          "timeout fails the job (no idle flags: one cause)", 25, [[0, 1, 2, 3]],
          phases((0, stops_at(busy, lost_at + 2, {"g0_1"})), (lost_at + 2, stops_at(never, lost_at + 2, {"g0_1"}))),
          state="FAILED",
          procs=Procs(alive=lambda g, t: not (g.index == 1 and t >= lost_at),
                      workers=lambda g, t: 2 if 75 <= t < lost_at else 0),
          events=[(lost_at, 0, 1, "xid", 79, "GPU has fallen off the bus"),
                  (lost_at + 1, 0, 1, "gpu_lost", None, "NVML_ERROR_GPU_IS_LOST")],
          expect=[on_gpu("xid_error|gpu_lost", 0, 1, lost_at)],
          forbid=ALL_RULES - {"xid_error", "gpu_lost"}),
        S("hw_xid48_dbe", "XID 48 with a double-bit ECC error at 20 min; the job dies 90 s later", 21.5, [[0]],
          phases((0, busy), (1205, never)), tweak=_dbe_at(1200), state="FAILED",
          events=[(1200, 0, 0, "xid", 48, "DBE (Double Bit Error) ECC Error")],
          expect=[on_gpu("xid_error|ecc_uncorrectable", 0, 0, 1200)],
          forbid=ALL_RULES - {"xid_error", "ecc_uncorrectable"}),
        S("hw_gpu_lost_noxid", "GPU 1 stops answering NVML at 16 min with no XID logged; the job fails 3 min "
          "later", 19, [[0, 1]], phases((0, stops_at(busy, 960, {"g0_1"})), (962, stops_at(never, 960, {"g0_1"}))),
          state="FAILED", procs=Procs(alive=lambda g, t: not (g.index == 1 and t >= 960)),
          events=[(960, 0, 1, "gpu_lost", None, "NVML_ERROR_GPU_IS_LOST")],
          expect=[on_gpu("gpu_lost", 0, 1, 960)], forbid=ALL_RULES - {"gpu_lost"}),
        S("hw_dbe_noxid", "a double-bit ECC error counted at 15 min (kernel log not readable: no XID); the job "
          "goes on", 30, [[0]], busy, tweak=_dbe_at(900),
          expect=[on_gpu("ecc_uncorrectable", 0, 0, 900)], forbid=ALL_RULES - {"ecc_uncorrectable"}),
        S("hw_remap_pending", "GPU 1 has a row remap pending from before the job (never reset)", 30, [[0, 1]], busy,
          tweak=_remap_pending, expect=[on_gpu("ecc_uncorrectable", 0, 1, 0)],
          forbid=ALL_RULES - {"ecc_uncorrectable"}),
        S("hw_sbe_storm", "corrected ECC errors at 25 a minute from 10 min", 30, [[0]], busy, tweak=_sbe(25, 600, 12),
          expect=[on_gpu("ecc_correctable", 0, 0, 840)], forbid=ALL_RULES - {"ecc_correctable"}),
        S("hw_thermal", "GPU 2 thermally slowed down in 30 % of samples from 5 min", 30, [[0, 1, 2, 3]],
          trained(steady(90)), tweak=_thermal("-0-2", 300),
          expect=[on_gpu("hw_throttling", 0, 2, 450)], forbid=ALL_RULES - {"hw_throttling"}),
        S("hw_pcie_gen3x8", "a gen4 x16 link trained to gen3 x8, under load all along", 30, [[0]],
          trained(steady(88), 90), gpu=A100, gpm=False, tweak=_pcie_gen3x8,
          expect=[on_gpu("pcie_downgraded", 0, 0, 100)], forbid=ALL_RULES - {"pcie_downgraded"}),
        S("xid13_app", "XID 13 (illegal memory access) on GPU 0 at 9 min; torchrun restarts the ranks 40 s later",
          30, [[0, 1]],
          lambda g, t, r: busy(g, t, r) if t < 540 else never(g, t, r) if t < 580 else trained(steady(86))(g, t - 580, r),
          procs=Procs(generation=lambda g, t: int(t >= 580), alive=lambda g, t: not 541 <= t < 580),
          events=[(540, 0, 0, "xid", 13, "Graphics SM Warp Exception: Out Of Range Address")],
          expect=[on_gpu("xid_application", 0, 0, 540)], forbid=ALL_RULES - {"xid_application"}),
        S("xid31_app", "XID 31 (MMU fault, a bug in a custom kernel) at 12 min; the job fails a minute later", 13,
          [[0]], phases((0, busy), (721, never)), state="FAILED",
          procs=Procs(alive=lambda g, t: t < 725),
          events=[(720, 0, 0, "xid", 31, "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 FAULT_PDE")],
          expect=[on_gpu("xid_application", 0, 0, 720)], forbid=ALL_RULES - {"xid_application"}),
    ]

    # --- topology and NUMA ---------------------------------------------------------------------
    lst += [
        S("topo_sys_pair", "2 GPUs across sockets (SYS) on a node whose GPUs come in NVLink pairs", 30, [[1, 6]],
          busy, node_gpus=8, topology="nvlink_pairs",
          expect=[on_node("topology_no_nvlink", 0, 0)], forbid=ALL_RULES - {"topology_no_nvlink"}),
        S("numa_far_rank1", "rank 1's process bound to the far socket's CPUs", 30, [[0, 1]], busy,
          topology="nvswitch", procs=Procs(far_share=lambda g: 1.0 if g.local_rank == 1 else 0.0),
          expect=[on_rank("numa_far", 0, 1, 90)], forbid=ALL_RULES - {"numa_far"}),
        S("numa_far_4gpu", "4 GPUs; rank 3 runs on the far socket in 70 % of samples", 30, [[0, 1, 2, 3]], busy,
          topology="nvswitch", procs=Procs(far_share=lambda g: 0.7 if g.local_rank == 3 else 0.0),
          expect=[on_rank("numa_far", 0, 3, 90)], forbid=ALL_RULES - {"numa_far"}),
    ]

    # --- what real recordings showed ----------------------------------------------------------
    keepalive = phases((0, loading()), (120, lambda g, t, r: r.choice((0.0, 0.0, 1.0, 2.0, 3.0, 4.0))))
    lst += [
        S("keepalive_1gpu", "loads a model, then holds 40 GB and runs a keep-alive kernel now and then (1-4 %)",
          25, [[0]], keepalive, fb_peak=40_000, procs=Procs(workers=0),
          expect=[on_gpu("idle_gpu", 0, 0, 720)], forbid=ALL_RULES - {"idle_gpu"}),
        S("held_back_24gpu", "3 nodes x 8 GPUs: one rank does extra work at 95 % while the 23 others wait for it "
          "at ~12 %", 25, [list(range(8))] * 3,
          per_gpu(trained(steady(12, 2)), g2_5=trained(steady(95, 2))), node_gpus=8,
          expect=[on_job("held_back", 300)], forbid=ALL_RULES - {"held_back"}),
        S("cancelled_xid45", "2 GPUs training, cancelled (scancel) while its kernels ran: XID 45 on each GPU",
          15, [[0, 1]], busy, state="CANCELLED",
          events=[(890, 0, 0, "xid", 45, "Preemptive Cleanup"), (890, 0, 1, "xid", 45, "Preemptive Cleanup")]),
        S("ib_threads_tfdata", "tf.data decoding in 8 threads keeps all 8 CPUs of its task busy (790 %, no worker "
          "processes) while the GPU runs at ~25 %", 25, [[0]], trained(steady(25, 3)),
          procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(790, 6), 1, 800)),
          expect=[on_gpu("input_bound", 0, 0, 300)], forbid=ALL_RULES - {"input_bound"}),
        S("low_threads_half", "the same GPU at ~25 % beside a main process at 400 % of its 8 CPUs: its threads "
          "have room (trap: not input_bound)", 25, [[0]], trained(steady(25, 3)),
          procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(400, 10), 1, 800)),
          expect=[on_gpu("low_utilization", 0, 0, 300)], forbid=ALL_RULES - {"low_utilization"}),
        S("spin_wait_8gpu_nogpm", "8 A100s without GPM: rank 3 does extra work at 99 % and full power; the other 7 "
          "spin in NCCL waiting for it, 99 % utilization at ~90 W", 25, [list(range(8))], trained(steady(99, 0.5)),
          gpu=A100, gpm=False, tweak=lambda g, t, r, d: d.update(power_w=round(r.gauss(90, 4), 1))
          if g.index != 3 and t >= 75 else None,
          expect=[on_job("held_back", 300)], forbid=ALL_RULES - {"held_back"}),
        S("prelude_cpu_12min", "4 GPUs idle for 12 min of CPU preprocessing (4 MB each), then training with "
          "60 GB each", 30, [[0, 1, 2, 3]], phases((0, never), (720, steady(88))),
          fb=lambda g, t, r: 4 if t < 720 else 60_000, procs=Procs(workers_start_s=720),
          expect=[on_job("idle_gpu", 600)], forbid=ALL_RULES - {"idle_gpu"}),
    ]

    lst += _hangs()
    lst += _fabric()
    lst += _one_cause()
    lst += _scheduler()
    return place(lst, job_base=96_000, pid_base=10_000, prefix="lib", shared=("h_shared_a", "h_shared_b"))


def _spin(at: int, power: float, spared: set[str] = frozenset()) -> Callable[[G, int, random.Random, dict[str, Any]], None]:  # type: ignore[assignment]
    """From ``at`` on, every GPU but ``spared`` (``g{node_i}_{index}``) spins in a collective: a kernel
    resident (duty cycle 100 %), SMs doing nothing (GPM), no traffic, power near idle."""
    def tweak(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
        if t < at or f"g{g.node_i}_{g.index}" in spared:
            return
        d.update(sm_util=100, mem_util=0, power_w=round(r.gauss(power, 3), 1), pcie_rx_kbs=r.randint(0, 60),
                 pcie_tx_kbs=r.randint(0, 30), sm_clock_mhz=1410, clock_event_reasons=0)
        if d.get("gpm_sm_active") is not None:
            d.update(gpm_sm_active=round(r.uniform(0, 0.4), 2), gpm_sm_occupancy=0.1, gpm_tensor_active=0.0,
                     gpm_dram_bw=0.0, gpm_fp16_active=0.0, gpm_fp32_active=0.0)
    return tweak


def _hangs() -> list[Scenario]:
    """Hung jobs (a rank or a node broke, the survivors spin in a collective) and what looks like one."""
    S = Scenario
    lst: list[Scenario] = []
    # A100 (no GPM): rank 13 (node 1, GPU 5) dies at 12 min; its GPU idles, its memory is freed; the other
    # 15 spin at 100 % and ~80 W until the user cancels at 40 min. Onset 720 + 3 min = 900.
    dead = "g1_5"
    lst.append(S("hang_nogpm_16gpu", "2 nodes x 8 A100 without GPM; rank 13 exits at 12 min, the other 15 spin "
                 "in NCCL (100 % duty cycle, ~80 W, no traffic) until cancelled at 40 min (longer than the look-back: "
                 "the working level comes from the job's history)", 40, [list(range(8))] * 2,
                 phases((0, trained(steady(97, 1.5))), (720, per_gpu(steady(100, 0), **{dead: idle()}))),
                 gpu=A100, gpm=False, state="CANCELLED", node_gpus=8, tweak=_spin(720, 80, {dead}),
                 procs=Procs(alive=lambda g, t: not (g.node_i == 1 and g.index == 5 and t >= 720),
                             workers=lambda g, t: 2 if 75 <= t < 720 else 0),
                 expect=[on_job("hung", 900)], forbid=ALL_RULES - {"hung"}))
    # H100 (GPM): rank 3 exits at 10 min; the other 7 show 100 % duty cycle, 0 SM activity, ~115 W. With
    # GPM they are idle by SM activity: no idle_gpu flag per GPU at 20 min, the hang explains them. 600 + 180.
    lst.append(S("hang_gpm_8gpu", "8 H100 with GPM; rank 3 exits at 10 min, the other 7 wait in NCCL (duty "
                 "cycle 100 %, SM activity 0, ~115 W) until the time limit at 28 min", 28, [list(range(8))],
                 phases((0, trained(steady(88))), (600, per_gpu(steady(100, 0), g0_3=idle()))),
                 state="TIMEOUT", tweak=_spin(600, 115, {"g0_3"}), topology="nvswitch",
                 procs=Procs(alive=lambda g, t: not (g.index == 3 and t >= 600),
                             workers=lambda g, t: 2 if 75 <= t < 600 else 0),
                 expect=[on_job("hung", 780)], forbid=ALL_RULES - {"hung"}))
    # H100 (GPM), 2 x 4: rank 6 (node 1, GPU 2) catches an exception and sits in Python (process alive,
    # memory held, GPU idle) from 8 min; the 7 others spin. Every rank alive: noted at 480 + 180, a hang once
    # it has lasted the 10-minute collective timeout, 480 + 600.
    lst.append(S("hang_gpm_rank_idle_2x4", "2 nodes x 4 H100; rank 6 stops in an exception handler at 8 min "
                 "(its GPU idle, memory held, its process alive), the 7 others spin in the all-reduce until "
                 "cancelled at 25 min: every rank alive, a hang past the collective timeout", 25,
                 [[0, 1, 2, 3], [0, 1, 2, 3]],
                 phases((0, trained(steady(90))), (480, per_gpu(steady(100, 0), g1_2=idle()))),
                 state="CANCELLED", node_gpus=4, tweak=_spin(480, 110, {"g1_2"}),
                 procs=Procs(workers=lambda g, t: 2 if 75 <= t < 480 else 0,
                             main_cpu=lambda g, t, r, a: clip(r.gauss(106, 7)) if t < 480 else clip(r.gauss(100, 1))),
                 expect=[on_job("hung", 1080)], forbid=ALL_RULES - {"hung", "stalled"}))
    # Node 1 of 2 x 4 A100 dies at 10 min (its agent silent; Slurm ends the job NODE_FAIL at 22 min); node 0's
    # GPUs spin. Silent 2 min at 720; survivors wait 3 whole minutes at 780: both flags at 780.
    lst.append(S("hang_node_dead_2x4", "2 nodes x 4 A100 without GPM; node 1 dies at 10 min (its agent goes "
                 "silent), node 0's 4 GPUs spin at ~80 W until the job fails NODE_FAIL at 22 min", 22,
                 [[0, 1, 2, 3], [0, 1, 2, 3]],
                 phases((0, trained(steady(96, 1.5))), (600, lambda g, t, r: None if g.node_i == 1 else 100.0)),
                 gpu=A100, gpm=False, state="NODE_FAIL", node_gpus=4, tweak=_spin(600, 80),
                 procs=Procs(alive=lambda g, t: not (g.node_i == 1 and t >= 600),
                             workers=lambda g, t: 2 if 75 <= t < 600 else 0),
                 expect=[on_job("hung", 780), on_node("node_lost", 1, 780)],
                 forbid=ALL_RULES - {"hung", "node_lost"}))

    # 4 H100: GPU 1 falls off the bus (XID 79) at 10 min and is lost; the other 3 spin in the all-reduce rather
    # than idle (NCCL waits on the lost rank). The XID is the admins' flag, the hang the owner's, naming the GPU.
    lost = 600
    lst.append(S("hang_xid79_spin", "4 H100; XID 79 on GPU 1 at 10 min, the GPU is lost; the 3 others spin in NCCL "
                 "(duty cycle 100 %, SM activity 0) until cancelled at 22 min", 22, [[0, 1, 2, 3]],
                 phases((0, stops_at(trained(steady(88)), lost + 2, {"g0_1"})),
                        (lost, stops_at(steady(100, 0), lost + 2, {"g0_1"}))),
                 state="CANCELLED", tweak=_spin(lost + 2, 110, {"g0_1"}),
                 procs=Procs(alive=lambda g, t: not (g.index == 1 and t >= lost),
                             workers=lambda g, t: 2 if 75 <= t < lost else 0),
                 events=[(lost, 0, 1, "xid", 79, "GPU has fallen off the bus"),
                         (lost + 1, 0, 1, "gpu_lost", None, "NVML_ERROR_GPU_IS_LOST")],
                 expect=[on_gpu("xid_error|gpu_lost", 0, 1, lost), on_job("hung", lost + 180)],
                 forbid=ALL_RULES - {"xid_error", "gpu_lost", "hung"}))

    # 3 x 4 A100 without GPM on a small model (working at ~250 W of 400): rank 7 (node 1, GPU 3) exits at 15 min;
    # the others spin noisily (duty cycle 90-100 %, 55-75 W, NCCL's own heartbeat traffic in 5 % of seconds).
    def noisy_spin(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
        if t >= 900 and not (g.node_i == 1 and g.index == 3):
            d.update(sm_util=r.randint(90, 100), power_w=round(r.uniform(55, 75), 1), mem_util=r.randint(0, 2),
                     pcie_rx_kbs=20_000 if r.random() < 0.05 else r.randint(0, 80), pcie_tx_kbs=r.randint(0, 40))
    lst.append(S("hang_noisy_3x4", "3 nodes x 4 A100, a small model at ~250 W; rank 7 exits at 15 min, the other 11 "
                 "spin noisily (90-100 % duty cycle, 55-75 W, heartbeat traffic) until the time limit at 32 min", 32,
                 [[0, 1, 2, 3]] * 3, phases((0, trained(steady(60, 4))), (900, per_gpu(steady(95, 3), g1_3=idle()))),
                 gpu=A100, gpm=False, state="TIMEOUT", node_gpus=4, tweak=noisy_spin,
                 procs=Procs(alive=lambda g, t: not (g.node_i == 1 and g.index == 3 and t >= 900),
                             workers=lambda g, t: 2 if 75 <= t < 900 else 0),
                 expect=[on_job("hung", 1080)], forbid=ALL_RULES - {"hung"}))

    # 4 H100 whose job declares a 5-minute collective timeout (its tag): rank 2 deadlocks at 8 min (process
    # alive, asleep, its GPU idle, memory held), the 3 others spin. Noted at 480 + 180, hung at 480 + 300.
    lst.append(S("hang_alive_timeout_5min", "4 H100, the job's tag collective_timeout:5; rank 2 deadlocks at 8 min "
                 "(alive, asleep, GPU idle), the 3 others spin until cancelled at 20 min", 20, [[0, 1, 2, 3]],
                 phases((0, trained(steady(88))), (480, per_gpu(steady(100, 0), g0_2=idle()))),
                 state="CANCELLED", tweak=_spin(480, 110, {"g0_2"}), tags={"collective_timeout": "5"},
                 procs=Procs(workers=lambda g, t: 2 if 75 <= t < 480 else 0,
                             state=lambda g, t: "S" if g.index == 2 and t >= 480 else "R"),
                 expect=[on_job("hung", 780)], forbid=ALL_RULES - {"hung", "stalled"}))

    # --- checkpoint barriers that resume (no events): rank 0 writes to slow storage, working on the host
    # (running or in I/O wait, ~160 MB/s), its GPU quiet with its memory held; the others spin in the barrier.
    # Every rank alive and shorter than the 10-minute collective timeout: the stalled note at onset + 180,
    # never hung; training resumes after it.
    def barrier(at: int, length: int, power: float, work: Act) -> tuple[Act, Callable[..., None], Procs]:
        def writer(g: G) -> bool:
            return g.node_i == 0 and g.index == 0

        def act(g: G, t: int, r: random.Random) -> float | None:
            if at <= t < at + length:
                return loading(5)(g, t, r) if writer(g) else 100.0
            return work(g, t, r)

        def tweak(g: G, t: int, r: random.Random, d: dict[str, Any]) -> None:
            if t < at + length:
                _spin(at, power, {"g0_0"})(g, t, r, d)
        saving = lambda g, t: writer(g) and at <= t < at + length  # noqa: E731
        return act, tweak, Procs(state=lambda g, t: ("D" if t % 3 else "R") if saving(g, t) else "R",
                                 io_write=lambda g, t: 160_000_000 if saving(g, t) else 4_096,
                                 main_cpu=lambda g, t, r, a: clip(r.gauss(40 if saving(g, t) else 106, 7), 1, 400))
    act, tweak, procs = barrier(720, 420, 80, trained(steady(96, 1.5)))
    lst.append(S("ckpt_barrier_2x8_7min", "2 nodes x 8 A100 without GPM, no events: at 12 min rank 0 writes its "
                 "checkpoint to slow storage for 7 min while the 15 others wait in a barrier (100 % duty cycle, "
                 "~80 W, no traffic), then training resumes", 30, [list(range(8))] * 2, act, gpu=A100, gpm=False,
                 node_gpus=8, tweak=tweak, procs=procs, expect=[on_job("stalled", 900)],
                 forbid=ALL_RULES - {"stalled"}))
    act, tweak, procs = barrier(600, 300, 115, trained(steady(88)))
    lst.append(S("ckpt_barrier_8gpu_5min", "8 H100 with GPM, no events: at 10 min rank 0 writes its checkpoint for "
                 "5 min while the 7 others spin in a barrier (SM activity 0), then training resumes", 25,
                 [list(range(8))], act, tweak=tweak, procs=procs, topology="nvswitch",
                 expect=[on_job("stalled", 780)], forbid=ALL_RULES - {"stalled"}))
    act, tweak, procs = barrier(480, 540, 80, trained(steady(95, 2)))
    lst.append(S("ckpt_barrier_4gpu_9min", "4 A100 without GPM, no events: at 8 min rank 0 writes for 9 min, a "
                 "minute short of the collective timeout, while the 3 others spin; then training resumes", 30,
                 [[0, 1, 2, 3]], act, gpu=A100, gpm=False, tweak=tweak, procs=procs,
                 expect=[on_job("stalled", 660)], forbid=ALL_RULES - {"stalled"}))

    # --- look-alikes: nothing may be raised ------------------------------------------------------------
    busy = trained(steady(90))
    lst += [
        S("h_agent_restart_45s", "2 nodes x 2 GPUs training; node 1's agent restarts at 10 min (45 s without "
          "samples, then a new agent instance)", 25, [[0, 1], [0, 1]], busy, node_gpus=2,
          agent_restarts=[(1, 600, 645)]),
        # A 2-minute checkpoint every 10 min: rank 0 writes (its GPU at a few %), the 7 others wait in a
        # barrier spinning: shorter than the 3 minutes a hang needs.
        S("h_ckpt_barrier_spin", "8 H100: a 2 min checkpoint every 10 min, rank 0 writes while the 7 others spin "
          "in a barrier (100 % duty cycle, no SM activity)", 35, [list(range(8))],
          lambda g, t, r: (loading(5)(g, t, r) if g.index == 0 else 100.0) if t >= 600 and (t - 600) % 600 < 120
          else busy(g, t, r),
          tweak=lambda g, t, r, d: _spin(0, 115, {"g0_0"})(g, t, r, d) if t >= 600 and (t - 600) % 600 < 120
          else None),
        S("h_ckpt_stall_2x4", "2 nodes x 4 A100: a 3.5 min checkpoint every 9 min, every GPU idle at a few % "
          "(not busy) while the shards are written", 35, [[0, 1, 2, 3], [0, 1, 2, 3]],
          with_gaps(trained(steady(95, 2)), 540, 210, 540, gap=loading(4)), gpu=A100, gpm=False, node_gpus=4),
        S("h_eval_tp_4gpu", "4 H100: every 8 min a 4 min evaluation pass at ~55 % and moderate power (generation "
          "with small batches)", 35, [[0, 1, 2, 3]], with_gaps(busy, 480, 240, 480, gap=steady(55, 6)),
          app_events=[(s, k, "eval") for c in (480, 960, 1440, 1920) for s, k in ((c, "phase_start"),
                                                                                 (c + 240, "phase_end"))]),
        S("h_slow_load_2x4", "2 nodes x 4 A100: a 1 min GPU burn-in check, then 8 min loading a checkpoint from "
          "a network file system (GPUs at a few %, memory growing), then training", 30, [[0, 1, 2, 3]] * 2,
          phases((0, steady(98, 1)), (60, loading(6)), (540, steady(95, 2))), gpu=A100, gpm=False, node_gpus=4,
          fb=lambda g, t, r: 2_000 if t < 60 else round(70_000 * min(1.0, (t - 60) / 480)),
          procs=Procs(workers_start_s=540)),
        # From 10 min the inter-node network degrades: the GPUs spin in every all-reduce (100 % duty cycle,
        # ~90 W) but a step still completes every 45 s: slow, not hung (its steps say so).
        S("h_slow_network_steps", "2 nodes x 4 A100 without GPM: from 10 min a degraded network leaves the GPUs "
          "spinning in the all-reduce most of the time, a step every 45 s", 25, [[0, 1, 2, 3], [0, 1, 2, 3]],
          phases((0, trained(steady(96, 1.5))), (600, steady(100, 0))), gpu=A100, gpm=False, node_gpus=4,
          tweak=_spin(600, 90), app_events=[(t, "step", "train") for t in (*range(90, 600, 5), *range(600, 1500, 45))]),
        # The final save: rank 0 writes a large checkpoint for 5 min (its phase events say so) while the 7 other
        # ranks wait in the barrier, spinning; then the job ends.
        S("h_final_save_barrier", "8 H100 training; at 20 min rank 0 writes the final checkpoint for 5 min, declared "
          "as a phase, while the 7 others spin in the barrier", 25, [list(range(8))],
          lambda g, t, r: (loading(5)(g, t, r) if g.index == 0 else 100.0) if t >= 1200 else busy(g, t, r),
          tweak=_spin(1200, 115, {"g0_0"}), app_events=[(1200, "phase_start", "final_checkpoint"),
                                                        (1499, "phase_end", "final_checkpoint")]),
        S("h_inference_tp2_lulls", "a tensor-parallel inference server on 2 GPUs: request waves, 6 min without "
          "requests between them (GPUs idle, memory held)", 40, [[0, 1]],
          phases((0, loading()), (120, lambda g, t, r: idle()(g, t, r) if (t - 120) % 660 >= 300
                                 else stalls(0.7, 85)(g, t, r))),
          fb_peak=74_000, procs=Procs(workers=0, main_cpu=lambda g, t, r, a: clip(r.gauss(15, 5), 0.5, 100))),
    ]
    return lst


def place(lst: list[Scenario], *, job_base: int, pid_base: int, prefix: str,
          shared: tuple[str, str]) -> list[Scenario]:
    """Give each scenario a job id, a PID range and nodes of its own; the two ``shared`` jobs share
    one node (and its GPU UUIDs)."""
    for k, s in enumerate(lst, start=1):
        s.job_id = str(job_base + k)
        s.pid_base = pid_base + 300 * k
        s.nodes = [f"{prefix}{k:02d}{chr(ord('a') + i)}" for i in range(len(s.gpus))]
        if s.name in shared:
            s.nodes, s.uuid_key = [f"{prefix}-shared"], f"{prefix}shared"
    return lst


# ------------------------------------------------------------------------- the fabric (issue 68)
# Labels: communication_bound (job-wide) when a multi-node job's network runs at >= 70 % of its
# links' rate while its GPUs' mean activity stays under 60 %, for 3 whole minutes (it explains the
# GPUs' low use); fabric_degraded (scope_key = node) when a port runs narrower or slower than its
# best for 3 whole minutes, or its link error counters rise by 10 within the look-back; a straggler
# behind the degraded link is the node's (its imbalance is not raised).


def _ib(share: Callable[[int, int], float], width: Callable[[int], int] = lambda n: 4,
        errors: Callable[[int, int], int] = lambda n, t: 0) -> Fabric:
    """One 4X EDR port per node (100 Gb/s; ``width`` lanes, 25 Gb/s each) moving ``share`` of its
    current rate each way at second t."""
    def ports(n: int, t: int, r: random.Random) -> list[dict[str, Any]]:
        lanes = width(n)
        kbs = clip(share(n, t) + r.gauss(0, 0.01), 0, 1) * 25e9 * lanes / 8 / 1024
        return [{"device": "mlx5_0", "port": 1, "link_layer": "InfiniBand", "port_state": 4, "phys_state": 5,
                 "rate_gbps": 25.0 * lanes, "width": lanes, "rate_max_gbps": 100.0, "width_max": 4,
                 "rx_kbs": round(kbs), "tx_kbs": round(kbs), "xmit_wait_per_s": 0,
                 "symbol_error": errors(n, t), "link_downed": 0, "port_rcv_errors": 0}]
    return ports


def _training(share: float) -> Callable[[int, int], float]:
    """The network's share while loading (75 s: little) and then while training."""
    return lambda n, t: 0.02 if t < 75 else share


def _fabric() -> list[Scenario]:
    S = Scenario
    two = [[0, 1, 2, 3], [0, 1, 2, 3]]
    return [
        S("f_comm_bound", "2 nodes x 4 GPUs whose all-reduces fill the InfiniBand links while the GPUs wait at 42 %",
          30, two, trained(steady(42)), node_gpus=4, fabric=_ib(_training(0.9)),
          expect=[on_job("communication_bound", 300)], forbid=ALL_RULES - {"communication_bound"}),
        S("f_comm_bound_low", "2 nodes x 4 GPUs at 22 %, the network full: communication-bound, not low use", 30,
          two, trained(steady(22)), node_gpus=4, fabric=_ib(_training(0.92)),
          expect=[on_job("communication_bound", 300)], forbid=ALL_RULES - {"communication_bound"}),
        S("f_overlapped", "2 nodes x 4 GPUs busy at 88 % with the network full: communication overlaps compute",
          30, two, trained(steady(88)), node_gpus=4, fabric=_ib(_training(0.9))),
        S("f_quiet_fabric", "2 nodes x 4 GPUs busy, the network at a tenth of its rate", 30, two,
          trained(steady(85)), node_gpus=4, fabric=_ib(_training(0.1))),
        S("f_straggler_1x", "2 nodes x 4 GPUs; node 1's link trained down to 1X: its GPUs lag at 35 % behind it",
          30, two, trained(per_gpu(steady(85), **{f"g1_{i}": steady(35) for i in range(4)})), node_gpus=4,
          fabric=_ib(lambda n, t: 0.95 if n == 1 and t >= 75 else 0.2, width=lambda n: 1 if n == 1 else 4),
          expect=[on_node("fabric_degraded", 1, 180)], forbid=ALL_RULES - {"fabric_degraded"}),
        S("f_link_errors", "2 nodes x 4 GPUs busy; node 0's symbol errors rise by 2 a minute from 10 min on", 30,
          two, trained(steady(85)), node_gpus=4,
          fabric=_ib(_training(0.3), errors=lambda n, t: 2 * max(0, t - 600) // 60 if n == 0 else 0),
          expect=[on_node("fabric_degraded", 0, 900)], forbid=ALL_RULES - {"fabric_degraded"}),
    ]


# ------------------------------------------------------------------ one cause, one flag (issue 67)
# Labels: a rule that holds on every GPU of a job for one reason is one job-wide flag (on_job) naming
# the GPUs; the times follow the rule's own label above (sparse low use: warm-up end + 10 min; idle:
# onset + 10 min).


def _bubbles(period: int = 15, busy_s: int = 5, level: float = 82.0) -> Act:
    """A pipeline stage: busy ``busy_s`` of every ``period`` s, each stage's turn two seconds after the
    previous one's (an 8-stage 1F1B schedule whose bubbles leave every GPU a third busy)."""
    def act(g: G, t: int, r: random.Random) -> float:
        return clip(r.gauss(level, 4)) if (t - 2 * g.index) % period < busy_s else r.uniform(0.0, 0.5)
    return act


def _keep_alive(g: G, t: int, r: random.Random) -> float:
    """A keep-alive kernel now and then (1-4 %), as keepalive_1gpu's."""
    return r.choice((0.0, 0.0, 1.0, 2.0, 3.0, 4.0))


def _one_cause() -> list[Scenario]:
    S = Scenario
    return [
        # A third busy (27 %), two thirds of the samples idle: sparse, so warm-up end (120 s) + 600 = 720.
        S("one_pipeline_bubbles_8gpu", "an 8-stage pipeline whose bubbles leave every GPU a third busy, each "
          "stage in turn", 30, [list(range(8))], trained(_bubbles()), topology="nvswitch",
          expect=[on_job("low_utilization", 720)], forbid=ALL_RULES - {"low_utilization"}),
        # The work ends at 8 min; the job keeps its 8 GPUs (memory held, a keep-alive kernel now and then)
        # for 40 min more: idle from 480 s, 480 + 600 = 1080.
        S("one_keepalive_after_8gpu", "8 GPUs train for 8 min, then the job keeps its allocation for 40 min "
          "with a keep-alive kernel now and then", 48, [list(range(8))],
          phases((0, trained(steady(88))), (480, _keep_alive)),
          procs=Procs(workers=lambda g, t: 2 if 75 <= t < 480 else 0,
                      main_cpu=lambda g, t, r, a: clip(r.gauss(106, 7)) if t < 480 else r.uniform(0, 2)),
          expect=[on_job("idle_gpu", 1080)], forbid=ALL_RULES - {"idle_gpu"}),
        # A 1-minute GPU check, then 22 minutes loading at a few % (idle in 5/6 of the samples: sparse) while
        # memory grows: warm-up ends at its 10-minute cap (600 s), + 600 = 1200; training from 1380 s.
        S("one_slow_load_22min_4gpu", "4 A100s: a 1 min GPU check, then a 22 min model load from a network "
          "file system (GPUs at a few %, memory growing), then training", 31, [[0, 1, 2, 3]],
          phases((0, steady(98, 1)), (60, loading(6)), (1380, steady(95, 2))), gpu=A100, gpm=False,
          fb=lambda g, t, r: 2_000 if t < 60 else round(70_000 * min(1.0, (t - 60) / 1320)),
          procs=Procs(workers_start_s=1380),
          expect=[on_job("low_utilization", 1200)], forbid=ALL_RULES - {"low_utilization"}),
    ]


# ------------------------------------------------------------------ the scheduler's time (issue 67)
# Labels: the minutes Slurm held a job suspended (its processes stopped, state T; its GPUs idle with their
# memory held) are the scheduler's: no flag for them, before or after the job resumes.


def _held(suspended: tuple[int, int]) -> Procs:
    a, b = suspended
    return Procs(main_cpu=lambda g, t, r, x: 0.0 if a <= t < b else clip(r.gauss(106, 7), 1, 400),
                 worker_cpu=lambda g, t, r: 0.0 if a <= t < b else clip(r.gauss(42, 8), 1, 100),
                 state=lambda g, t: "T" if a <= t < b else "R")


def _scheduler() -> list[Scenario]:
    S = Scenario
    held = (600, 1200)
    return [
        S("suspended_resumed_4gpu", "4 GPUs train; Slurm suspends the job at 10 min for 10 min (gang "
          "scheduling: processes stopped, GPU memory held), then resumes it", 32, [[0, 1, 2, 3]],
          phases((0, trained(steady(88))), (held[0], idle()), (held[1], steady(88))), procs=_held(held),
          suspended=[held], expect=[], forbid=ALL_RULES),
    ]
