"""MIG through the unmodified pynvml on the fake library: what NVML answers on an instance's handle
and on its parent in MIG mode, and what the agent makes of it (instances as GPUs, per-parent fields)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jobpulse.schema.fields import GPU_FIELDS, PER_PARENT

from .agents import FULL_H100, Scenario, by_id

# Run in a child process: pynvml loads libnvidia-ml.so.1 once, from LD_LIBRARY_PATH.
_PROBE = """
import json, time
from datetime import datetime, timezone
import pynvml
from jobpulse.agent.nvml import Nvml
from jobpulse.agent.sources.gpu import GpuSampler

def answer(fn, *args):
    try:
        fn(*args)
        return "ok"
    except pynvml.NVMLError as exc:
        return type(exc).__name__.removeprefix("NVMLError_")

nvml = Nvml()
parent, a = nvml.gpus[0], nvml.gpus[1]
calls = {name: answer(getattr(pynvml, name), a.handle) for name in (
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMigMode")}
calls["nvmlDeviceGetTemperature"] = answer(pynvml.nvmlDeviceGetTemperature, a.handle, 0)
calls["parent nvmlDeviceGetUtilizationRates"] = answer(pynvml.nvmlDeviceGetUtilizationRates, parent.handle)
calls["parent nvmlDeviceGetProcessUtilization"] = answer(pynvml.nvmlDeviceGetProcessUtilization, parent.handle, 0)
calls["empty slot"] = answer(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, parent.handle, 5)
calls["gpm on the instance's handle"] = answer(pynvml.nvmlGpmSampleGet, a.handle, pynvml.nvmlGpmSampleAlloc())
procs = [(p.pid, p.gpuInstanceId, p.computeInstanceId)
         for p in pynvml.nvmlDeviceGetComputeRunningProcesses(parent.handle)]
back = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(a.handle))
sampler = GpuSampler(nvml, lambda uuid: None)
sampler.sample(datetime.now(timezone.utc))
time.sleep(0.3)  # GPM metrics need two samples
samples = {s.gpu_uuid: {f: getattr(s, f) for f in s.__struct_fields__ if f != "ts"}
           for s in sampler.sample(datetime.now(timezone.utc))}
es = nvml.event_set(pynvml.nvmlEventTypeXidCriticalError)
events = [nvml.wait_event(es, 2000) for _ in range(2)]
print(json.dumps({"gpus": [[g.uuid, g.parent.uuid if g.parent else None, g.gi, g.ci, g.profile] for g in nvml.gpus],
                  "calls": calls, "procs": procs, "back": back, "samples": samples,
                  "events": [[[g.uuid for g in gpus], code] for gpus, _, code in events]}))
"""


def test_nvml_answers_a_mig_instance_as_documented_and_the_agent_samples_it(fake_nvml: Path,
                                                                            tmp_path: Path) -> None:
    counters = dict.fromkeys(by_id(f for f in GPU_FIELDS if f.per_parent), 5)
    scenario = (Scenario().gpu(0, "GPU-p", "00000000:17:00.0", **FULL_H100, **counters)
                .mig(0, 100, 0, "MIG-a", gi=7, profile="1g.10gb", fb_total_mib=9_856, fb_used_mib=1_234, gpm_sm=40)
                .mig(0, 101, 2, "MIG-b", gi=8, ci=1, profile="2g.20gb", fb_total_mib=19_968, fb_used_mib=0)
                .add("proc 0 100 4242 1000 0 0").add("proc 0 101 4343 2000 0 0")
                .add("xid 0 101 31").add("xid 0.1 0 79"))
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_SCENARIO": str(scenario.write(tmp_path / "s"))}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])  # after the log lines
    assert got["gpus"] == [["GPU-p", None, None, None, None], ["MIG-a", "GPU-p", 7, 0, "1g.10gb"],
                           ["MIG-b", "GPU-p", 8, 1, "2g.20gb"]]
    # On an instance's handle: memory and processes; what exists only on the GPU is NOT_SUPPORTED.
    assert got["calls"] == {
        "nvmlDeviceGetPowerUsage": "NotSupported", "nvmlDeviceGetUtilizationRates": "NotSupported",
        "nvmlDeviceGetTemperature": "NotSupported", "nvmlDeviceGetMemoryInfo": "ok",
        "nvmlDeviceGetComputeRunningProcesses": "ok", "nvmlDeviceGetMigMode": "NotSupported",
        "parent nvmlDeviceGetUtilizationRates": "NotSupported",
        "parent nvmlDeviceGetProcessUtilization": "NotSupported",
        "empty slot": "NotFound", "gpm on the instance's handle": "NotSupported"}
    assert sorted(got["procs"]) == [[4242, 7, 0], [4343, 8, 1]]  # the parent's list: every instance's, with ids
    assert got["back"] == "GPU-p"
    parent, a, b = got["samples"]["GPU-p"], got["samples"]["MIG-a"], got["samples"]["MIG-b"]
    assert {f: a[f] for f in PER_PARENT} == {f: parent[f] for f in PER_PARENT}
    assert all(parent[f] is not None for f in PER_PARENT if f not in ("nvlink_rx_kbs", "nvlink_tx_kbs"))
    own = {f.name for f in GPU_FIELDS if not f.per_parent}
    assert {f for f in own if a[f] is not None} == {"fb_used_mib", "fb_total_mib", "fb_reserved_mib", "gpm_sm_active"}
    assert (a["fb_used_mib"], a["fb_total_mib"], a["gpm_sm_active"], a["gpu_index"]) == (1_234, 9_856, 40.0, 0)
    assert b["gpm_sm_active"] is None and parent["sm_util"] is None  # no GPM on MIG-b; no utilization in MIG mode
    # An XID NVML attributes to an instance is that instance's; one of the whole GPU, every instance's.
    assert got["events"] == [[["MIG-b"], 31], [["MIG-a", "MIG-b"], 79]]
