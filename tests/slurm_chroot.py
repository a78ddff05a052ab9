"""Newer Slurm for the Slurm tier: a Debian chroot per suite (trixie: Slurm 24.11, sid: 26.05), built
from Debian's own packages with mmdebstrap and kept under a cache folder between runs (rebuilt when
its package list changes). `python -m tests.slurm_chroot` builds every missing one (`make chroots`,
as root); the tests only use what is there and say why they skip when it is not.

Inside, only Slurm's daemons and clients are the chroot's: jobpulse's Python (the interpreter's
prefix, the checkout and its virtual environment) is bind-mounted at the same paths, so the hooks that
each version's slurmd runs are the project's own, with that version's environment and clients.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SUITES = {"24.11": "trixie", "26.05": "sid"}
"""Slurm version -> the Debian suite whose packages bring it."""
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "procps", "python3", "postgresql")
"""python3 for the shared libraries jobpulse's bind-mounted interpreter loads (libssl, libffi, ...);
postgresql for `jobpulse watch` inside a job (its own database, started where the job runs)."""
MIRROR = os.environ.get("JOBPULSE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(os.environ.get("JOBPULSE_CHROOT_CACHE") or Path.home() / ".cache" / "jobpulse" / "slurm-chroots")


def _key(suite: str) -> str:
    return hashlib.sha256(" ".join((suite, MIRROR, *PACKAGES)).encode()).hexdigest()[:12]


def path(version: str) -> Path:
    """Where the chroot for ``version`` lives (whether built or not)."""
    suite = SUITES[version]
    return CACHE / f"{suite}-{_key(suite)}"


def unavailable(version: str) -> str | None:
    """Why the chroot of ``version`` cannot be used here, or None."""
    if os.geteuid() != 0:
        return "needs root (chroot, bind mounts; slurmd runs jobs as other users); CI runs as root"
    if not (path(version) / ".built").exists():
        return (f"no Slurm {version} chroot at {path(version)}: `make chroots` (as root) builds it from "
                f"Debian {SUITES[version]}'s packages with mmdebstrap")
    return None


def build(version: str) -> Path:
    """The chroot of ``version``, built unless the cache holds one for the same package list; one
    build at a time per suite (flock), the previous builds of the suite removed."""
    suite, target = SUITES[version], path(version)
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f".{suite}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".built").exists():
            return target
        for old in CACHE.glob(f"{suite}-*"):
            shutil.rmtree(old, ignore_errors=True)
        started = time.monotonic()
        work = CACHE / f".{suite}.building"
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["mmdebstrap", "--variant=apt", "--quiet", f"--include={','.join(PACKAGES)}",
                        "--aptopt=Acquire::Check-Valid-Until \"false\"", "--dpkgopt=path-exclude=/usr/share/doc/*",
                        "--dpkgopt=path-exclude=/usr/share/man/*", suite, str(work), MIRROR], check=True)
        work.rename(target)
        (target / ".built").write_text(f"{suite} built in {time.monotonic() - started:.0f} s\n")
        return target


def main() -> int:
    if os.geteuid() != 0 or not shutil.which("mmdebstrap"):
        print("slurm chroots: not built (needs root and mmdebstrap); the newer-Slurm tests will skip", file=sys.stderr)
        return 0
    for version in SUITES:
        started = time.monotonic()
        where = build(version)
        print(f"slurm {version}: {where} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
