"""Every pattern that reads untrusted text runs in time linear in its input: each module-level
compiled pattern and each literal pattern handed to `re` in the modules that read files or requests
(the recordings' readers, ingest, schema), timed on inputs made to make a backtracking engine
explode (long runs of spaces, pipes, digits, brackets; the hostile table line; nvitop's borders;
UTF-16 read as if it were 8-bit)."""

from __future__ import annotations

import ast
import importlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READERS = {"collector/recordings": "jobpulse.collector.recordings", "collector/ingest": "jobpulse.collector.ingest",
           "schema": "jobpulse.schema"}
N = 5000
BOUND_S = 0.05
"""A linear pattern takes well under a millisecond on these 5,000 characters; one that backtracks
quadratically takes seconds (`"| 0" + " " * 1000 + "x|"` took 14.8 s in the old table pattern)."""

HOSTILE = {
    "spaces": " " * N,
    "spaces then x": "1" + " " * N + "x",
    "pipes": "|" * N,
    "pipes and spaces": "| " * N,
    "digits": "1" * N,
    "digits then W": "1" * N + "W/",
    "decimals": "1." * N,
    "table line": "| 0" + " " * N + "x|",
    "table line, no close": "| 0" + " " * N + "x",
    "table line On": "|   0  " + "A " * N + "On  |",
    "nvitop borders": "│" + " " * N + "x│",
    "nvitop rule": "╞" + "═" * N + "╡",
    "utf-16 as bytes": "\x00".join("| 0" + " " * (N // 2) + "x|"),
    "brackets": "(" * N,
    "square brackets": "[" * N + " " * N,
    "percent": "5" + " " * N + "%" + " " * N + "x",
    "codec": "E:" + " " * N,
    "gpustat": "[0]" + " " * N + "x",
    "zone": "Mon" + " " * N + "x",
    "underscores": "gpu_" * (N // 4) + "x",
    "cuda": "cuda" + " " * N + "x",
    "backslashes": "\\" * N + "u000",
    "ansi": "\x1b[" + "0;" * N,
    "newlines": " \n" * N,
}


def module_patterns() -> Iterator[tuple[str, re.Pattern[str] | re.Pattern[bytes]]]:
    """Module-level compiled patterns, alone or in a tuple, list or dict value."""
    for folder, package in READERS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            module = importlib.import_module(name)
            for attr, value in vars(module).items():
                found = value if isinstance(value, (tuple, list)) else value.values() if isinstance(value, dict) else [value]
                for i, p in enumerate(found):
                    if isinstance(p, re.Pattern):
                        yield f"{name}.{attr}[{i}]", p


_FLAGS = {"M": re.M, "MULTILINE": re.M, "I": re.I, "IGNORECASE": re.I, "S": re.S, "DOTALL": re.S}


def literal_patterns() -> Iterator[tuple[str, re.Pattern[str] | re.Pattern[bytes]]]:
    """Literal patterns given to `re.search`, `re.match`, ... inside functions (re caches them: they
    read the file's text as a module-level pattern would)."""
    for folder in READERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                        and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, (str, bytes))):
                    flags = 0
                    for arg in [*node.args[1:], *(k.value for k in node.keywords)]:
                        for a in ast.walk(arg):
                            if isinstance(a, ast.Attribute):
                                flags |= _FLAGS.get(a.attr, 0)
                    yield f"{path.relative_to(ROOT)}:{node.lineno}", re.compile(node.args[0].value, flags)


PATTERNS = dict([*module_patterns(), *literal_patterns()])


def test_the_readers_patterns_are_found() -> None:
    """The search below must see the patterns it is meant to time (a rename would hide them)."""
    names = " ".join(PATTERNS)
    for expected in ("gpustat.GPU_LINE", "smi._POWER", "table._NUMERIC", "values._NUMBER", "times._ZONE_NAME",
                     "field_aliases._WIDE[0]", "storable._NUL_ESCAPE", "munge._UID", "recordings/formats.py:"):
        assert expected in names, expected


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_a_pattern_is_linear_on_hostile_input(name: str) -> None:
    pattern = PATTERNS[name]
    slow = {}
    for kind, text in HOSTILE.items():
        subject: str | bytes = text.encode("utf-8", "surrogatepass") if isinstance(pattern.pattern, bytes) else text
        began = time.perf_counter()
        pattern.search(subject)  # type: ignore[arg-type]
        pattern.match(subject)  # type: ignore[arg-type]
        took = time.perf_counter() - began
        if took > BOUND_S:
            slow[kind] = round(took, 3)
    assert not slow, f"{name} ({pattern.pattern!r}) backtracks: seconds per input {slow}"
