"""`jobpulse-agent validate` on a machine without NVML: a clear error and exit code 2, no traceback."""

from __future__ import annotations

from pathlib import Path

from ..test_validate import validate


def test_missing_nvml_is_a_clear_error(tmp_path: Path) -> None:
    r = validate(None, None)
    assert r.returncode == 2
    assert "NVML is not available" in r.stderr and "Traceback" not in r.stderr
