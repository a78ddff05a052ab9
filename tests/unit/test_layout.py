"""The code's shape: no import cycles, every module says its one job (the wheel's: test_packaging)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"agent": "jobpulse.agent", "collector": "jobpulse.collector", "schema": "jobpulse.schema"}
JOB_SCRIPTS = ROOT / "collector" / "demo" / "ranks"  # the demo jobs' own code: it imports the in-job client, as jobs do


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(JOB_SCRIPTS):
                continue
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


# The layers, lowest first: a module may import its own layer's modules and those of lower layers,
# never a higher one's. The HTTP side, the reports and the dashboards sit side by side (rank 5):
# none imports another; the agent and the collector never import each other.
LAYERS = (
    ("jobpulse.schema", 0), ("jobpulse.agent", 1), ("jobpulse.collector.errors", 2), ("jobpulse.collector.settings", 2),
    ("jobpulse.collector.store", 3), ("jobpulse.collector.rules", 4),
    ("jobpulse.collector.ingest", 5), ("jobpulse.collector.report", 5), ("jobpulse.collector.grafana", 5),
    ("jobpulse.collector.notify", 5),
    ("jobpulse.collector.service", 6), ("jobpulse.collector.recordings", 6),
    ("jobpulse.collector.demo", 7), ("jobpulse.collector.embedded", 7), ("jobpulse.collector.watch", 7),
    ("jobpulse.collector.deploy", 7), ("jobpulse.collector.cli", 8),
    ("jobpulse.collector", 2),  # the package itself
)


def layer_of(module: str) -> tuple[str, int]:
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS")


def test_imports_only_point_down_the_layers() -> None:
    mods = modules()
    upward = []
    for name, path in mods.items():
        (home, rank) = layer_of(name)
        for target in imports(name, path, set(mods)):
            (there, target_rank) = layer_of(target)
            sideways = rank == target_rank == 5 and home != there
            apart = {home.split(".")[1], there.split(".")[1]} == {"agent", "collector"}
            if target_rank > rank or sideways or apart:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports that point up or across the layers:\n" + "\n".join(sorted(upward))


# The agent's ranks, lowest first, by package or module prefix (a new module of a package falls into
# its rank). Modules of one rank sit side by side: none imports another of that rank but its own
# package's. NVML and /proc at the bottom, then what is sampled, shipped and captured, then what
# answers jobs and Slurm, then the loop, then the command line.
AGENT_RANKS = (
    ("jobpulse.agent.nvml", 0), ("jobpulse.agent.procfs", 0), ("jobpulse.agent.client", 0),
    ("jobpulse.agent.slurm.dialect", 0),  # what Slurm's words mean, per version: attribution reads cgroups by it
    ("jobpulse.agent.attribution", 1), ("jobpulse.agent.schedule", 1), ("jobpulse.agent.idle_exit", 1),
    ("jobpulse.agent.sources", 2), ("jobpulse.agent.shipping", 2), ("jobpulse.agent.capture", 2),
    ("jobpulse.agent.control", 3), ("jobpulse.agent.exporter", 3), ("jobpulse.agent.node_checks", 3),
    ("jobpulse.agent.slurm", 4),
    ("jobpulse.agent.run", 5),
    ("jobpulse.agent.cli", 6), ("jobpulse.agent.__main__", 7),
)


def agent_rank_of(module: str) -> tuple[str, int]:
    if module == "jobpulse.agent":
        return module, 0  # the package itself
    for prefix, rank in AGENT_RANKS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    raise AssertionError(f"{module} has no rank in the agent: add it to AGENT_RANKS")


def test_the_agent_imports_point_down_its_ranks() -> None:
    """Lazy imports count: `agent/slurm/hooks.py` once imported `agent.cli`, which imports `agent.slurm.sync`."""
    mods = modules()
    upward = []
    for name, path in mods.items():
        if not name.startswith("jobpulse.agent"):
            continue
        (home, rank) = agent_rank_of(name)
        for target in imports(name, path, set(mods)):
            if target.startswith("jobpulse.agent"):
                (there, target_rank) = agent_rank_of(target)
                if target_rank > rank or (target_rank == rank and home != there):
                    upward.append(f"{name} -> {target}")
    assert not upward, "agent imports that point up or across its ranks:\n" + "\n".join(sorted(upward))


def test_only_the_nvml_module_imports_the_bindings() -> None:
    """One NVML door: every other module reaches NVML's calls, constants and errors through `agent/nvml.py`."""
    door = ROOT / "agent" / "nvml.py"
    found = []
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if path != door and any(n == "pynvml" or n.startswith("pynvml.") for n in names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


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


def test_functions_and_views_live_in_the_sql_layer() -> None:
    """From 0032 on, migrations hold tables, columns and indexes only; each file of the function layer
    makes the one object its name says, re-appliably."""
    creates = re.compile(r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|VIEW)\s+jobpulse\.(\w+)", re.I | re.M)
    late = [p.name for p in (ROOT / "schema" / "migrations").glob("*.sql")
            if int(p.name[:4]) > 31 and creates.search(p.read_text())]
    assert not late, f"migrations that define functions or views (put them in collector/store/migrate/sql/): {late}"
    for path in sorted((ROOT / "collector" / "store" / "migrate" / "sql").glob("*.sql")):
        made = creates.findall(path.read_text())
        assert [name for _, name in made] == [path.stem[3:]], path.name
        assert "CREATE OR REPLACE" in path.read_text(), path.name


def test_the_readme_stays_a_newcomers_guide() -> None:
    """What it is, two commands, install, a tour, links: details live in docs/, history in git."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move details into docs/"


_SQL = re.compile(r"\b(SELECT\s.+\sFROM|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|SET\s+\w+\s*(=|TO)|RESET\s+\w+)\b",
                  re.S)


def test_the_rules_hold_no_sql() -> None:
    """The rules read typed rows through the store's read functions (`store/read/rule_reads.py`): no
    statement is run and no SQL is written in collector/rules/, so a query and the code that reads
    its rows cannot drift apart across layers."""
    found = []
    for path in sorted((ROOT / "collector" / "rules").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("execute", "executemany", "cursor", "copy"):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value):
                found.append(f"{path.name}:{node.lineno}: {node.value.strip()[:60]!r}")
    assert found == []


def test_the_rules_reader_does_not_judge() -> None:
    """`rules/inputs.py` reads what it is asked: it imports no rule family and never sees the
    thresholds, so what to read is decided in one place (`engine.read_jobs`) by the rules' own
    predicates, and a threshold's way from `engine.evaluate` stays in the engine."""
    mods = modules()
    name = "jobpulse.collector.rules.inputs"
    rules = {m for m in imports(name, mods[name], set(mods)) if m.startswith("jobpulse.collector.rules.")}
    assert rules <= {"jobpulse.collector.rules.model"}, rules
    assert "Thresholds" not in mods[name].read_text().replace("`Thresholds.lookback`", "")


def test_no_room_holds_more_than_fifteen_modules_at_its_top() -> None:
    """A room past fifteen modules has stages of its own: give them sub-packages (as `store/` has)."""
    crowded = {}
    for folder in PACKAGES:
        for room in [ROOT / folder, *(p for p in (ROOT / folder).rglob("*") if (p / "__init__.py").is_file())]:
            count = sum(1 for p in room.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
            if count > 15:
                crowded[str(room.relative_to(ROOT))] = count
    assert not crowded, crowded


def _map_sections() -> dict[str, str]:
    """docs/development.md's module map, by the folder (or file) each of its entries starts with."""
    text = (ROOT / "docs" / "development.md").read_text()
    block = text.split("## Where things are", 1)[1].split("```", 2)[1]
    sections: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        head = re.match(r"([a-z_]+/(?:[a-z_]+/)*(?:[a-z_]+\.py)?)\s", line + " ")
        if head and not line.startswith(" "):
            current = head.group(1)
        if current:
            sections[current] = sections.get(current, "") + line + "\n"
    return sections


def test_the_development_map_names_every_module() -> None:
    """docs/development.md is the map a newcomer reads first: every module is named in the entry of its
    folder (the longest one that holds it), so a new or moved module fails here until the map says
    where it is."""
    sections = _map_sections()
    unnamed = []
    for path in modules().values():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        rel = path.relative_to(ROOT).as_posix()
        holders = [head for head in sections if rel.startswith(head)]
        named = holders and re.search(rf"(?<![\w/]){re.escape(path.stem)}(?!\w)", sections[max(holders, key=len)])
        if not named:
            unnamed.append(rel)
    assert unnamed == [], "modules docs/development.md's map does not name (in their folder's entry): " + ", ".join(unnamed)


def test_no_test_file_name_is_used_twice() -> None:
    """`tests/` and `tests/unit/` hold different tests: one name would be two files to look in."""
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(path.relative_to(ROOT).as_posix())
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
