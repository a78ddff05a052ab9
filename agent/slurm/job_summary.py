"""A job's summary as the collector serves it (`GET /v1/jobs/ID`), waited for: it is written once
the job's end has been judged, a rules cycle after the epilog reported it. Standard library only:
the Slurm controller's scripts (MailProg, EpilogSlurmctld) use it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


def fetch(collector: str, token_file: Path, cluster: str | None, job_id: str, wait_s: float) -> dict[str, Any] | None:
    """The job's summary (JSON), or None when none came within ``wait_s``; raises on an answer that
    waiting will not change (a refused token, a server error) and when the collector cannot be reached."""
    if not collector:
        return None
    token = token_file.read_text().split("\n", 1)[0].strip()
    query = f"?{urllib.parse.urlencode({'cluster': cluster})}" if cluster else ""
    request = urllib.request.Request(f"{collector.rstrip('/')}/v1/jobs/{urllib.parse.quote(job_id)}{query}",
                                     headers={"Authorization": f"Bearer {token}"})
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                found = json.loads(r.read()).get("summary")
            if isinstance(found, dict) and isinstance(found.get("text"), str):
                return found
        except urllib.error.HTTPError as exc:
            if exc.code != 404:  # the end not reported yet: wait; anything else will not change
                raise
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(2.0, max(deadline - time.monotonic(), 0.1)))
