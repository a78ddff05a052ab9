"""Rules on GPU faults: the node's hardware (XIDs of its hardware or driver by NVIDIA's catalogue,
lost GPUs, ECC errors and row remapping, throttling, degraded PCIe links, a node that fell silent
while its job ran) and the one fault that is the code's (an XID NVIDIA attributes to the
application: category ``code``, for the researcher)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from datetime import timedelta

from jobpulse.collector.rules.evidence import trailing
from jobpulse.collector.rules.model import Block, Finding, GpuStats, JobView, Rule, Settings, rounded
from jobpulse.collector.rules.stuck import silent_nodes, waits
from jobpulse.schema.semantics import APPLICATION_XIDS

_throttled: Callable[[Block], int] = operator.attrgetter("throttled")
_DRAIN = "Admins: drain and inspect the node; users: resubmit excluding it (--exclude={node})."


def xid_error(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """An XID of the node's hardware or driver since the job started."""
    codes = sorted(x for x in s.xids if x not in APPLICATION_XIDS)
    if not codes:
        return None
    first = min(s.xids[c] for c in codes)
    return Finding(s.key, first, {"xids": codes, "first_at": first.isoformat()},
                   f"{s.where} reported XID {', '.join(map(str, codes))}: a driver or hardware fault on "
                   f"{s.node}. " + _DRAIN.format(node=s.node))


