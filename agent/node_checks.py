"""`jobpulse-agent validate`: is this node configured and healthy as it should be?

Each check compares what NVML (and the kernel log, where readable) shows with what an expect
file says, or, without one, with what a healthy node of any kind must look like: ECC and
persistence on, PCIe links at their maximum, every GPU with as many NVLinks as its best peer,
no pending row remaps, no throttling at rest, power limits at their default, every RDMA port
ACTIVE and LinkUp at its best rate and width with no error counted. PCIe links may train down
when idle, so a slow link on an idle GPU is a warning that says so.
"""

from __future__ import annotations

import json
import subprocess
import tomllib
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobpulse.agent.nvml import Nvml
from jobpulse.agent.sources.fabric import FabricSampler
from jobpulse.agent.sources.gpu import GpuSampler
from jobpulse.agent.sources.topology import matrix, snapshot
from jobpulse.schema import wire
from jobpulse.schema.fields import FABRIC_LINK_ERRORS
from jobpulse.schema.semantics import HW_SLOWDOWN_BITS, IDLE_PERCENT

DEFAULT_MAX_IDLE_TEMP_C = 50


@dataclass(frozen=True)
class Result:
    check: str
    status: str  # pass, warn, fail
    observed: str
    expected: str
    message: str = ""
    gpu_uuid: str | None = None

    def line(self) -> str:
        where = f" [{self.gpu_uuid}]" if self.gpu_uuid else ""
        return (f"{self.status.upper():4}  {self.check}{where}: observed {self.observed}, expected {self.expected}"
                + (f" — {self.message}" if self.message else ""))


def _judge(check: str, observed: Any, expected: Any, gpu: str | None = None, message: str = "",
           severity: str = "fail") -> Result:
    ok = observed == expected
    return Result(check, "pass" if ok else severity, str(observed), str(expected), "" if ok else message, gpu)


def load_expect(path: Path) -> dict[str, Any]:
    try:
        return dict(tomllib.loads(path.read_text()).get("node", {}))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"--expect {path}: {exc}") from None


def observe(nvml: Nvml, sysfs_root: Path = Path("/sys")) -> dict[str, Any]:
    """Everything the checks look at, read once."""
    ts = datetime.now(UTC)
    fabric = FabricSampler(sysfs_root, lambda: None)
    ports = fabric.sample(ts)
    fabric.close()
    sampler = GpuSampler(nvml, lambda _: None)
    samples = {s.gpu_uuid: s for s in sampler.sample(ts)}
    topo = snapshot(nvml, ts)
    gpus = []
    for g in nvml.physical:  # the hardware: a MIG instance has no link, ECC or power of its own
        s = samples.get(g.uuid)
        t = next(t for t in topo if t.gpu_uuid == g.uuid)
        default_mw = nvml.read(g, "power_default_limit_mw")
        gpus.append({"uuid": g.uuid, "index": g.index, "model": g.name, "sample": s, "topology": t,
                     "ecc": nvml.ecc_enabled(g), "persistence": nvml.persistence_enabled(g),
                     "power_default_w": None if default_mw is None else default_mw / 1000})
    return {"ts": ts, "driver": nvml.driver_version(), "cuda": nvml.cuda_version(), "gpus": gpus,
            "matrix": matrix(topo), "xids": kernel_xids(), "fabric": ports}


