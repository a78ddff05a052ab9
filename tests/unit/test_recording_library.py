"""The library of real recordings (tests/data/recordings) without a server: every file labelled with its
source, licence, context and known rules and GPUs, and every one read by `jobpulse import --dry-run`
with at most the hint its label names."""

from __future__ import annotations

from ..test_recordings import LIBRARY, _columns, labels


def test_the_labels_are_well_formed() -> None:
    """Every recording has its source, licence, context and labels naming known rules and GPUs."""
    from jobpulse.collector.rules.registry import RULES

    entries = labels()
    assert {e["file"] for e in entries} == {p.name for p in LIBRARY.iterdir() if p.name != "labels.toml"}
    for e in entries:
        assert e["source"].startswith(("https://github.com/", "jobpulse: ")) and e["licence"] and e["context"], e["file"]
        for x in e["expect"]:
            assert x["rule"] in RULES and 0 <= x["at_min"] <= e["duration_min"], (e["file"], x)
            assert "gpu" not in x or x["gpu"] in e.get("job_gpus", range(e["gpus"])), (e["file"], x)


# The real CLI's entry point called once a file in one interpreter: a process a file, most of this
# test's time was 48 interpreters starting and importing the collector.
DRY_RUNS = """
import contextlib, io, json, sys
from jobpulse.collector.cli import main
done = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    done.append((code, out.getvalue(), err.getvalue()))
json.dump(done, sys.stdout)
"""


def test_every_real_recording_reads_with_at_most_a_hint_and_dry_run_shows_its_mapping() -> None:
    """Every file of the library through the real CLI's --dry-run, with no flag but the one its
    label says it needs (--columns for a file without a header, --start where it is given);
    the share that needs none is printed."""
    import json
    import subprocess
    import sys

    bare = 0
    entries = labels()
    runs = []
    for e in entries:
        hints = []
        if (columns := _columns(e)) is not None:
            hints += ["--columns", ",".join(columns)]
        if "start" in e:  # where it began (it also places the recording there)
            hints += ["--start", e["start"]]
        place = [] if "start" in e else ["--recent"]
        runs.append(["import", str(LIBRARY / e["file"]), *place, "--dry-run", *hints])
        bare += not hints
    done = subprocess.run([sys.executable, "-c", DRY_RUNS], input=json.dumps(runs), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert len(results) == len(entries)
    for e, (code, stdout, stderr) in zip(entries, results, strict=True):
        assert code == 0, (e["file"], stderr)
        assert "  columns: " in stdout and "-> sm_util" in stdout + " -> sm_util" * ("dcgm" in e["format"]), \
            (e["file"], stdout)
        assert "nothing stored (--dry-run)" in stdout
    print(f"\n{bare} of {len(entries)} real recordings ({bare / len(entries):.0%}) import with no hint; the rest "
          "with --columns (no header) or --start")