def gpu_lost(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """The agent lost the GPU: NVML stopped answering for it (fallen off the bus)."""
    if s.lost_at is None:
        return None
    return Finding(s.key, s.lost_at, {"lost_at": s.lost_at.isoformat()},
                   f"{s.where} stopped answering NVML at {s.lost_at:%H:%M:%S} (GPU lost). " + _DRAIN.format(node=s.node))


def ecc_uncorrectable(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """Uncorrectable (double-bit) ECC errors in the window, or a row remap pending or failed."""
    e = s.ecc
    if not (e.dbe_increase > 0 or e.remap_pending or e.remap_failure):
        return None
    what = [f"{e.dbe_increase} uncorrectable ECC error{'s' if e.dbe_increase > 1 else ''}" if e.dbe_increase else "",
            "a row remap waiting for a GPU reset" if e.remap_pending else "",
            "a failed row remap" if e.remap_failure else ""]
    return Finding(s.key, s.first_ts, {"dbe_increase": e.dbe_increase, "remap_pending": e.remap_pending,
                                       "remap_failure": e.remap_failure},
                   f"{s.where} has {', '.join(w for w in what if w)}: results computed on it may be wrong. "
                   + ("Admins: reset the GPU (the remap applies at reset) or replace it; users: resubmit "
                      f"excluding {s.node}." if not e.remap_failure else _DRAIN.format(node=s.node)))


def ecc_correctable(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """A storm of corrected (single-bit) ECC errors: memory on its way out."""
    if s.ecc.sbe_increase < t["ecc_sbe_errors"]:
        return None
    return Finding(s.key, s.first_ts, {"sbe_increase": s.ecc.sbe_increase, "threshold": t["ecc_sbe_errors"],
                                       "window_minutes": t["window_minutes"]},
                   f"{s.where} corrected {s.ecc.sbe_increase} single-bit ECC errors within "
                   f"{t['window_minutes']:.0f} min: its memory is degrading. Admins: watch for row remaps and "
                   f"XID 48/63/64 on {s.node}, plan a replacement.")


def hw_throttling(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """Hardware slowdown (thermal, power brake) in hw_throttle_share of the samples of a trailing
    stretch, by the evidence rule of every mean: a slowdown that starts late in a long job is judged
    from its onset, not diluted by the healthy hours before it."""
    # Most GPUs never slowed down: no share of theirs can reach a positive threshold (builtins, not
    # a frame per block).
    if t["hw_throttle_share"] > 0 and not any(map(_throttled, s.full_blocks)):
        return None
    stretch = trailing(s.full_blocks, lambda m: m.throttled / m.n if m.n else None, t,
                       at_least=t["hw_throttle_share"])
    if stretch is None:
        return None
    return Finding(s.key, stretch.since,
                   {"share_of_samples": rounded(stretch.mean, 3), "threshold": t["hw_throttle_share"],
                    "minutes": rounded((s.last_ts - stretch.since).total_seconds() / 60)},
                   f"{s.where} slowed itself down in hardware (thermal or power brake) in "
                   f"{stretch.mean:.0%} of samples since {stretch.since:%H:%M}: the node's fault, not the code's — "
                   f"admins: check cooling and power on {s.node}.")


def pcie_downgraded(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """The PCIe link below its maximum generation or width in most samples under load."""
    if (s.pcie_below_max_share is None or s.pcie_loaded_samples < t["min_samples"]
            or s.pcie_below_max_share < t["pcie_below_max_share"]):
        return None
    return Finding(s.key, s.first_ts,
                   {"share_of_busy_samples": rounded(s.pcie_below_max_share, 3), "link": s.pcie_link},
                   f"{s.where}'s PCIe link runs below its maximum under load ({s.pcie_link}, current/max "
                   f"gen x width): host-device copies are slower. Admins: reseat or replace the riser, check "
                   f"BIOS link settings on {s.node} (`jobpulse-agent validate` shows it).")


def node_lost(job: JobView, t: Settings) -> list[Finding]:
    """A node of a running job whose agent stopped reporting while the job's other GPUs wait on it
    (spinning or quiet since). A node that is only late (its agent spooling while the collector is
    out of reach) leaves the others working: nothing is raised; a short agent restart never stays
    silent long enough to count."""
    silent = silent_nodes(job)
    if not silent or job.ended_at is not None:
        return []
    found = waits(job, t, None)
    if found is None:
        return []
    since, waiting = found
    out = []
    for node, last in sorted(silent.items()):
        if since > last + timedelta(seconds=2 * t["evidence_block_seconds"]):
            continue  # the others waited only long after it fell silent: another cause
        out.append(Finding(node, last, {"node": node, "last_sample": last.isoformat(),
                                        "waiting_gpus": len(waiting)},
                           f"{node} stopped reporting at {last:%H:%M} while the job ran, and the job's "
                           f"{len(waiting)} GPUs elsewhere wait since: the node or its agent is down. Admins: check "
                           f"{node} (sinfo -R, its console, slurmd); users: the job will not resume: cancel or "
                           f"requeue it, excluding {node} (--exclude={node})."))
    return out


KILL_CLEANUP_XID = 45
"""Preemptive cleanup: the driver removing the channels of processes that went away. Alone, and at
the job's end, it is the job being cancelled or killed while its kernels ran, not a fault."""
KILL_WINDOW = timedelta(minutes=2)


def _cleanup_of_a_kill(s: GpuStats, job: JobView) -> bool:
    """XID 45 alone, within KILL_WINDOW of the job's end -- or of the GPU's last sample while the
    end is not known yet: a job being killed stops reporting."""
    at = s.xids[KILL_CLEANUP_XID]
    end = job.ended_at or s.last_ts
    return at >= end - KILL_WINDOW and (job.ended_at is not None or s.last_ts - at < KILL_WINDOW)


def xid_application(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """An XID that NVIDIA attributes to the application: the job's code faulted on the GPU. XID 45
    alone at the job's end is the cleanup after a cancellation (`_cleanup_of_a_kill`): no flag."""
    codes = sorted(x for x in s.xids if x in APPLICATION_XIDS)
    if not codes or (codes == [KILL_CLEANUP_XID] and _cleanup_of_a_kill(s, job)):
        return None
    meaning = "; ".join(f"XID {c}: {APPLICATION_XIDS[c]}" for c in codes)
    ranks = job.ranks_on(s)
    return Finding(s.key, min(s.xids[c] for c in codes), {"xids": codes, **({"ranks": ranks} if ranks else {})},
                   f"{s.where}: {meaning}. This is the job's code, not the node: rerun the failing step with "
                   f"CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer to find the kernel.")


RULES = (
    Rule("xid_error", "gpu", "hardware", "critical", "an XID of the node's hardware or driver",
         ("xids",), (), gpu_check=xid_error),
    Rule("gpu_lost", "gpu", "hardware", "critical", "a GPU that stopped answering NVML",
         ("lost_at",), (), gpu_check=gpu_lost),
    Rule("ecc_uncorrectable", "gpu", "hardware", "critical", "uncorrectable ECC errors or a pending/failed row remap",
         ("ecc",), (), gpu_check=ecc_uncorrectable),
    Rule("ecc_correctable", "gpu", "hardware", "warning", "a storm of corrected ECC errors",
         ("ecc",), ("ecc_sbe_errors", "window_minutes"), gpu_check=ecc_correctable),
    Rule("hw_throttling", "gpu", "hardware", "warning", "hardware slowdown (thermal, power brake)",
         ("blocks", "last_ts"), ("evidence_minutes", "evidence_z", "hw_throttle_share"), gpu_check=hw_throttling),
    Rule("pcie_downgraded", "gpu", "hardware", "warning", "PCIe link below its maximum under load",
         ("pcie_below_max_share", "pcie_loaded_samples", "pcie_link"), ("min_samples", "pcie_below_max_share"),
         gpu_check=pcie_downgraded),
    Rule("xid_application", "gpu", "code", "warning", "an XID caused by the application's own kernels",
         ("xids",), (), gpu_check=xid_application),
    Rule("node_lost", "job", "hardware", "critical", "a node of a running job stopped reporting while the job's "
         "other GPUs wait", ("last_ts", "reporting", "blocks", "ended_at"),
         ("hang_minutes", "hang_duty_percent", "hang_sm_percent", "hang_traffic_kbs", "hang_idle_power_share",
          "hang_power_share", "idle_share", "evidence_block_seconds"), job_check=node_lost),
)
