"""`jobpulse import`: a recording becomes a job stored like live samples (so backtest and report judge
it), a second import stores nothing new, and a bad file is one clear line that changes nothing --
however large it is."""

from __future__ import annotations

import os
import pwd
import random
import re
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest


def jobpulse(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def recording(path: Path, minutes: int, bad_line: str | None = None) -> Path:
    """Two A100s a second apart for ``minutes``: GPU 0 trains, GPU 1 is never used (a keep-alive
    now and then, no power column for it)."""
    r = random.Random(7)
    t0 = datetime(2021, 6, 1, 9, 0, 0)
    with path.open("w") as f:
        f.write("timestamp, index, name, utilization.gpu [%], memory.used [MiB], memory.total [MiB], power.draw [W]\n")
        for s in range(minutes * 60):
            ts = (t0 + timedelta(seconds=s)).strftime("%Y/%m/%d %H:%M:%S")
            f.write(f"{ts}.101, 0, NVIDIA A100-SXM4-40GB, {r.randint(85, 99)} %, 30000 MiB, 40960 MiB, "
                    f"{r.uniform(300, 380):.2f} W\n")
            f.write(f"{ts}.102, 1, NVIDIA A100-SXM4-40GB, {r.choice((0, 0, 0, 3))} %, 420 MiB, 40960 MiB, [N/A]\n")
        if bad_line:
            f.write(bad_line)
    return path


def stored(dsn: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT (SELECT count(*) FROM jobpulse.gpu_samples), (SELECT count(*) FROM jobpulse.jobs),"
                            " (SELECT count(*) FROM jobpulse.ingest_batches)").fetchone()  # type: ignore[return-value]


def test_a_recording_becomes_a_job_the_rules_judge_and_a_second_import_stores_nothing(dsn: str,
                                                                                     tmp_path: Path) -> None:
    rec = recording(tmp_path / "a100x2-train.csv", minutes=25)
    old = jobpulse("import", "--dsn", dsn, str(rec))
    assert old.returncode == 2 and "retention" in old.stderr and "--recent" in old.stderr, old.stderr
    assert stored(dsn) == (0, 0, 0), "refused before anything was written"

    with psycopg.connect(dsn) as conn:  # a leader that has built the cluster pyramid up to now
        conn.execute("INSERT INTO jobpulse.pyramid_progress (built_to) VALUES (now())")
    out = jobpulse("import", "--dsn", dsn, str(rec), "--recent", "--job", "4242")
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    pyramid = jobpulse("db", "pyramid", "--dsn", dsn)  # the import's hours, older than the relook: marked
    assert pyramid.returncode == 0 and re.search(r"\([12] marked by late samples\)", pyramid.stdout), pyramid.stdout
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT sum(n) FROM jobpulse.node_job_rollup WHERE width_s = 300 AND job_id = '4242'"
                            ).fetchone() == (3000,)
    assert "as job 4242 on imported/a100x2-train: 2 GPUs, 3000 readings" in out.stdout
    assert "1 s apart" in out.stdout
    assert "not measured: clocks, throttle reasons, tensor activity" in out.stdout
    judged = [line.split() for line in out.stdout.splitlines() if line.strip().startswith("4242")]
    assert [(f[1], f[2]) for f in judged] == [("over_allocation", "(job)")], out.stdout
    with psycopg.connect(dsn) as conn:
        samples, gpus, nulls = conn.execute(
            "SELECT count(*), count(DISTINCT gpu_uuid), count(*) FILTER (WHERE power_w IS NULL)"
            " FROM jobpulse.gpu_samples WHERE cluster = 'imported' AND job_id = '4242'").fetchone()  # type: ignore[misc]
        tags, state, end = conn.execute("SELECT tags, state, end_time FROM jobpulse.jobs WHERE job_id = '4242'"
                                        ).fetchone()  # type: ignore[misc]
    assert (samples, gpus, nulls) == (3000, 2, 1500), "[N/A] power stored as not measured, not as zero"
    assert tags["imported_from"] == "a100x2-train.csv" and tags["format"] == "query-gpu" and state == "COMPLETED"

    before = stored(dsn)
    again = jobpulse("import", "--dsn", dsn, str(rec), "--recent", "--job", "4242")
    assert again.returncode == 0 and "already imported: nothing new stored" in again.stdout, again.stdout
    assert stored(dsn) == before
    elsewhere = jobpulse("import", "--dsn", dsn, str(rec), "--recent", "--node", "othernode")
    assert elsewhere.returncode == 2 and "imported before" in elsewhere.stderr, elsewhere.stderr
    assert stored(dsn) == before

    report = jobpulse("report", "4242", "--cluster", "imported", "--dsn", dsn)
    assert report.returncode == 0, report.stderr
    assert "over_allocation" in report.stdout and "(closed)" in report.stdout, report.stdout
    assert "Not judged" in report.stdout and "hw_throttling: no clock event" in report.stdout, report.stdout


