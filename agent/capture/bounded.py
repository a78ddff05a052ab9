"""Bounded work on untrusted bytes: a child process with limits of its own, so what a job hands the
root agent (a profiler trace to summarize) can cost neither the agent's memory nor the GPU sampler's
time. The child gets an address-space ceiling and a CPU-time ceiling (the kernel enforces both, set
with prlimit before it is given any input), the lowest scheduling priority and a wall-clock bound;
the agent's own threads only wait on a pipe meanwhile."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

MEMORY_BYTES = 1024 * 2**20
"""The child's address space: Python, its modules and the work (beyond: MemoryError, reported)."""
CPU_SECONDS = 60
WALL_SECONDS = 90.0
OUTPUT_BYTES = 1 * 2**20


class Refused(RuntimeError):
    """The work did not finish within its bounds, or failed (the message says which, in a user's words)."""


def run(module: str, data: bytes, memory_bytes: int = MEMORY_BYTES, cpu_s: int = CPU_SECONDS,
        wall_s: float = WALL_SECONDS) -> bytes:
    """``python -m module`` with ``data`` on its stdin, within the bounds; its stdout. The module
    answers on stdout, or says why not on stderr with exit status 2 (`Refused` carries that line)."""
    child = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, close_fds=True,
                             env={"PATH": os.defpath, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    try:
        resource.prlimit(child.pid, resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.prlimit(child.pid, resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.prlimit(child.pid, resource.RLIMIT_CORE, (0, 0))
        os.setpriority(os.PRIO_PROCESS, child.pid, 19)
        out, err = child.communicate(data, timeout=wall_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise Refused(f"took over {wall_s:.0f} s") from None
    except (OSError, ValueError) as exc:  # it exited before it took its input, or could not be bounded
        child.kill()
        child.communicate()
        raise Refused(f"could not be run bounded: {exc}") from None
    said = err[-4096:].decode(errors="replace").strip().splitlines()
    if child.returncode == 2 and said:
        raise Refused(said[-1][:500])
    if child.returncode != 0:
        if child.returncode in (-9, -24) or any("MemoryError" in line for line in said):  # SIGKILL, SIGXCPU
            raise Refused(f"needs more than {memory_bytes >> 20} MiB or {cpu_s} s of CPU")
        raise Refused(f"failed (status {child.returncode}): {said[-1][:300] if said else 'no message'}")
    if len(out) > OUTPUT_BYTES:
        raise Refused(f"answered with over {OUTPUT_BYTES} bytes")
    return out
