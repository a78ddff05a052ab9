"""`jobpulse watch -- COMMAND` as a researcher runs it: a private database, collector and agent of the
user's own around COMMAND, the job's summary at its end, COMMAND's exit status and output untouched;
two at once on one node; Ctrl-C; no NVML (COMMAND still runs); nothing left running afterwards.

It runs as ``nobody`` where the suite runs as root (CI): with this Python where nobody may run it,
else with the system's Python of the same version over this checkout (a pyenv interpreter under
/root, mode 0700, is root's alone); elsewhere as the test's own user. Nothing it does needs root
(the database runs as whoever starts it)."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .agents import Scenario, unprivileged_python

# As nobody where root may run things as another user (CI): this interpreter, or the system's of its
# version over this checkout where nobody cannot run this one; else as the test's own user.
_UNPRIVILEGED = unprivileged_python("nobody")
RUNNER = ["runuser", "-u", "nobody", "--"] if _UNPRIVILEGED else []
PYTHON, PYTHONPATH = _UNPRIVILEGED or (sys.executable, os.environ.get("PYTHONPATH", ""))
USER = "nobody" if RUNNER else pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def home(fake_nvml: Path) -> Iterator[Path]:
    """A folder the unprivileged user owns, with the fake NVML library and a node of two GPUs."""
    root = Path(tempfile.mkdtemp(prefix="jobpulse-watch-test-"))
    shutil.copy(fake_nvml / "libnvidia-ml.so.1", root)
    (Scenario().gpu(0, "GPU-w-0", "00000000:17:00.0", minor=0, sm=80, mem=30, fb_total_mib=81_559, fb_used_mib=9000,
                    power_mw=300_000)
     .gpu(1, "GPU-w-1", "00000000:65:00.0", minor=1, sm=0, mem=0, fb_total_mib=81_559, fb_used_mib=3,
          power_mw=60_000).write(root / "node.scn"))
    uid = pwd.getpwnam(USER).pw_uid
    for p in (root, *root.iterdir()):
        os.chown(p, uid, -1)
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def watch(home: Path, folder: str, *command: str, nvml: bool = True) -> subprocess.Popen[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": PYTHONPATH or ""}
    if nvml:
        env |= {"LD_LIBRARY_PATH": str(home), "FAKE_NVML_SCENARIO": str(home / "node.scn")}
    # As from a terminal: Ctrl-C's SIGINT at its default (a pytest-xdist worker ignores it, and an
    # ignored signal stays ignored across exec).
    return subprocess.Popen([*RUNNER, "env", *(f"{k}={v}" for k, v in env.items()),
                             PYTHON, "-m", "jobpulse.collector.cli", "watch", "--dir", str(home / folder),
                             "--", *command], cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def left_running(home: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if str(home) in line and "runuser" not in line]


def test_two_watched_jobs_at_once_as_a_user_with_their_summaries_and_exit_status(home: Path) -> None:
    started, wall = time.monotonic(), time.time()
    a = watch(home, "a", "bash", "-c", "echo from-a; sleep 6; exit 3")
    b = watch(home, "b", "bash", "-c", "date +%s.%N; sleep 6")
    out_a, err_a = a.communicate(timeout=180)
    out_b, err_b = b.communicate(timeout=180)
    took = time.monotonic() - started
    startup = float(out_b) - wall
    print(f"\n{err_a}\n(two watches at once: {took:.0f} s for 6 s commands; the second COMMAND ran "
          f"{startup:.1f} s after its watch started, beside the first's start-up)")
    assert a.returncode == 3 and b.returncode == 0, (err_a, err_b)
    assert out_a == "from-a\n" and float(out_b), "COMMAND's output is its own"
    for err, folder in ((err_a, "a"), (err_b, "b")):
        assert "watching job" in err and "(2 GPUs)" in err, err
        assert "GPU-hours:" in err and "GPU0: 8" in err and "GPU1: 0% busy" in err, err
        assert list((home / folder).glob("report-*.html")), "the HTML report"
        assert (home / folder / "postgres" / "PG_VERSION").exists(), "the database stays for later"
    assert ", FAILED after" in err_a and ", COMPLETED after" in err_b
    assert left_running(home) == []


def test_ctrl_c_and_no_nvml(home: Path) -> None:
    w = watch(home, "c", "sleep", "120")
    deadline = time.monotonic() + 60
    log = home / "c" / "agent.log"
    while not log.exists() or "job registered" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the watch did not start"
        time.sleep(0.3)
    time.sleep(2)
    os.killpg(w.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    _, err = w.communicate(timeout=120)
    assert w.returncode == 130 and ", CANCELLED after" in err, err
    assert left_running(home) == []

    bare = watch(home, "d", "bash", "-c", "echo still-runs; exit 4", nvml=False)
    out, err = bare.communicate(timeout=120)
    assert bare.returncode == 4 and out == "still-runs\n"
    assert "no GPU monitoring on this node" in err and "NVML" in err and "running the command unwatched" in err
    assert left_running(home) == []



def test_the_exit_status_is_the_commands_and_nothing_is_left_when_the_folder_goes_mid_run(home: Path) -> None:
    """Partial failure: with its spool folder removed and its folder swapped for an empty one while the
    command ran, watch exited 1 (the agent's FileNotFoundError, an unexpected error at the end) and
    left its PostgreSQL running. The status is always the command's, and everything it started stops."""
    folder = home / "e"
    w = watch(home, "e", "bash", "-c", f"sleep 5; rm -rf {folder}/spool; mv {folder} {folder}.moved; mkdir {folder};"
                                       " sleep 3; echo done; exit 5")
    out, err = w.communicate(timeout=180)
    assert w.returncode == 5 and out == "done\n", err
    assert "Traceback" not in err, err
    assert left_running(home) == [], left_running(home)


@pytest.mark.skipif(os.geteuid() != 0, reason="root watching a folder another user made; CI runs as root")
def test_root_never_follows_a_users_links_in_the_watch_folder(home: Path, fake_nvml: Path) -> None:
    """Hole: root's `jobpulse watch --dir D` in a folder `nobody` made let the embedded PostgreSQL's set-up
    chown and append to what `nobody` linked there (a root-owned 0600 file; an empty root folder became
    the database's). Root now watches only in a folder of its own: it says why and runs the command
    unwatched; the linked file and folder are untouched. The default folder under /tmp likewise."""
    secret = Path(tempfile.mkdtemp(prefix="jobpulse-root-"))
    (secret / "file").write_text("root's 0600\n")
    (secret / "file").chmod(0o600)
    (secret / "empty").mkdir()
    shared = Path(tempfile.mkdtemp(prefix="jobpulse-planted-"))
    shared.chmod(0o777)
    plant = [sys.executable, "-c", "import os, sys; d = sys.argv[1]; os.symlink(sys.argv[2], d + '/postgres.log');"
             " os.symlink(sys.argv[3], d + '/postgres'); os.symlink(sys.argv[3], sys.argv[4])"]
    default = Path("/tmp") / "jobpulse-watch-4712"
    try:
        os.chown(shared, 65534, 65534)
        done = subprocess.run(["runuser", "-u", "nobody", "--", "/usr/bin/python3", *plant[1:], str(shared),
                               str(secret / "file"), str(secret / "empty"), str(default)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_SCENARIO": str(home / "node.scn")}
        for args, job, where in (([ "--dir", str(shared)], "4711", str(shared)), ([], "4712", str(default))):
            run = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "watch", *args, "--", "sh", "-c",
                                  "exit 7"], env={**env, "SLURM_JOB_ID": job}, cwd="/tmp", capture_output=True,
                                 text=True, timeout=120)
            assert run.returncode == 7, run.stderr
            assert "running the command unwatched" in run.stderr and where in run.stderr, run.stderr
        file = (secret / "file").stat()
        assert (file.st_uid, (secret / "file").read_text()) == (0, "root's 0600\n")
        assert (secret / "empty").stat().st_uid == 0 and not list((secret / "empty").iterdir())
        print(f"\nroot watch in nobody's folder: {run.stderr.strip().splitlines()[0]}")
    finally:
        default.unlink(missing_ok=True)
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(secret, ignore_errors=True)