def test_a_bad_file_is_one_line_and_changes_nothing(dsn: str, tmp_path: Path) -> None:
    mangled = recording(tmp_path / "mangled.csv", 1)
    text = mangled.read_text().splitlines()
    mangled.write_text("\n".join(text[:3] + [line.replace(" %", " per cent") for line in text[3:]]) + "\n")
    cases = {
        "mangled.csv": (mangled, "118 bad lines (118 malformed lines) against 2 good readings, read as nvidia-smi "
                                 "--query-gpu CSV: too damaged to trust; first: line 4: utilization.gpu [%]: '"),
        "garbage.bin": (tmp_path / "garbage.bin", "not UTF-8 text"),
        "notes.txt": (tmp_path / "notes.txt", "not a recording jobpulse knows"),
        "years.csv": (tmp_path / "years.csv", "line 2: time '0001/01/01 00:00:00' is year 1: not a time a GPU was"),
    }
    (tmp_path / "garbage.bin").write_bytes(bytes(range(128, 256)) * 100)
    (tmp_path / "notes.txt").write_text("we trained for two days on 8 GPUs\n")
    (tmp_path / "years.csv").write_text("timestamp, index, utilization.gpu [%]\n0001/01/01 00:00:00, 0, 5 %\n"
                                        "9999/12/31 23:59:59, 0, 5 %\n")
    for name, (path, error) in cases.items():
        out = jobpulse("import", "--dsn", dsn, str(path), "--recent")
        assert out.returncode == 2, (name, out.stdout, out.stderr)
        assert error in out.stderr and len(out.stderr.strip().splitlines()) == 1, (name, out.stderr)
        assert "Traceback" not in out.stderr
    for args, error in ((["--gpus", "0,7"], "--gpus names GPU 7"), (["--tz", "Mars/Olympus"], "not a time zone"),
                        (["--job", "abc"], "not a Slurm job id"), (["--interval", "0"], "--interval must be")):
        out = jobpulse("import", "--dsn", dsn, str(recording(tmp_path / "ok.csv", 1)), "--recent", *args)
        assert out.returncode == 2 and error in out.stderr, (args, out.stderr)
    assert stored(dsn) == (0, 0, 0)


