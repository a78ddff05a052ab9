"""Trace summary: where a rank's GPU time went, from a PyTorch profiler (Kineto) trace.

The figures are Holistic Trace Analysis' (HTA): its temporal breakdown (idle, computation, the rest),
its idle time by cause per CUDA stream (the host had not launched the next kernel; a launch gap under
30 us; waiting on something else), communication/computation overlap and time by kernel type — the
same event selection and rules, computed here without pandas so the agent can run them on the node
(tests/unit/test_trace_summary.py checks them against HTA's own on real traces). Bounded: the compressed
file and what it unpacks to are capped, and only the fields used are decoded.
"""

from __future__ import annotations

import math
import re
import sys
import zlib
from collections import defaultdict
from typing import Any

import msgspec

from jobpulse.schema import wire

MAX_UNPACKED_BYTES = 512 * 2**20
KERNEL_WAIT_US = 30  # HTA's consecutive_kernel_delay: shorter gaps on a stream are launch overhead
_STEP = re.compile(r"^ProfilerStep#\d+")
_MEMORY = re.compile(r"^(hip)?Memcpy|^(hip)?Memset|^dma")
_NOT_COMPUTE = re.compile(r"^nccl|.*Memcpy|.*Memset|.*dma|^.*Sync|cuda.*LaunchKernel|^runFunction")
_STREAM_CATS = {"kernel", "Kernel", "gpu_memset", "Memset", "gpu_memcpy", "Memcpy", "mtia_ccp_events"}


class BadTrace(ValueError):
    """Not a profiler trace this can read (the reason says why)."""


class _Event(msgspec.Struct):
    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    ts: Any = None
    dur: Any = None
    args: dict[str, Any] = {}


class _Trace(msgspec.Struct):
    traceEvents: list[_Event]
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None


_decoder = msgspec.json.Decoder(_Trace)


def unpack(data: bytes, limit: int = MAX_UNPACKED_BYTES) -> bytes:
    """The trace's JSON from gzip (or plain JSON), at most ``limit`` bytes of it."""
    if data[:2] != b"\x1f\x8b":
        if len(data) > limit:
            raise BadTrace(f"the trace is over {limit} bytes")
        return data
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflate.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadTrace(f"not a gzip file: {exc}") from None
    if len(out) > limit:
        raise BadTrace(f"the trace unpacks to over {limit} bytes: ask for fewer steps")
    if not inflate.eof:
        raise BadTrace("the gzip file is truncated")
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(end - start for start, end in intervals)


def kernel_type(name: str) -> str:
    """HTA's kernel types: COMMUNICATION (nccl), MEMORY (memcpy, memset), COMPUTATION, OTHER (syncs)."""
    if name.startswith("nccl"):
        return "COMMUNICATION"
    if _MEMORY.match(name):
        return "MEMORY"
    return "OTHER" if _NOT_COMPUTE.match(name) else "COMPUTATION"


def short_name(name: str) -> str:
    """A kernel's name without its return type, template arguments and parameters."""
    if _MEMORY.match(name):
        return name[:256]
    out, depth = [], 0
    for ch in name.removeprefix("void ").replace("(anonymous namespace)", "anon"):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    return ("".join(out).strip() or name)[:256]


def type_times(kernels: list[tuple[int, int, str]]) -> dict[str, int]:
    """Time by the set of kernel types running at once, named as HTA names them
    ("COMPUTATION overlapping COMMUNICATION")."""
    order = ("COMPUTATION", "COMMUNICATION", "MEMORY")
    edges: list[tuple[int, int]] = []
    for bit, kind in enumerate(order):
        for start, end in _merged([(s, e) for s, e, k in kernels if k == kind]):
            edges += [(start, 1 << bit), (end, -(1 << bit))]
    edges.sort(key=lambda e: e[0])
    out: dict[str, int] = defaultdict(int)
    running = 0
    for (time, change), nxt in zip(edges, edges[1:] + [(None, 0)], strict=True):
        running += change
        if running > 0 and nxt[0] is not None:
            out[" overlapping ".join(k for bit, k in enumerate(order) if running & (1 << bit))] += nxt[0] - time
    return dict(out)


