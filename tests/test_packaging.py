"""The distribution's shape: namespaces, extras that keep compute nodes light, a wheel that carries
what it runs and works alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from .test_demo import check_demo

ROOT = Path(__file__).resolve().parent.parent


def test_folders_map_onto_one_namespace_and_agent_extra_is_light() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = project["tool"]["setuptools"]["package-dir"]
    assert dirs == {"jobpulse": ".", "jobpulse.agent": "agent", "jobpulse.collector": "collector",
                    "jobpulse.schema": "schema"}
    assert not list(ROOT.glob("*.py")) or [p.name for p in ROOT.glob("*.py")] == ["__main__.py"]
    extras = project["project"]["optional-dependencies"]
    assert {"agent", "collector", "dev"} <= set(extras)
    agent_deps = " ".join(extras["agent"] + project["project"]["dependencies"]).lower()
    assert "psycopg" not in agent_deps and "sqlalchemy" not in agent_deps
    assert set(project["project"]["scripts"]) == {"jobpulse", "jobpulse-agent"}


def test_wire_format_imports_without_the_database_stack() -> None:
    code = ("import sys, jobpulse.schema.wire, jobpulse.agent.cli; "
            "assert not {'psycopg', 'starlette', 'sqlalchemy'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for the module from a copy without build outputs (a stale build/
    folder would put old files into it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", "build", ".git", "*.egg-info", "__pycache__",
                                                             ".typecheck", ".hypothesis", ".mypy_cache"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp / "dist"), str(src)],
                           check=True, capture_output=True, text=True, timeout=300)
    (tmp / "build.log").write_text(build.stdout + build.stderr)
    (built,) = (tmp / "dist").glob("jobpulse-*.whl")
    return built


def test_building_the_wheel_prints_no_setuptools_warning(wheel: Path) -> None:
    """A newcomer's first `pip install` shows no wall of "Package would be ignored": every data folder
    is declared as package data, none is mistaken for a package."""
    log = (wheel.parent.parent / "build.log").read_text()
    warned = [line.strip() for line in log.splitlines() if "Warning:" in line or "would be ignored" in line]
    assert warned == []


def _wheel_venv(tmp_path: Path, wheel: Path, extra: str | None = None) -> Path:
    """The wheel in a fresh virtual environment: what follows must work from the wheel alone (no
    checkout on the path). Without ``extra``, without its dependencies (it must import nothing it
    does not need); with one, with what that extra pulls from the package index."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    target = ["--no-deps", "--no-index", str(wheel)] if extra is None else [f"jobpulse[{extra}] @ {wheel.as_uri()}"]
    # --no-compile: byte-code is written as modules are first imported (most never are), not all up front.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-compile", *target], check=True, capture_output=True, timeout=600)
    return venv


