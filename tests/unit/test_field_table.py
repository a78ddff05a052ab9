"""The field table's own declarations, and the wire structs made from it: fields in the table's
order, integer bounds inside their columns' types and a value past a bound refused by its name;
names, DCGM names, NVML ids, roll-ups, panels and resolutions consistent."""

from __future__ import annotations

import json

import msgspec
import pynvml
import pytest

from jobpulse.schema import fields, wire
from jobpulse.schema.fields import GPU_FIELDS, PROCESS_FIELDS

from ..test_fields import _SQL_MAX


def test_wire_structs_are_the_table_in_column_order() -> None:
    assert wire.GpuSample.__struct_fields__ == ("ts", "gpu_uuid", "gpu_index", "job_id",
                                                *(f.name for f in GPU_FIELDS))
    assert wire.ProcessSample.__struct_fields__ == ("ts", "pid", *(f.name for f in PROCESS_FIELDS))
    schema = msgspec.json.schema(wire.GpuSample)["$defs"]["GpuSample"]["properties"]
    for f in GPU_FIELDS:
        bounds = schema[f.name]["anyOf"][0]
        if f.sql in _SQL_MAX:  # an integer the column can hold, whatever the table says
            assert bounds["type"] == "integer" and -_SQL_MAX[f.sql] <= bounds["minimum"]
            assert bounds["maximum"] <= _SQL_MAX[f.sql], f.name
        assert f.description in bounds.get("description", f.description), f.name


def test_a_value_outside_a_fields_bounds_is_rejected_with_its_name() -> None:
    body = json.dumps({"ts": "2026-01-01T00:00:00Z", "gpu_uuid": "GPU-1", "gpu_index": 0, "gpu_temp_c": 5000})
    try:
        msgspec.json.decode(body, type=wire.GpuSample)
    except msgspec.ValidationError as exc:
        assert "gpu_temp_c" in str(exc)
    else:
        raise AssertionError("out-of-range temperature accepted")


def test_table_declarations_are_consistent() -> None:
    names = [f.name for f in GPU_FIELDS]
    assert len(names) == len(set(names))
    dcgm = [f.dcgm.name for f in GPU_FIELDS if f.dcgm]
    assert len(dcgm) == len(set(dcgm)) and all(n.startswith("DCGM_FI_") for n in dcgm)
    for f in (*GPU_FIELDS, *PROCESS_FIELDS):
        for nvml_name in (f.nvml_field, f.nvml_gpm):
            assert nvml_name is None or hasattr(pynvml, nvml_name), f"{f.name}: pynvml has no {nvml_name}"
    for f in GPU_FIELDS:
        if f.series:  # gpu_series needs a mean (sum) or a limit (max) from the roll-ups
            assert {"sum", "max"} & set(f.rollup.values()), f.name
    for title, members in fields.PANELS.items():
        for f in members:
            assert f.rollup and f.label, f"{title}: {f.name} has no roll-up or label"


def test_a_resolution_is_declared_for_reals_only_and_as_one_nth() -> None:
    for kw in ({"sql": "integer", "resolution": 0.01}, {"sql": "real", "resolution": 0.03}):
        with pytest.raises(ValueError, match="resolution"):
            fields.Field("x", kw["sql"], "", "", "-", resolution=kw["resolution"])  # type: ignore[arg-type]
    assert fields.GPU_BY_NAME["gpm_sm_active"].quantize(12.345678) == 12.35
    assert fields.GPU_BY_NAME["power_w"].quantize(312.5004) == 312.5
