"""The `nvidia-smi -q -x` captures the fake NVML plays (tests/data/nvsmi/) as `tests/nvsmi_capture.py`
reads them: enough models and schemas, and values printed as N/A beside measured ones."""

from __future__ import annotations

from ..nvsmi_capture import parse
from ..test_real_captures import CAPTURES


def test_the_captures_cover_models_schemas_and_missing_values() -> None:
    cards = [c for path in CAPTURES for c in parse(path)]
    assert len(CAPTURES) >= 12 and len({c.name for c in cards}) >= 10
    assert any(c.expected["power_w"] is None for c in cards) and any(c.expected["ecc_sbe_total"] is not None
                                                                       for c in cards)