def test_a_large_file_is_streamed_in_bounded_memory(dsn: str, tmp_path: Path) -> None:
    """A 30 MB log that is one 6-hour recording appended to itself again and again: read to the end,
    the repeats counted as time going backwards, refused as damage that dominates, in little memory
    (streamed: about 50 MiB; the file held in memory whole, as text or as lines: over 100 MiB)."""
    rec = recording(tmp_path / "big.csv", minutes=6 * 60)
    size = rec.stat().st_size
    with rec.open("a") as f:
        body = rec.read_text().splitlines(keepends=True)[1:]
        while f.tell() < 30_000_000:
            f.writelines(body[:20_000])
    assert rec.stat().st_size > 30_000_000 > size
    # VmHWM, the peak of this process's own memory (getrusage's maxrss keeps the peak of the pytest
    # worker it was forked from across exec).
    code = ("import sys; from jobpulse.collector.cli import main; rc = main(sys.argv[1:]);"
            " print(next(x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM')))")
    out = subprocess.run([sys.executable, "-c", code, "import", "--dsn", dsn, str(rec), "--recent"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert re.search(r"\d+ bad lines \(.*\d+ lines whose time goes backwards.*\) against 43200 good readings",
                     out.stderr), out.stderr
    rss_mib = int(out.stdout.split()[-1]) / 1024
    print(f"\n{rec.stat().st_size / 1e6:.0f} MB recording read to its end and refused; peak RSS {rss_mib:.0f} MiB")
    assert rss_mib < 90
    assert stored(dsn) == (0, 0, 0)


def test_the_same_behaviour_gets_the_same_verdicts_at_any_sample_rate(dsn: str, tmp_path: Path) -> None:
    """Real logs come every 0.5 s, 2 s, 10 s or irregularly with gaps: the rules count time, not
    samples, so one behaviour (GPU 0 trains; GPU 1 trains 5 minutes, then idles) gets the same
    flags at the same times, within a cycle or two."""
    from jobpulse.collector.recordings.importer import Options, import_recording
    from jobpulse.collector.rules import backtest
    from jobpulse.collector.rules.thresholds import Thresholds

    def times(kind: str) -> list[float]:
        r, t, out = random.Random(kind), 0.0, []
        while t < 25 * 60:
            out.append(t)
            step = {"0.5s": 0.5, "2s": 2.0, "10s": 10.0}.get(kind) or r.uniform(0.7, 3.0)
            t += step + (120 if kind == "irregular" and 600 <= t < 600 + step else 0)  # a 2-minute gap
        return out

    raised: dict[str, list[tuple[str, str, float]]] = {}
    thresholds = Thresholds()
    for n, kind in enumerate(("0.5s", "2s", "10s", "irregular")):
        r, t0 = random.Random(n), datetime(2026, 1, 1, 8)
        path = tmp_path / f"rate-{kind}.csv"
        with path.open("w") as f:
            f.write("timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n")
            for s in times(kind):
                ts = (t0 + timedelta(seconds=s)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
                f.write(f"{ts}, 0, {r.randint(80, 95)} %, 30000 MiB, 40960 MiB\n")
                f.write(f"{ts}, 1, {r.randint(80, 95) if s < 300 else r.choice((0, 0, 1))} %, 30000 MiB, 40960 MiB\n")
        done = import_recording(dsn, path, Options(job_id=str(7700 + n), recent=True))
        with psycopg.connect(dsn) as conn:
            flags = backtest.replay(conn, thresholds, done.start, done.end, timedelta(seconds=30), done.cluster,
                                    done.job_id)
        raised[kind] = [(f.rule_id, f.scope_key.rsplit("-", 1)[-1], (f.raised_at - done.start).total_seconds() / 60,
                         (datetime.fromisoformat(f.evidence["idle_since"]) - done.start).total_seconds() / 60)
                        for f in flags]
    print("\n" + "\n".join(f"{k:>9}: {v}" for k, v in raised.items()))
    for kind, flags in raised.items():
        # One flag on GPU 1 (straggling at first, idle in the end: one cause, its kind changed in place),
        # idle from 5 minutes, raised by 15 (as a straggler from about 8 where the minutes align so).
        assert [(rule, gpu) for rule, gpu, _, _ in flags] == [("idle_gpu", "1")], (kind, flags)
        assert flags[0][2] <= 15.5 and 3.75 <= flags[0][3] <= 5.5, (kind, flags)  # since: its minute block


def test_a_truncated_last_line_is_skipped_and_said(dsn: str, tmp_path: Path) -> None:
    """The logger killed at the job's end cut its last line: the rest is the job."""
    rec = recording(tmp_path / "killed.csv", 12, "2021/06/01 09:12:00.101, 0, NVIDIA A1")
    out = jobpulse("import", "--dsn", dsn, str(rec), "--recent", "--job", "5151")
    assert out.returncode == 0, out.stderr
    assert "1440 readings" in out.stdout and "skipped 1 truncated line at the end" in out.stdout, out.stdout
    assert stored(dsn)[0] == 1440


def test_several_files_are_one_job_a_node_each_and_dry_run_stores_nothing(dsn: str, tmp_path: Path) -> None:
    a = tmp_path / "node-a.csv"  # nvidia-smi --query-gpu: two GPUs at work
    with a.open("w") as f:
        f.write("timestamp, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n")
        for s in range(12 * 60):
            ts = (datetime(2021, 6, 1, 9) + timedelta(seconds=s)).strftime("%Y/%m/%d %H:%M:%S")
            f.write(f"{ts}.101, 0, 91 %, 30000 MiB, 40960 MiB\n{ts}.102, 1, 89 %, 30000 MiB, 40960 MiB\n")
    b = tmp_path / "node-b.csv"  # the other node's logger: epoch seconds, its own names, GPUs in a row each
    with b.open("w") as f:
        f.write("time,gpu0_util,gpu0_mem_used_mb,gpu1_util\n")
        for s in range(12 * 60):
            f.write(f"{datetime(2021, 6, 1, 9).timestamp() + s:.3f},{90 if s < 60 else 0},30000,88\n")
    dry = jobpulse("import", str(a), str(b), "--recent", "--job", "6262", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "node-b.csv: a table (CSV/TSV) (csv), node node-b" in dry.stdout, dry.stdout
    assert "columns: time -> @time, gpu0_util -> sm_util, gpu0_mem_used_mb -> fb_used_mib, gpu1_util -> sm_util" \
        in dry.stdout
    assert "times: Unix time in s" in dry.stdout and "GPUs: 2 [0, 1]" in dry.stdout
    assert "not judged: memory_underused (no GPU memory total)" in dry.stdout
    assert "would be job 6262 on cluster imported (moved to end now): nothing stored (--dry-run)" in dry.stdout
    assert stored(dsn) == (0, 0, 0)

    out = jobpulse("import", "--dsn", dsn, str(a), str(b), "--recent", "--job", "6262")
    assert out.returncode == 0, out.stderr
    with psycopg.connect(dsn) as conn:
        nodes = conn.execute("SELECT nodes, gpus_total FROM jobpulse.jobs WHERE job_id = '6262'").fetchone()
        per_node = conn.execute("SELECT node, count(DISTINCT gpu_uuid) FROM jobpulse.gpu_samples WHERE job_id = '6262'"
                                " GROUP BY node ORDER BY node").fetchall()
    assert nodes == (["node-a", "node-b"], 4) and per_node == [("node-a", 2), ("node-b", 2)], (nodes, per_node)
    judged = [line.split() for line in out.stdout.splitlines() if line.strip().startswith("6262")]
    # node-b's GPU 0 stops after a minute while the other three work on: judged in the one job
    assert [(f[2].split("/")[0], f[2][-2:]) for f in judged] == [("node-b", "-0")], out.stdout
    assert judged[0][1] in ("idle_gpu", "imbalance"), out.stdout


def test_endless_or_unseekable_input_ends_with_one_line_in_bounded_time(dsn: str, tmp_path: Path) -> None:
    """/dev/zero, a FIFO, an endless pipe, a FIFO whose writer never finishes, a time no GPU had with
    --recent: each a one-line error in seconds (a FIFO that ends is read like a file)."""
    import os
    import threading
    import time

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    source = recording(tmp_path / "src.csv", 12).read_bytes()
    writer = threading.Thread(target=lambda: fifo.write_bytes(source))
    writer.start()
    out = jobpulse("import", "--dsn", dsn, str(fifo), "--recent", "--job", "7373", timeout=120)
    writer.join()
    assert out.returncode == 0 and "imported fifo" in out.stdout and "1440 readings" in out.stdout, out.stderr

    started = time.monotonic()
    zero = jobpulse("import", "--dsn", dsn, "/dev/zero", "--recent", timeout=60)
    assert zero.returncode == 2 and "binary data" in zero.stderr and len(zero.stderr.splitlines()) == 1, zero.stderr
    endless = subprocess.run(f"yes 2021/06/01 09:00:00, 0, 5 % | {sys.executable} -m jobpulse.collector.cli import "
                             f"--dsn '{dsn}' - --recent --max-mib 8", shell=True, capture_output=True, text=True,
                             timeout=120, check=False)
    assert endless.returncode == 2 and "did not end within 8 MiB (--max-mib)" in endless.stderr, endless.stderr
    hold = os.open(fifo, os.O_RDWR)  # a writer that never writes nor closes
    try:
        waited = jobpulse("import", "--dsn", dsn, str(fifo), "--recent", "--wait", "2", timeout=60)
    finally:
        os.close(hold)
    assert waited.returncode == 2 and "did not end within 2 s (--wait)" in waited.stderr, waited.stderr
    assert time.monotonic() - started < 60
    for year in ("0001", "9999"):
        rec = tmp_path / f"year{year}.csv"
        rec.write_text("timestamp, index, utilization.gpu [%]\n" + "".join(
            f"{year}/06/01 09:00:{s:02d}, 0, 5 %\n" for s in range(10)))
        out = jobpulse("import", "--dsn", dsn, str(rec), "--recent")
        assert out.returncode == 2 and f"is year {int(year)}: not a time a GPU was recorded" in out.stderr, out.stderr
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr
    assert stored(dsn)[1] == 1, "only the FIFO that ended was stored"


def test_a_hostile_table_line_is_read_in_linear_time(dsn: str, tmp_path: Path) -> None:
    """One line "| 0" + 3,000 spaces + "x|" once held the import for minutes (the table's pattern
    backtracked); as a plain file, as nvitop's borders and as UTF-16, it ends in seconds, one line."""
    line = "| 0" + " " * 3000 + "x|"
    plain = "| NVIDIA-SMI 535.54.03    Driver Version: 535.54.03    CUDA Version: 12.2 |\n" + (line + "\n") * 20
    files = {"plain.log": plain.encode(), "nvitop.log": plain.replace("|", "│").encode(),
             "utf16.log": plain.encode("utf-16")}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        began = time.monotonic()
        out = jobpulse("import", "--dsn", dsn, str(tmp_path / name), "--recent", timeout=60)
        took = time.monotonic() - began
        assert took < 5, (name, took)
        assert out.returncode == 2 and "holds no readings" in out.stderr, (name, out.stderr[-300:])
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert stored(dsn) == (0, 0, 0)


def _holds(dsn: str, marker: str) -> list[str]:
    """The tables of the jobpulse schema whose rows hold ``marker`` anywhere."""
    with psycopg.connect(dsn) as conn:
        tables = [r[0] for r in conn.execute("SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                                             " WHERE n.nspname = 'jobpulse' AND c.relkind IN ('r', 'p')"
                                             " AND NOT c.relispartition")]
        return [t for t in tables if conn.execute(
            f'SELECT bool_or(t::text LIKE %s) FROM jobpulse."{t}" t', (f"%{marker}%",)).fetchone()[0]]  # type: ignore[index]


@pytest.mark.skipif(os.geteuid() != 0, reason="root reading a user's link needs root (and the user nobody)")
def test_root_never_follows_a_planted_link_nor_quotes_a_file_the_asker_cannot_read(dsn: str, tmp_path: Path) -> None:
    marker = f"JOBPULSE-SECRET-{uuid.uuid4().hex}"
    secret = tmp_path / "secret"
    secret.write_text(f"{marker}:*:20228:0:99999:7:::\n")
    secret.chmod(0o600)
    nobody = pwd.getpwnam("nobody")
    link = tmp_path / "my-log.csv"
    link.symlink_to(secret)
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)
    out = jobpulse("import", "--dsn", dsn, str(link), "--recent")
    assert out.returncode == 2 and "follows no link a user could have planted" in out.stderr, out.stderr
    sudo = dict(os.environ, SUDO_UID=str(nobody.pw_uid), SUDO_GID=str(nobody.pw_gid))
    runs = [out, subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "import", "--dsn", dsn, str(secret),
                                 "--recent"], capture_output=True, text=True, timeout=300, check=False, env=sudo)]
    assert runs[1].returncode == 2 and "not a recording jobpulse knows (its beginning is not quoted" in runs[1].stderr
    runs.append(jobpulse("import", "--dsn", dsn, str(secret), "--recent"))  # root itself: what others may read
    assert "its beginning is not quoted" in runs[2].stderr
    secret.chmod(0o644)
    assert marker in jobpulse("import", "--dsn", dsn, str(secret), "--recent").stderr  # anyone's to read: quoted
    for run in runs:
        assert marker not in run.stdout + run.stderr
    assert _holds(dsn, marker) == []


_SWAPPER = """
import os, sys, time
link, benign, secret = sys.argv[1:4]
tmp = link + ".new"
end = time.monotonic() + float(sys.argv[4])
while time.monotonic() < end:  # the link flips between the user's own file and the secret
    for target in (benign, secret):
        os.symlink(target, tmp)
        os.replace(tmp, link)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="root reading a user's link needs root (and the user nobody)")
def test_a_link_swapped_while_root_imports_never_reads_the_secret(dsn: str, tmp_path: Path) -> None:
    """Issue 64: the link is checked on the file as opened, and only that open file is read: a user
    flipping the link between their own file and a 0600 secret while root imports it never gets the
    secret read, quoted or stored (checked on the path, then opened again by path, it could)."""
    marker = f"JOBPULSE-SECRET-{uuid.uuid4().hex}"
    secret = tmp_path / "secret"
    secret.write_text(f"{marker}:*:20228:0:99999:7:::\n")
    secret.chmod(0o600)
    nobody = pwd.getpwnam("nobody")
    home = tmp_path / "user"
    home.mkdir()
    home.chmod(0o777)
    benign = home / "mine.txt"
    benign.write_text("my notes, not a recording\n")
    os.chown(benign, nobody.pw_uid, nobody.pw_gid)
    link = home / "my-log.csv"
    link.symlink_to(benign)
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)

    def as_nobody() -> None:
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    swapper = subprocess.Popen(["/usr/bin/python3", "-c", _SWAPPER, str(link), str(benign), str(secret), "60"],
                               preexec_fn=as_nobody)
    try:
        runs = [jobpulse("import", "--dsn", dsn, str(link), "--recent") for _ in range(8)]
    finally:
        swapper.kill()
        swapper.wait()
    assert {r.returncode for r in runs} == {2}, [r.stderr for r in runs]
    assert any("follows no link" in r.stderr for r in runs) or all("my notes" in r.stderr for r in runs)
    for run in runs:
        assert marker not in run.stdout + run.stderr
    assert _holds(dsn, marker) == []


def test_a_cluster_log_with_a_node_column_is_its_nodes_with_their_units_and_dcgm_fields(dsn: str,
                                                                                      tmp_path: Path) -> None:
    """A site monitor's per-job table: 10 GPUs over three nodes in one file, day-first times, memory
    in GiB, power, clocks and DCGM's SM and tensor activity. It imports as three nodes of 4, 4 and 2
    GPUs (indices per node), values in the field table's units, the tensor-core rule judging it; the
    dry run says each node once; a second import stores nothing new; --node cannot name three."""
    rec = tmp_path / "job-81234-gpu.csv"
    t0 = datetime(2026, 11, 3, 15, 13, 16)
    with rec.open("w") as f:
        f.write("date,hostname,gpu,GPU Util (%),Memory Used (GiB),Memory Total (GiB),Power (W),SM Clock (MHz),"
                "sm_active,tensor_active\n")
        for s in range(0, 20 * 60, 10):
            ts = (t0 + timedelta(seconds=s)).strftime("%d-%m-%Y %H:%M:%S")
            for node, count in (("jwb0001.juwels", 4), ("jwb0002.juwels", 4), ("jwb0003.juwels", 2)):
                for g in range(count):
                    f.write(f"{ts},{node},{g},{95 - g},30.5,40,{350 - g}.5,1410,0.9,0.0\n")
    dry = jobpulse("import", str(rec), "--recent", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("job-81234-gpu.csv: a table") == 1, dry.stdout
    assert "nodes from its hostname column" in dry.stdout and "times: %d-%m-%Y %H:%M:%S (day first" in dry.stdout
    assert "node jwb0001: GPUs: 4 [0, 1, 2, 3]" in dry.stdout and "node jwb0003: GPUs: 2 [0, 1]" in dry.stdout
    assert "no_tensor_cores" not in dry.stdout, "the file has tensor activity: the rule judges it"
    one = jobpulse("import", str(rec), "--recent", "--dry-run", "--node", "n1")
    assert one.returncode == 2 and "--node names one node: job-81234-gpu.csv names 3 in its hostname column" \
        in one.stderr, one.stderr

    out = jobpulse("import", "--dsn", dsn, str(rec), "--recent", "--job", "8123")
    assert out.returncode == 0, out.stderr
    assert "as job 8123 on imported/jwb0002: 4 GPUs, 480 readings" in out.stdout, out.stdout
    with psycopg.connect(dsn) as conn:
        nodes, total = conn.execute("SELECT nodes, gpus_total FROM jobpulse.jobs WHERE job_id = '8123'").fetchone()  # type: ignore[misc]
        held = conn.execute("SELECT node, array_agg(gpu_index ORDER BY gpu_index) FROM jobpulse.job_gpus"
                            " WHERE job_id = '8123' GROUP BY node ORDER BY node").fetchall()
        values = conn.execute(
            "SELECT node, count(*), count(DISTINCT gpu_uuid), max(fb_used_mib), max(fb_total_mib), max(power_w),"
            " max(sm_clock_mhz), max(gpm_sm_active), max(gpm_tensor_active) FROM jobpulse.gpu_samples"
            " WHERE job_id = '8123' GROUP BY node ORDER BY node").fetchall()
    assert (sorted(nodes), total) == (["jwb0001", "jwb0002", "jwb0003"], 10)
    assert held == [("jwb0001", [0, 1, 2, 3]), ("jwb0002", [0, 1, 2, 3]), ("jwb0003", [0, 1])]
    assert [v[:3] for v in values] == [("jwb0001", 480, 4), ("jwb0002", 480, 4), ("jwb0003", 240, 2)]
    assert {(*v[3:7], round(v[7], 3), v[8]) for v in values} == {(31232, 40960, 350.5, 1410, 90.0, 0.0)}, values
    judged = [line.split() for line in out.stdout.splitlines() if line.strip().startswith("8123")]
    assert {f[1] for f in judged} == {"no_tensor_cores"}, out.stdout
    again = jobpulse("import", "--dsn", dsn, str(rec), "--recent", "--job", "8123")
    assert again.returncode == 0 and "already imported: nothing new stored" in again.stdout, again.stdout
