"""Rules on where a job's work runs: GPUs that reach each other only through the CPU, ranks on
CPUs far from their GPU. The smallest family, and the one to copy for a new one: check functions over
a `JobView`, declared in ``RULES`` (docs/development.md, "A rule")."""

from __future__ import annotations

from jobpulse.collector.rules.model import Finding, JobView, Rule, Settings, rounded

_VIA_CPU = {"PHB", "NODE", "SYS"}  # paths through a CPU's host bridge or between sockets


def topology_no_nvlink(job: JobView, t: Settings) -> list[Finding]:
    """A job's GPUs on a node talk through the CPU while that node has NVLink-connected GPUs. The
job's flag (its allocation is at fault), keyed by node; the advice routes the fix to admins."""
    found = []
    for node in sorted({g.node for g in job.gpus}):
        mine = [g for g in job.gpus if g.node == node]
        node_links = job.links.get(node, {})
        if len(mine) < 2 or not any(link.startswith("NV") for peers in node_links.values() for link in peers.values()):
            continue
        slow = {f"GPU{a.gpu_index}-GPU{b.gpu_index}": link for i, a in enumerate(mine) for b in mine[i + 1:]
                if (link := node_links.get(a.gpu_uuid, {}).get(b.gpu_uuid, "")) in _VIA_CPU}
        if slow:
            found.append(Finding(
                node, min(g.first_ts for g in mine), {"links": slow, "node": node, "gpus": [g.key for g in mine]},
                f"The job's GPUs on {node} reach each other only through the CPU "
                f"({', '.join(f'{k} {v}' for k, v in slow.items())}) although {node} has NVLink-connected "
                f"GPUs: collectives run far slower. Admins: describe NVLink groups in gres.conf (Links=) "
                f"so Slurm packs GPUs by link; users: request whole NVLink groups (--gres=gpu:N with "
                f"N a group size) or --exclusive."))
    return found


def cpulist(text: str) -> set[int]:
    """CPUs of a Linux cpulist (``0-15,32-47``); malformed parts are ignored."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if lo.strip().isdigit() and (not hi or hi.strip().isdigit()):
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _short(cpus: dict[int, int]) -> str:
    return ",".join(map(str, sorted(cpus)[:8])) + ("..." if len(cpus) > 8 else "")


def numa_far(job: JobView, t: Settings) -> list[Finding]:
    """A rank that runs on CPUs outside its GPU's local CPU set."""
    found = []
    for p in job.procs:
        local = job.local_cpus.get(f"{p.node}/{p.gpu_uuid}") if p.gpu_uuid else None
        seen = sum(p.cpus.values())
        if not local or seen < t["min_samples"]:
            continue
        near = cpulist(local)
        far = sum(n for cpu, n in p.cpus.items() if cpu not in near)
        if far / seen < t["numa_far_share"]:
            continue
        g = next((x for x in job.gpus if x.node == p.node and x.gpu_uuid == p.gpu_uuid), None)
        where = g.where if g else f"{p.node}/{p.gpu_uuid}"
        found.append(Finding(
            f"{p.node}/pid{p.pid}", g.first_ts if g else min(x.first_ts for x in job.gpus),
            {"pid": p.pid, "rank": p.rank, "gpu": where, "gpus": [g.key] if g else [], "cpus_seen": sorted(p.cpus), "gpu_local_cpus": local,
             "far_share": rounded(far / seen, 3)},
            f"Process {p.pid}{'' if p.rank is None else f' (rank {p.rank})'} drives {where} from "
            f"CPUs {_short(p.cpus)}, outside the GPU's local CPUs ({local}): every copy "
            f"crosses sockets. Bind tasks near their GPUs: srun --cpu-bind=cores --gpu-bind=closest "
            f"(admins: Cores= in gres.conf)."))
    return found


RULES = (
    Rule("topology_no_nvlink", "job", "hardware", "warning", "a job's GPUs linked only through the CPU",
         ("links", "gpu_index"), (), job_check=topology_no_nvlink),
    Rule("numa_far", "rank", "code", "warning", "a rank on CPUs far from its GPU",
         ("procs", "local_cpus"), ("min_samples", "numa_far_share"), job_check=numa_far),
)
