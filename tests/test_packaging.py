"""The distribution's shape: namespaces, extras that keep compute nodes light."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_folders_map_onto_one_namespace_and_agent_extra_is_light() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = project["tool"]["setuptools"]["package-dir"]
    assert dirs == {"jobpulse.agent": "agent", "jobpulse.collector": "collector", "jobpulse.schema": "schema"}
    extras = project["project"]["optional-dependencies"]
    assert {"agent", "collector", "dev"} <= set(extras)
    agent_deps = " ".join(extras["agent"] + project["project"]["dependencies"]).lower()
    assert "psycopg" not in agent_deps and "sqlalchemy" not in agent_deps
    assert set(project["project"]["scripts"]) == {"jobpulse", "jobpulse-agent"}


def test_wire_format_imports_without_the_database_stack() -> None:
    code = ("import sys, jobpulse.schema.wire, jobpulse.agent.cli; "
            "assert not {'psycopg', 'starlette', 'sqlalchemy'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
