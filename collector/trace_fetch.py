"""`jobpulse trace ID`: fetch a flag's profiler trace from the collector, as the job's owner (a MUNGE
credential made for this one request, from a login node) or as an admin (a bearer token). Standard
library only: a user's environment needs nothing of the collector's."""

from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path


def _credential(capture_id: int, munge_socket: Path | None) -> str:
    try:
        made = subprocess.run(["munge", "-n", "-s", f"jobpulse trace {capture_id}",
                               *(["--socket", str(munge_socket)] if munge_socket else [])],
                              capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        raise OSError("munge is not installed here: run this on a node of the cluster, or pass an admin's "
                      "--token-file") from None
    if made.returncode != 0:
        raise OSError(f"munge could not make a credential: {made.stderr.strip() or made.returncode}")
    return made.stdout.strip()


def fetch(collector: str, capture_id: int, out: Path | None, token_file: Path | None = None,
          munge_socket: Path | None = None) -> Path:
    """Write the trace to ``out`` (default: the collector's file name in this folder) and return where."""
    auth = (f"Bearer {token_file.read_text().split()[0]}" if token_file else _credential(capture_id, munge_socket))
    request = urllib.request.Request(f"{collector.rstrip('/')}/v1/captures/{capture_id}/trace",
                                     headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            name = re.search(r'filename=([\w.+-]+)', answer.headers.get("Content-Disposition", ""))
            path = out or Path(name.group(1) if name else f"capture-{capture_id}.json.gz")
            path.write_bytes(answer.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        reason = re.search(r'"reason":\s*"([^"]*)"', body)
        raise OSError(f"the collector refused ({exc.code}): {reason.group(1) if reason else body[:300]}") from None
    except urllib.error.URLError as exc:
        raise OSError(f"cannot reach the collector at {collector}: {exc.reason}") from None
    return path
