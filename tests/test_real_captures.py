"""Real cards, not only what we imagined: `nvidia-smi -q -x` captures of thirteen GPU models (Telegraf's
test data and one H200 of ours, tests/data/nvsmi/SOURCE.md) played on the fake NVML in NVML's units; the agent's samples
and its dcgm-exporter exposition must show what nvidia-smi printed for the same card, in the wire
format's units, and NULL (no metric) where nvidia-smi printed N/A."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobpulse.schema.fields import GPU_BY_NAME

from .agents import Scenario, sample_twice
from .nvsmi_capture import parse

CAPTURES = sorted((Path(__file__).parent / "data" / "nvsmi").glob("*.xml"))
_METRIC = re.compile(r'^(DCGM_\w+)\{[^}]*UUID="([^"]+)"[^}]*\} (\S+)$', re.M)


@pytest.mark.parametrize("capture", CAPTURES, ids=[p.stem for p in CAPTURES])
def test_the_agent_samples_what_nvidia_smi_printed(fake_nvml: Path, tmp_path: Path, capture: Path) -> None:
    scenario = Scenario()
    cards = parse(capture)
    for i, card in enumerate(cards):
        scenario.gpu(i, card.uuid, card.bus_id, name=card.name, **card.keys)  # type: ignore[arg-type]
        for call in card.unsupported:
            scenario.add(f"unsupported {call} {i}")
    got = sample_twice(fake_nvml, scenario.write(tmp_path / "s.scn"))
    exposed = {(name, uuid): float(value) for name, uuid, value in _METRIC.findall(got["metrics"])}
    for card in cards:
        sample = got["samples"][card.uuid]
        wrong = {name: (want, sample[name]) for name, want in card.expected.items()
                 if (want is None) != (sample[name] is None)
                 or (want is not None and sample[name] != pytest.approx(want, abs=1e-3))}
        assert not wrong, f"{capture.name}: field: (nvidia-smi, agent) {wrong}"
        for name, want in card.expected.items():
            dcgm = GPU_BY_NAME[name].dcgm
            if dcgm is None:
                continue
            shown = exposed.get((dcgm.name, card.uuid))
            assert (shown is None) == (want is None), f"{capture.name}: {dcgm.name} {shown} vs {want}"
            if want is not None:
                assert shown == pytest.approx(float(want) * dcgm.scale, rel=1e-6), (dcgm.name, shown, want)
