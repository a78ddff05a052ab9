"""The trace summary's figures are Holistic Trace Analysis' on real PyTorch profiler traces
(tests/data/traces: HTA's own test traces from A100, V100 and MI250 runs, 1 to 2 ranks each; the
figures HTA 0.5.0 gave on them are in hta_figures.json, made by hta_figures.py), and a file that is
not a trace is told apart with its reason."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobpulse.agent.capture import trace_summary
from jobpulse.schema import wire

TRACES = Path(__file__).parents[1] / "data" / "traces"
HTA = json.loads((TRACES / "hta_figures.json").read_text())


def rank_files(name: str) -> list[Path]:
    return sorted((TRACES / name).glob("rank-*.json.gz"))


@pytest.mark.parametrize("name", sorted(HTA["traces"]))
def test_figures_are_htas_on_real_traces(name: str) -> None:
    expected = HTA["traces"][name]
    types: dict[str, float] = {}
    for rank, path in enumerate(rank_files(name)):
        hta = expected[str(rank)]
        mine = trace_summary.figures(trace_summary.decode(path.read_bytes()))
        got = {"span_us": mine["span_us"], "idle_us": mine["idle_us"], "compute_us": mine["compute_us"],
               "non_compute_us": mine["non_compute_us"], "host_wait_us": mine["waits_us"]["host_wait"],
               "kernel_wait_us": mine["waits_us"]["kernel_wait"], "other_wait_us": mine["waits_us"]["other"]}
        assert got == pytest.approx({k: hta[k] for k in got}, abs=1), (name, rank)
        if hta["overlap_percent"] is None:
            assert mine["overlap_percent"] is None
        else:
            assert mine["overlap_percent"] == pytest.approx(hta["overlap_percent"], abs=0.01)
        for kind, us in mine["type_us"].items():
            types[kind] = types.get(kind, 0) + us
    assert {f"kernel_type_us.{k}": v for k, v in types.items()} == pytest.approx(expected["all"], abs=1)


def test_summary_reads_a_waiting_gpu_and_a_busy_one() -> None:
    waiting = trace_summary.summarize((TRACES / "alexnet" / "rank-0.json.gz").read_bytes())
    assert waiting.idle_percent > 99 and waiting.host_wait_percent == 100.0  # the host never kept it fed
    assert waiting.top_kernels[0].name.startswith("Memcpy HtoD")
    busy = trace_summary.summarize((TRACES / "resnet_v100" / "rank-0.json.gz").read_bytes())
    assert busy.idle_percent < 3 and busy.compute_percent > 95 and busy.device == "Tesla V100-SXM2-32GB"
    assert busy.steps == 4 and busy.rank == 0
    two = trace_summary.summarize(rank_files("two_rank_128")[1].read_bytes())
    assert two.rank == 1 and two.overlap_percent == pytest.approx(20.05, abs=0.01)
    assert two.top_kernels[0].name == "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"
    # what is shipped is what the batch accepts
    now = datetime.now(UTC)
    batch = wire.Batch(version=1, agent=wire.AgentInfo(instance="i", node="n1", cluster="c", version="1",
                                                       started_at=now), seq=0, created_at=now,
                       captures=[wire.CaptureResult(id=1, job_id="1", ok=True, summary=two, trace=b"\x1f\x8b")])
    assert wire.decode(wire.encode(batch)).captures == batch.captures


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x00\x01garbage" * 10, "not a profiler trace"),
    (gzip.compress(b'{"traceEvents": [', mtime=0)[:-8], "truncated"),
    (b"\x1f\x8bnot really gzip", "not a gzip file"),
    (gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2,
                                                "args": {}}]}).encode()), "no GPU kernels"),
    (gzip.compress(b'{"traceEvents": "not a list"}'), "not a profiler trace"),
])
def test_what_is_not_a_trace_says_why(data: bytes, reason: str) -> None:
    with pytest.raises(trace_summary.BadTrace, match=reason):
        trace_summary.summarize(data)


def test_a_trace_that_unpacks_too_large_is_refused_without_unpacking_it_all() -> None:
    bomb = gzip.compress(b" " * (8 * 2**20))  # 8 KiB that unpack to 8 MiB
    with pytest.raises(trace_summary.BadTrace, match="over 1048576 bytes"):
        trace_summary.unpack(bomb, limit=2**20)