def figures(trace: _Trace) -> dict[str, Any]:
    """HTA's figures for one rank's trace, in the trace's time unit (microseconds)."""
    events = [e for e in trace.traceEvents if e.ph == "X" and e.cat != "gpu_user_annotation"
              and isinstance(e.ts, (int, float)) and isinstance(e.dur, (int, float)) and isinstance(e.name, str)]
    rows = []
    for e in events:
        start, end = math.ceil(e.ts), math.floor(e.ts + e.dur)  # HTA rounds sub-microsecond times inward
        stream, corr = _int(e.args.get("stream")), _int(e.args.get("correlation"))
        rows.append((start, end, e, -1 if stream is None else stream, -1 if corr is None else corr))
    gpu = [r for r in rows if r[3] >= 0 and r[4] >= 0]
    cpu = [r for r in rows if not (r[3] >= 0 and r[4] >= 0)]
    steps = sorted({r[2].name for r in cpu if _STEP.match(r[2].name)})
    if len(steps) >= 2:  # HTA leaves out the last (often incomplete) step's kernels
        last = max(r[0] for r in cpu if r[2].name in steps)
        cpu = [r for r in cpu if r[0] < last]
        launched = {r[4] for r in cpu}
        gpu = [r for r in gpu if r[4] in launched]
    if not gpu:
        raise BadTrace("the trace has no GPU kernels (was the CUDA activity profiled?)")
    busy = _merged([(r[0], r[1]) for r in gpu])
    span = busy[-1][1] - busy[0][0]
    idle = span - _length(busy)
    kinds = [(r[0], r[1], kernel_type(r[2].name)) for r in gpu]
    compute = _length(_merged([(s, e) for s, e, k in kinds if k == "COMPUTATION"]))
    comm = _merged([(s, e) for s, e, k in kinds if k == "COMMUNICATION"])
    overlap = None
    if comm:
        edges = sorted([(s, 1) for s, _ in comm] + [(e, -1) for _, e in comm]
                       + [(s, 2) for s, e in _merged([(s, e) for s, e, k in kinds if k == "COMPUTATION"])]
                       + [(e, -2) for s, e in _merged([(s, e) for s, e, k in kinds if k == "COMPUTATION"])],
                       key=lambda x: x[0])
        running, both = 0, 0
        for (time, change), nxt in zip(edges, edges[1:], strict=False):
            running += change
            if running == 3:
                both += nxt[0] - time
        overlap = 100 * both / _length(comm)
    launch_ts: dict[int, int] = {}
    for r in cpu:
        if r[4] >= 0:
            launch_ts.setdefault(r[4], r[0])
    waits = {"host_wait": 0, "kernel_wait": 0, "other": 0}
    streams: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for r in gpu:
        if r[2].cat in _STREAM_CATS:
            streams[r[3]].append((r[0], r[1], r[4]))
    for kernels in streams.values():
        kernels.sort(key=lambda k: k[0])
        for (_, prev_end, _), (start, _, corr) in zip(kernels, kernels[1:], strict=False):
            gap = start - prev_end
            launched_at = launch_ts.get(corr)
            cause = ("host_wait" if launched_at is not None and launched_at > prev_end
                     else "kernel_wait" if gap < KERNEL_WAIT_US else "other")
            waits[cause] += gap
    per_kernel: dict[str, int] = defaultdict(int)
    for r in gpu:
        if r[2].cat in _STREAM_CATS:
            per_kernel[short_name(r[2].name)] += r[1] - r[0]
    return {"span_us": span, "idle_us": idle, "compute_us": compute, "non_compute_us": span - compute - idle,
            "overlap_percent": overlap, "waits_us": waits, "type_us": type_times(kinds),
            "kernels_us": dict(per_kernel), "steps": max(0, len(steps) - 1) if len(steps) >= 2 else len(steps)}


def decode(data: bytes) -> _Trace:
    try:
        return _decoder.decode(unpack(data))
    except msgspec.DecodeError as exc:
        raise BadTrace(f"not a profiler trace (Chrome trace JSON with traceEvents): {exc}") from None


def summarize(data: bytes) -> wire.TraceSummary:
    """The summary of one rank's trace file (gzip or plain JSON); BadTrace says why there is none."""
    trace = decode(data)
    f = figures(trace)
    span = f["span_us"] or 1

    def pct(us: float, of: float = span) -> float:
        return round(min(100.0, max(0.0, 100 * us / of)), 2) if of else 0.0

    waits = f["waits_us"]
    waited = sum(max(0, w) for w in waits.values())
    kernel_total = sum(f["kernels_us"].values())
    top = sorted(f["kernels_us"].items(), key=lambda kv: -kv[1])[:5]
    rank = (trace.distributedInfo or {}).get("rank")
    devices = trace.deviceProperties or []
    return wire.TraceSummary(
        span_s=round(f["span_us"] / 1e6, 6), steps=f["steps"], idle_percent=pct(f["idle_us"]),
        compute_percent=pct(f["compute_us"]), communication_percent=pct(f["type_us"].get("COMMUNICATION", 0)),
        memory_percent=pct(f["type_us"].get("MEMORY", 0)),
        overlap_percent=None if f["overlap_percent"] is None else round(min(100.0, f["overlap_percent"]), 2),
        host_wait_percent=pct(max(0, waits["host_wait"]), waited),
        launch_gap_percent=pct(max(0, waits["kernel_wait"]), waited),
        other_wait_percent=pct(max(0, waits["other"]), waited),
        top_kernels=[wire.KernelShare(name=name, percent=pct(us, kernel_total)) for name, us in top if kernel_total],
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None,
        device=str(devices[0].get("name", ""))[:128] if devices and isinstance(devices[0], dict) else "")


def main() -> int:
    """`python -m jobpulse.agent.capture.trace_summary`: a trace on stdin, its summary (JSON) on stdout, or why
    not on stderr (status 2). The agent runs this in a bounded child (`bounded`), never in itself."""
    try:
        summary = summarize(sys.stdin.buffer.read())
    except BadTrace as exc:
        print(exc, file=sys.stderr)
        return 2
    except MemoryError:
        print(f"the trace needs more memory to summarize than the agent allows (unpacked at most "
              f"{MAX_UNPACKED_BYTES >> 20} MiB): ask for fewer steps", file=sys.stderr)
        return 2
    sys.stdout.buffer.write(msgspec.json.encode(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