def test_the_wheel_carries_the_demo_the_rules_and_the_migrations(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("jobpulse/collector/demo/fake_nvml.c", "jobpulse/collector/demo/ranks/loader.py", "jobpulse/collector/rules/rules_default.toml",
                   "jobpulse/collector/rules/rules_demo.toml", "jobpulse/schema/migrations/0001_initial.sql",
                   "jobpulse/schema/fields.py", "jobpulse/collector/store/read/series.py"):
        assert needed in names, f"{needed} missing from {wheel.name}"
    assert not [n for n in names if n.startswith(("agent/", "collector/", "schema/", "tests/"))]


@pytest.mark.timeout(900)
def test_the_demo_extra_alone_runs_the_demo(tmp_path: Path, wheel: Path) -> None:
    """`pip install 'jobpulse[demo]'` and nothing else: the README's first look works, flags and all."""
    venv = _wheel_venv(tmp_path, wheel, "demo")
    folder = Path(tempfile.mkdtemp(prefix="jobpulse-demo-wheel-", dir="/var/tmp" if os.geteuid() == 0 else tmp_path))
    folder.chmod(0o711)
    try:
        env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "JOBPULSE_DEMO_DIR": str(folder),
               "COLUMNS": "160"}
        out = subprocess.run([str(venv / "bin" / "jobpulse"), "demo", "--duration", "45"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
        check_demo(out, folder)  # the README's first command, whole: one run of the demo serves both
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_wheel_deploys_hooks_units_and_dashboards_and_refuses_to_clobber_edits(tmp_path: Path, wheel: Path) -> None:
    venv = _wheel_venv(tmp_path, wheel)
    bin_dir = venv / "bin"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def run(*argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert (done.returncode == 0) == ok, (argv, done.stdout, done.stderr)
        return done

    # Only the standard library is installed: the help of both commands and `python -m` still work.
    assert "deploy" in run(str(bin_dir / "jobpulse"), "--help").stdout
    assert "run" in run(str(bin_dir / "python"), "-m", "jobpulse.agent", "--help").stdout
    assert "jobpulse" in run(str(bin_dir / "python"), "-m", "jobpulse", "--version").stdout

    slurm, units, grafana = tmp_path / "slurm", tmp_path / "systemd", tmp_path / "grafana"
    run(str(bin_dir / "jobpulse"), "deploy", "slurm", str(slurm))
    run(str(bin_dir / "jobpulse"), "deploy", "systemd", str(units), "--settings", str(slurm / "jobpulse.conf"))
    run(str(bin_dir / "jobpulse"), "deploy", "grafana", str(grafana))
    for hook in ("prolog.sh", "epilog.sh", "task_prolog.sh", "hook.sh", "mail.sh", "epilog_slurmctld.sh", "conf.sh"):
        assert (slurm / hook).stat().st_mode & 0o111, hook
    assert f"JOBPULSE_PYTHON={bin_dir / 'python'}" in (slurm / "jobpulse.conf").read_text()
    assert f"Prolog={slurm}/prolog.sh" in (slurm / "slurm.conf.snippet").read_text()
    agent_unit = (units / "jobpulse-agent.service").read_text()
    assert f"EnvironmentFile={slurm / 'jobpulse.conf'}" in agent_unit and f"{bin_dir}/python" in agent_unit
    assert (grafana / "dashboards" / "jobpulse" / "jobpulse-job.json").is_file()
    provider = (grafana / "provisioning" / "dashboards" / "jobpulse.yaml").read_text()
    assert f"path: {grafana}/dashboards/jobpulse" in provider

    # Edited files: the settings are kept; an edited hook stops the deploy before anything is written.
    (slurm / "jobpulse.conf").write_text("JOBPULSE_COLLECTOR=http://c:8470\n")
    (slurm / "hook.sh").write_text("#!/bin/sh\n# site change\n")
    (slurm / "prolog.sh").unlink()
    refused = run(str(bin_dir / "jobpulse"), "deploy", "slurm", str(slurm), ok=False)
    assert str(slurm / "hook.sh") in refused.stderr and "--force" in refused.stderr
    assert "Traceback" not in refused.stderr and not (slurm / "prolog.sh").exists()
    run(str(bin_dir / "jobpulse"), "deploy", "slurm", str(slurm), "--force")
    assert "site change" not in (slurm / "hook.sh").read_text() and (slurm / "prolog.sh").exists()
    assert (slurm / "jobpulse.conf").read_text() == "JOBPULSE_COLLECTOR=http://c:8470\n"


def test_extras_mean_what_the_readme_says() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "jobpulse[agent,collector]" in extras["demo"]
    assert not any("psycopg" in d for d in extras["grafana"])


@pytest.mark.timeout(900)
def test_the_development_install_collects_the_unit_tier(tmp_path: Path, wheel: Path) -> None:
    """`pip install -e '.[agent,collector,dev]'` (docs/install.md) brings every module the tests
    import: the unit tier collects without an error (the Grafana SDK once came only with `make setup`)."""
    venv = _wheel_venv(tmp_path, wheel, "agent,collector,dev")
    collect = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "--collect-only", "-q", "-m", "unit",
                              "-p", "no:cacheprovider", "-n", "0", str(ROOT / "tests")], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-2000:]
    assert " collected" in collect.stdout or "tests collected" in collect.stdout, collect.stdout[-500:]
