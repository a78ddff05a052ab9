"""The in-job client without an agent and without a server: free when no agent listens, stdlib only,
and its logging, structlog and training-loop integrations as the datagrams they send."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path


def test_agent_away_costs_nothing(tmp_path: Path) -> None:
    script = ("import time\nfrom jobpulse.agent import client as jp\nt = time.perf_counter()\n"
              "for i in range(100_000): jp.event('x', i=i)\n"
              "print(time.perf_counter() - t, jp.dropped())")
    env = {**os.environ, "JOBPULSE_EVENTS_SOCKET": str(tmp_path / "no-agent.sock")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    elapsed, dropped = float(out[0]), int(out[1])
    print(f"\n100,000 event() calls with no agent: {elapsed:.3f} s")
    assert dropped == 100_000
    assert elapsed < 2.0


def test_client_is_stdlib_only_and_the_example_compiles() -> None:
    """The client must import in any training environment: nothing outside the standard library."""
    code = ("import sys; before = set(sys.modules); import jobpulse.agent.client as c; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "extra = new - set(sys.stdlib_module_names) - {'jobpulse'}; assert not extra, extra")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    example = Path(__file__).resolve().parents[2] / "slurm" / "examples" / "train_with_events.py"
    subprocess.run([sys.executable, "-m", "py_compile", str(example)], check=True, timeout=60)


def test_logging_handler_structlog_processor_and_training_hooks(tmp_path: Path) -> None:
    """The integrations, against a real agent socket stand-in (a datagram socket read here)."""
    import socket as _socket

    sock_path = tmp_path / "ev.sock"
    receiver = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
    receiver.bind(str(sock_path))
    script = textwrap.dedent("""
        import logging
        from jobpulse.agent import client as jp
        log = logging.getLogger("train"); log.addHandler(jp.Handler()); log.setLevel(logging.INFO)
        log.warning("loader slow: %d s", 41)
        jp.structlog_processor(None, "error", {"event": "nan loss", "step": 7, "level": "error"})
        hooks = jp._TrainingHooks()
        hooks._epoch_start(2); hooks._step(5, samples=64, loss="0.5"); hooks._epoch_end(val_loss=0.25)
        try:
            jp.lightning_callback()
        except ImportError:
            jp.event("no lightning here")
    """)
    subprocess.run([sys.executable, "-c", script], env={**os.environ, "JOBPULSE_EVENTS_SOCKET": str(sock_path)},
                   check=True, timeout=60)
    receiver.setblocking(False)
    got = []
    while True:
        try:
            data = receiver.recv(65536)
        except BlockingIOError:
            break
        if data:  # empty: the client's `sync` at exit (unanswered here: it waited its 2 s)
            got.append(json.loads(data))
    receiver.close()
    kinds = [(m["kind"], m["level"], m["name"], m["message"]) for m in got]
    assert kinds == [("log", "warning", None, "loader slow: 41 s"), ("log", "error", None, "nan loss"),
                     ("phase_start", "info", "epoch", "epoch started"), ("step", "info", "step", "step 5"),
                     ("phase_end", "info", "epoch", "epoch ended"), ("log", "info", None, "no lightning here")]
    assert got[0]["attrs"] == {"logger": "train"} and got[1]["attrs"] == {"step": 7}
    assert got[3]["attrs"] == {"step": 5, "samples": 64, "loss": 0.5}
    assert got[4]["attrs"]["epoch"] == 2 and got[4]["attrs"]["val_loss"] == 0.25 and got[4]["attrs"]["status"] == "ok"
