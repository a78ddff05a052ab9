"""Rules on GPU faults and the node's hardware: throttling, degraded PCIe links, XID errors (the
node's, or the application's own by NVIDIA's catalogue)."""

from __future__ import annotations

from jobpulse.collector.rules.model import Finding, GpuStats, JobView, Rule, Settings, rounded
from jobpulse.schema.semantics import APPLICATION_XIDS


def hw_throttling(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """Hardware slowdown (thermal, power brake) in a share of samples."""
    if s.samples < t["min_samples"] or s.hw_throttle_share < t["hw_throttle_share"]:
        return None
    return Finding(s.key, s.first_ts,
                   {"share_of_samples": rounded(s.hw_throttle_share, 3), "threshold": t["hw_throttle_share"]},
                   f"{s.where} slowed itself down in hardware (thermal or power brake) in "
                   f"{s.hw_throttle_share:.0%} of samples: the node's fault, not the code's — admins: "
                   f"check cooling and power on {s.node}.")


def pcie_downgraded(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """The PCIe link below its maximum generation or width in most samples under load."""
    if s.pcie_below_max_share is None or s.pcie_below_max_share < t["pcie_below_max_share"]:
        return None
    return Finding(s.key, s.first_ts,
                   {"share_of_busy_samples": rounded(s.pcie_below_max_share, 3), "link": s.pcie_link},
                   f"{s.where}'s PCIe link runs below its maximum under load ({s.pcie_link}, current/max "
                   f"gen x width): host-device copies are slower. Admins: reseat or replace the riser, check "
                   f"BIOS link settings on {s.node} (`jobpulse-agent validate` shows it).")


def xid_error(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """An XID of the node's hardware or driver within the look-back."""
    codes = sorted({x for x in s.xids if x not in APPLICATION_XIDS})
    if not codes:
        return None
    return Finding(s.key, s.first_ts, {"xids": codes, "count": len(s.xids)},
                   f"{s.where} reported XID {', '.join(map(str, codes))}: a driver or hardware "
                   f"fault on {s.node}. Admins: drain and inspect the node; users: resubmit excluding it "
                   f"(--exclude={s.node}).")


def xid_application(s: GpuStats, t: Settings, job: JobView) -> Finding | None:
    """An XID that NVIDIA attributes to the application: the job's code faulted on the GPU."""
    codes = sorted({x for x in s.xids if x in APPLICATION_XIDS})
    if not codes:
        return None
    meaning = "; ".join(f"XID {c}: {APPLICATION_XIDS[c]}" for c in codes)
    return Finding(s.key, s.first_ts, {"xids": codes, "ranks": job.ranks_on(s)},
                   f"{s.where}: {meaning}. This is the job's code, not the node: rerun the failing step with "
                   f"CUDA_LAUNCH_BLOCKING=1 or under compute-sanitizer to find the kernel.")


RULES = (
    Rule("hw_throttling", "gpu", "hardware", "warning", "hardware slowdown (thermal, power brake)",
         ("samples", "hw_throttle_share"), ("min_samples", "hw_throttle_share"), gpu_check=hw_throttling),
    Rule("pcie_downgraded", "gpu", "hardware", "warning", "PCIe link below its maximum under load",
         ("pcie_below_max_share", "pcie_link"), ("pcie_below_max_share",), gpu_check=pcie_downgraded),
    Rule("xid_error", "gpu", "hardware", "critical", "an XID of the node's hardware or driver",
         ("xids",), (), gpu_check=xid_error),
    Rule("xid_application", "gpu", "code", "warning", "an XID caused by the application's own kernels",
         ("xids",), (), gpu_check=xid_application),
)
