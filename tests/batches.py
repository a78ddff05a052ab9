"""Build realistic wire batches for tests (what an agent on a 2-GPU node would send)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from jobpulse.schema import wire
from jobpulse.schema.fields import GPU_FIELDS

AGENT = wire.AgentInfo(instance="inst-1", node="n1", cluster="testcluster", version="0.1.0",
                       started_at=datetime(2026, 1, 1, tzinfo=UTC))


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _every_field(sample: wire.GpuSample) -> wire.GpuSample:
    """Fields added to the table since these values were written get a value of their type too."""
    unset = {f.name: f.python(1) for f in GPU_FIELDS if getattr(sample, f.name) is None}
    return msgspec.structs.replace(sample, **unset)


def full_batch(seq: int = 0, t0: datetime | None = None, agent: wire.AgentInfo = AGENT,
               job_id: str = "1001") -> wire.Batch:
    """One batch with a record in every section and every GPU field set."""
    t0 = t0 or now()
    gpus = []
    for i in range(2):
        gpus.append(_every_field(wire.GpuSample(
            ts=t0, gpu_uuid=f"GPU-{i:04d}", gpu_index=i, job_id=job_id, sm_util=87, mem_util=40,
            enc_util=0, dec_util=1, jpg_util=2, ofa_util=3, power_w=301.5, power_limit_w=700.0,
            energy_mj=123_456_789_012, gpu_temp_c=61, mem_temp_c=70, sm_clock_mhz=1980, mem_clock_mhz=2619,
            sm_clock_max_mhz=1980, mem_clock_max_mhz=2619, fb_used_mib=40_000, fb_total_mib=81_559,
            pcie_rx_kbs=1_200_000, pcie_tx_kbs=800_000, pcie_gen=5, pcie_width=16, pcie_gen_max=5,
            pcie_width_max=16, pcie_replay=0, nvlink_rx_kbs=90_000_000_000, nvlink_tx_kbs=1, clock_event_reasons=4,
            ecc_sbe_total=2, ecc_dbe_total=0, remapped_correctable=1, remapped_uncorrectable=0,
            remap_pending=False, remap_failure=False, gpm_sm_active=71.25, gpm_sm_occupancy=33.5,
            gpm_tensor_active=12.0, gpm_dram_bw=44.0, gpm_fp16_active=10.0, gpm_fp32_active=20.0,
            gpm_fp64_active=0.0,
        )))
    return wire.Batch(
        version=1, agent=agent, seq=seq, created_at=t0 + timedelta(milliseconds=5),
        gpu_samples=gpus,
        process_samples=[wire.ProcessSample(ts=t0, pid=4242, gpu_uuid="GPU-0000", job_id=job_id, step="0", rank=3,
                                            local_rank=1, gpu_mem_mib=39_000, sm_util=80, mem_util=35,
                                            cpu_percent=180.5, rss_mib=12_000, command="python")],
        health_events=[wire.HealthEvent(ts=t0, kind="xid", gpu_uuid="GPU-0001", job_id=job_id, code=79,
                                        message="GPU has fallen off the bus", attrs={"raw": 79})],
        topology=[wire.TopologyGpu(ts=t0, gpu_uuid=f"GPU-{i:04d}", gpu_index=i, pci_bus_id=f"00000000:1{i}:00.0",
                                   model="NVIDIA H100 80GB HBM3", driver_version="550.54.15", cuda_version="12.4",
                                   numa_node=0, cpu_affinity="0-15", pcie_gen_max=5, pcie_width_max=16,
                                   nvlinks_up=18, mig_mode=False,
                                   links={f"GPU-{1 - i:04d}": "NV18"}, p2p={f"GPU-{1 - i:04d}": "OK"})
                  for i in range(2)],
        jobs=[wire.JobRecord(job_id=job_id, user_name="alice", uid=1000, account="ml", partition="gpu",
                             job_name="train", nodes=["n1", "n2"], gpus_total=4, time_limit_s=3600,
                             submit_time=t0 - timedelta(minutes=5), start_time=t0 - timedelta(minutes=1),
                             state="RUNNING", tags={"project": "llm"},
                             gpus=[wire.JobGpu("GPU-0000", 0, "00000000:10:00.0"),
                                   wire.JobGpu("GPU-0001", 1, "00000000:11:00.0")])],
        events=[wire.AppEvent(ts=t0, pid=4242, level="info", kind="phase_start", uid=1000, job_id=job_id, step="0",
                              rank=3, local_rank=1, name="epoch", message="epoch 4 started",
                              attrs={"epoch": 4, "nested": {"lr": 0.001}})],
    )


def gpu_batch(seq: int, t0: datetime | None = None, n_gpus: int = 2, agent: wire.AgentInfo = AGENT) -> wire.Batch:
    """A plain sampling batch: only GPU samples."""
    t0 = t0 or now()
    return wire.Batch(version=1, agent=agent, seq=seq, created_at=t0, gpu_samples=[
        wire.GpuSample(ts=t0, gpu_uuid=f"GPU-{i:04d}", gpu_index=i, job_id="1001", sm_util=50, fb_used_mib=100)
        for i in range(n_gpus)])


def as_dict(batch: wire.Batch) -> dict[str, Any]:
    return msgspec.json.decode(wire.encode(batch))


def walk(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every place in a decoded JSON document, the document itself first: (path, value)."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from walk(v, (*path, i))


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A deep copy of a decoded JSON document with the value at ``path`` replaced."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc
