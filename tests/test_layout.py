"""The code's shape: no import cycles, every module says its one job, the wheel carries what it runs."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"agent": "jobpulse.agent", "collector": "jobpulse.collector", "schema": "jobpulse.schema"}


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            out[".".join([package, *parts]).removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that ``name`` imports (at any depth in the file: a lazy import is still an edge)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in known and m != name}


def test_the_import_graph_has_no_cycles() -> None:
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_every_module_opens_with_a_docstring_that_states_its_job() -> None:
    missing = []
    for name, path in modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if path.name == "__init__.py" and not path.read_text().strip():
            continue  # an empty package marker
        if not doc or len(doc.splitlines()[0].split()) < 4:
            missing.append(name)
    assert not missing, f"modules without a one-line statement of their job: {missing}"


def test_no_module_name_is_used_for_two_jobs() -> None:
    stems: dict[str, list[str]] = {}
    for name, path in modules().items():
        if path.name != "__init__.py":
            stems.setdefault(path.stem, []).append(name)
    shared = {stem: names for stem, names in stems.items() if len(names) > 1 and stem not in ("cli", "__main__")}
    assert not shared, shared


def test_the_wheel_carries_the_demo_the_rules_and_the_migrations(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("jobpulse-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("jobpulse/collector/demo/fake_nvml.c", "jobpulse/collector/rules/rules_default.toml",
                   "jobpulse/collector/rules/rules_demo.toml", "jobpulse/schema/migrations/0001_initial.sql",
                   "jobpulse/schema/fields.py", "jobpulse/collector/store/series.py"):
        assert needed in names, f"{needed} missing from {wheel.name}"
    assert not [n for n in names if n.startswith(("agent/", "collector/", "schema/", "tests/"))]