def kernel_xids() -> int | None:
    """NVIDIA XID lines in the kernel log since boot, or None when it cannot be read here."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return sum(1 for line in out.stdout.splitlines() if "NVRM: Xid" in line)


def run_checks(seen: dict[str, Any], expect: dict[str, Any]) -> list[Result]:
    out: list[Result] = []
    gpus = seen["gpus"]
    # Without an expectation these are recorded as seen, so the report can compare nodes.
    out.append(_judge("gpu_count", len(gpus), expect.get("gpu_count", len(gpus)), message="GPUs missing or extra"))
    for key, name in (("driver_version", "driver"), ("cuda_version", "cuda")):
        out.append(_judge(key, seen[name], expect.get(key, seen[name]), message="version differs"))
    links = [g["topology"].nvlinks_up for g in gpus if g["topology"].nvlinks_up is not None]
    best_links = max(links) if links else None
    for g in gpus:
        uuid, s, t = g["uuid"], g["sample"], g["topology"]
        out.append(_judge("gpu_model", g["model"], expect.get("gpu_model", g["model"]), uuid, "wrong GPU model"))
        if g["ecc"] is not None:
            out.append(_judge("ecc_mode", "on" if g["ecc"] else "off",
                              "on" if expect.get("ecc", True) else "off", uuid, "ECC setting differs"))
        if g["persistence"] is not None:
            out.append(_judge("persistence_mode", "on" if g["persistence"] else "off",
                              "on" if expect.get("persistence", True) else "off", uuid,
                              "persistence mode differs (slow first CUDA call, lost settings)", severity="warn"))
        if s is None:
            out.append(Result("gpu_responds", "fail", "no answer", "answers", "GPU did not answer NVML", uuid))
            continue
        out.extend(_pcie(s, expect, uuid))
        if t.nvlinks_up is not None:
            want = expect.get("nvlinks_per_gpu", best_links)
            out.append(_judge("nvlink_up", t.nvlinks_up, want, uuid, "NVLink links down"))
        if s.remap_pending is not None:
            out.append(_judge("row_remap_pending", s.remap_pending, False, uuid,
                              "a row remap waits for a GPU reset: drain the node and reset the GPU"))
        if s.remap_failure is not None:
            out.append(_judge("row_remap_failure", s.remap_failure, False, uuid, "row remapping failed: RMA"))
        idle = (s.sm_util or 0) <= IDLE_PERCENT
        if idle and s.gpu_temp_c is not None:
            limit = expect.get("max_idle_temp_c", DEFAULT_MAX_IDLE_TEMP_C)
            out.append(Result("temperature_at_rest", "pass" if s.gpu_temp_c <= limit else "warn",
                              f"{s.gpu_temp_c} C", f"<= {limit} C",
                              "" if s.gpu_temp_c <= limit else "hot at rest: check cooling", uuid))
        if idle and s.clock_event_reasons is not None:
            hw = s.clock_event_reasons & HW_SLOWDOWN_BITS
            out.append(Result("clocks_at_rest", "fail" if hw else "pass", f"reasons 0x{s.clock_event_reasons:x}",
                              "no HW slowdown", "hardware slowdown at rest (thermal, power brake)" if hw else "",
                              uuid))
        default, limit_w = g["power_default_w"], s.power_limit_w
        if limit_w is not None and (default is not None or "power_limit_w" in expect):
            want = expect.get("power_limit_w", default)
            out.append(_judge("power_limit", f"{limit_w:g} W", f"{want:g} W", uuid, "power limit differs",
                              severity="warn" if "power_limit_w" not in expect else "fail"))
    def rows(lines: list[str]) -> str:
        return " | ".join(" ".join(line.split()) for line in lines)
    observed = rows(seen["matrix"].splitlines()[1:])
    out.append(_judge("topology", observed, rows(list(expect["topology"])) if "topology" in expect else observed,
                      message="GPU interconnect differs from the expected matrix"))
    xids = seen["xids"]
    out.append(Result("xid_since_boot", "warn" if xids is None else "pass" if xids == 0 else "fail",
                      "kernel log not readable" if xids is None else str(xids), "0",
                      "" if xids == 0 else "run as root to read the kernel log" if xids is None
                      else "NVIDIA XID errors in the kernel log"))
    out.extend(fabric_checks(seen["fabric"], expect))
    return out


_PORT_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_PHYS_STATES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining", 5: "LinkUp",
                6: "LinkErrorRecovery", 7: "PhyTest"}


def fabric_checks(ports: list[wire.FabricSample], expect: dict[str, Any]) -> list[Result]:
    """Each RDMA port against the site's expectation (`fabric_ports`, `fabric_rate_gbps`, `fabric_width`,
    `fabric_link_layer`, `fabric_max_errors`), else against its own best (the highest rate and width it or
    a port of the same HCA on the node has shown): state, rate, width, error counters."""
    out: list[Result] = []
    if ports or "fabric_ports" in expect:
        want = expect.get("fabric_ports", len(ports))
        out.append(Result("fabric_ports", "pass" if len(ports) == want else "fail", f"{len(ports)} ports",
                          f"{want} ports", "" if len(ports) == want else "RDMA ports missing or extra (an HCA "
                          "not seen by the driver?)"))
    for p in ports:
        key = f"{p.device}/{p.port}"
        state = (f"{_PORT_STATES.get(p.port_state or 0, p.port_state)}, "
                 f"{_PHYS_STATES.get(p.phys_state or 0, p.phys_state)}")
        up = p.port_state == 4 and p.phys_state == 5
        out.append(Result("fabric_state", "pass" if up else "fail", f"{key}: {state}", "ACTIVE, LinkUp",
                          "" if up else "port not up: cable, switch port or subnet manager"))
        if "fabric_link_layer" in expect:
            out.append(_judge("fabric_link_layer", f"{key}: {p.link_layer}", f"{key}: {expect['fabric_link_layer']}",
                              message="link layer differs (InfiniBand or Ethernet: the port's mode)"))
        if not up:
            continue
        want_rate = expect.get("fabric_rate_gbps", p.rate_max_gbps or p.rate_gbps)
        if p.rate_gbps is not None and want_rate is not None:
            ok = p.rate_gbps >= want_rate
            out.append(Result("fabric_rate", "pass" if ok else "fail", f"{key}: {p.rate_gbps:g} Gb/s",
                              f"{want_rate:g} Gb/s", "" if ok else "link below its rate: reseat or replace the "
                              "cable, check the switch port's speed"))
        want_width = expect.get("fabric_width", p.width_max or p.width)
        if p.width is not None and want_width is not None:
            ok = p.width >= want_width
            out.append(Result("fabric_width", "pass" if ok else "fail", f"{key}: {p.width}X", f"{want_width}X",
                              "" if ok else "link trained down to fewer lanes: a bad cable or port"))
        errors = {name: n for name in FABRIC_LINK_ERRORS if (n := getattr(p, name))}
        limit = expect.get("fabric_max_errors")
        total = sum(errors.values())
        status = "pass" if not errors else "fail" if limit is not None and total > limit else "warn"
        out.append(Result("fabric_errors", status,
                          f"{key}: " + (", ".join(f"{k} {v}" for k, v in errors.items()) or "none"),
                          "none" if limit is None else f"at most {limit}",
                          "" if not errors else "link errors counted since the counters were last cleared "
                          "(perfquery -x -R clears them): a count that rises is a bad cable or port"))
    return out


def _pcie(s: wire.GpuSample, expect: dict[str, Any], uuid: str) -> list[Result]:
    if None in (s.pcie_gen, s.pcie_width, s.pcie_gen_max, s.pcie_width_max):
        return []
    want_gen = expect.get("pcie_gen", s.pcie_gen_max)
    want_width = expect.get("pcie_width", s.pcie_width_max)
    observed, expected = f"gen{s.pcie_gen} x{s.pcie_width}", f"gen{want_gen} x{want_width}"
    if s.pcie_gen >= want_gen and s.pcie_width >= want_width:
        return [Result("pcie_link", "pass", observed, expected, "", uuid)]
    if (s.sm_util or 0) <= IDLE_PERCENT and s.pcie_gen_max >= want_gen and s.pcie_width_max >= want_width:
        return [Result("pcie_link", "warn", observed, expected,
                       "GPU idle: the link may be down-clocked at rest; validate under load to be sure", uuid)]
    return [Result("pcie_link", "fail", observed, expected, "PCIe link below its maximum", uuid)]


def record(seen: dict[str, Any]) -> str:
    """An expect file describing this (known-good) node."""
    gpus = seen["gpus"]
    first = gpus[0] if gpus else {}
    s, t = first.get("sample"), first.get("topology")
    lines = ["# jobpulse-agent validate --expect: what a node of this class looks like",
             f"# recorded {seen['ts'].isoformat()}", "[node]", f"gpu_count = {len(gpus)}"]

    def put(key: str, value: Any) -> None:
        if isinstance(value, bool):
            lines.append(f"{key} = {str(value).lower()}")
        elif isinstance(value, str):
            lines.append(f"{key} = {json.dumps(value)}")
        elif value is not None:
            lines.append(f"{key} = {value:g}" if isinstance(value, float) else f"{key} = {value}")

    put("gpu_model", first.get("model"))
    put("driver_version", seen["driver"])
    put("cuda_version", seen["cuda"])
    put("ecc", first.get("ecc"))
    put("persistence", first.get("persistence"))
    if s is not None:
        put("pcie_gen", s.pcie_gen_max)
        put("pcie_width", s.pcie_width_max)
        put("power_limit_w", s.power_limit_w)
    if t is not None:
        put("nvlinks_per_gpu", t.nvlinks_up)
    put("max_idle_temp_c", DEFAULT_MAX_IDLE_TEMP_C)
    active = [p for p in seen.get("fabric", []) if p.port_state == 4]
    if seen.get("fabric"):
        put("fabric_ports", len(seen["fabric"]))
    if active:
        put("fabric_rate_gbps", max(p.rate_gbps or 0.0 for p in active))
        put("fabric_width", max(p.width or 0 for p in active))
        put("fabric_link_layer", active[0].link_layer)
    rows = seen["matrix"].splitlines()[1:]
    lines.append("topology = [\n" + "".join(f"    {json.dumps(r)},\n" for r in rows) + "]")
    return "\n".join(lines) + "\n"


def as_records(results: list[Result], ts: datetime) -> list[wire.NodeValidation]:
    return [wire.NodeValidation(ts=ts, **asdict(r)) for r in results]
