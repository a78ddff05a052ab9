"""A private munged (Debian's munge package) with its own key and socket, for tests that check users'
MUNGE credentials without touching the machine's own munged. It runs as the user munge, so it needs
root (as CI runs the suite)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def unavailable() -> str | None:
    """Why a private munged cannot run here, or None."""
    if os.geteuid() != 0:
        return "munged runs as the user munge: the test needs root (CI runs the suite as root)"
    missing = [t for t in ("munged", "munge", "unmunge", "mungekey", "runuser") if shutil.which(t) is None
               and not Path("/usr/sbin", t).exists()]
    return f"not installed: {', '.join(missing)} (make setup installs munge)" if missing else None


@contextmanager
def munged() -> Iterator[Path]:
    """The socket of a munged started for the block, stopped after it."""
    folder = Path(tempfile.mkdtemp(prefix="jobpulse-munge-"))
    folder.chmod(0o755)
    shutil.chown(folder, "munge", "munge")
    socket = folder / "munge.sock"
    as_munge = ["runuser", "-u", "munge", "--"]
    subprocess.run([*as_munge, shutil.which("mungekey") or "/usr/sbin/mungekey", "-c", "-k", str(folder / "key")],
                   check=True, capture_output=True)
    daemon = subprocess.Popen([*as_munge, shutil.which("munged") or "/usr/sbin/munged", "-F",
                               f"--key-file={folder / 'key'}", f"--socket={socket}",
                               f"--pid-file={folder / 'pid'}", f"--log-file={folder / 'log'}",
                               f"--seed-file={folder / 'seed'}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["munge", "-n", "-S", str(socket)], capture_output=True).returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, \
                f"munged did not start: {daemon.stderr.read().decode() if daemon.stderr else ''}"
            time.sleep(0.1)
        yield socket
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(folder, ignore_errors=True)


def credential(socket: Path, payload: str, user: str | None = None) -> str:
    """A credential for ``payload``, made as ``user`` (default: this process's)."""
    command = ["munge", "-n", "-S", str(socket), "-s", payload]
    made = subprocess.run(["runuser", "-u", user, "--", *command] if user else command, capture_output=True,
                          text=True, check=True)
    return made.stdout.strip()
