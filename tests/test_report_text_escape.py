"""A job's own strings reach `jobpulse report`'s text with every control character escaped (issue
64): a phase named "checkpoint\\r\\nBcc: x\\r\\nSubject: y" stays one line of the report."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import httpx
import msgspec

from jobpulse.schema import wire

from .batches import full_batch
from .conftest import RunningCollector

EVIL = "checkpoint\r\nBcc: x\r\nSubject: y"


def test_a_phase_name_with_cr_lf_is_one_escaped_line_of_the_text_report(collector: RunningCollector, dsn: str) -> None:
    b = full_batch(job_id="6401")
    phase = [wire.AppEvent(ts=b.created_at + timedelta(seconds=s), pid=4242, kind=kind, uid=1000, job_id="6401",
                           step="0", rank=0, name=EVIL) for s, kind in ((0, "phase_start"), (2, "phase_end"))]
    b = msgspec.structs.replace(b, jobs=[msgspec.structs.replace(b.jobs[0], job_name="train\nSubject: z")],
                                events=phase)
    r = httpx.post(f"{collector.url}/v1/batches", content=wire.encode(b), timeout=30,
                   headers={"Authorization": f"Bearer {collector.token}", "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", "6401", "--dsn", dsn],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "checkpoint\\x0d\\x0aBcc: x\\x0d\\x0aSubject: y" in out and "train\\x0aSubject: z" in out, out
    assert not [line for line in out.splitlines() if line.lstrip().startswith(("Bcc:", "Subject:"))], out
    assert "\r" not in out
