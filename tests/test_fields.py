"""The field table is the one place a field is declared: the wire structs, the migrations' columns,
the agent's sampler and exporter, the roll-ups and gpu_series all follow it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pynvml

from jobpulse.collector.grafana import dashboards
from jobpulse.collector.store.database import BATCH_TABLES
from jobpulse.collector.store.read import series
from jobpulse.collector.store.tiers import compact, pyramid, rollup
from jobpulse.schema import wire
from jobpulse.schema.fields import GPU_FIELDS, INT16_MAX, INT32_MAX, INT64_MAX, PROCESS_FIELDS

from .agents import FULL_H100, Scenario, by_id, sample_twice, start_agent
from .conftest import RunningCollector
from .grafana_macros import Var, expand

_SQL_MAX = {"smallint": INT16_MAX, "integer": INT32_MAX, "bigint": INT64_MAX}


def test_every_number_a_batch_carries_fits_its_column(dsn: str) -> None:
    """On Citus the collector copies a group's rows in binary, and a binary COPY wraps a smallint past
    32,767 and makes a real past 3.4e38 infinite where the JSON path refuses them: the wire schema's
    bounds must keep every number of every stored table inside its column's type."""
    limits = {**_SQL_MAX, "real": 3.4e38, "double precision": 1.7e308}
    defs = msgspec.json.schema(wire.Batch)["$defs"]
    with psycopg.connect(dsn) as conn:
        for table, (_, struct) in BATCH_TABLES.items():
            types = dict(conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
                                      " WHERE attrelid = %s::regclass AND attnum > 0", (f"jobpulse.{table}",)).fetchall())
            schema = defs[struct.__name__]["properties"]
            for name in struct.__struct_fields__:
                if types[name] not in limits:
                    continue
                numbers = [s for s in schema[name].get("anyOf", [schema[name]]) if s.get("type") in ("integer", "number")]
                assert numbers, (table, name, schema[name])
                for s in numbers:
                    assert -limits[types[name]] - 1 <= s.get("minimum", -math.inf), (table, name, s)
                    assert s.get("maximum", math.inf) <= limits[types[name]], (table, name, s)


def test_every_place_a_field_must_appear_has_it(dsn: str) -> None:
    """The recipe (docs/development.md): a row in the field table; `db upgrade` does the rest. Here
    every place a field lands is checked against the table."""
    with psycopg.connect(dsn) as conn:
        def columns(table: str) -> dict[str, str]:
            return dict(conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_schema = 'jobpulse' AND table_name = %s", (table,)).fetchall())
        samples, processes = columns("gpu_samples"), columns("process_samples")
        types = {"real": "real", "boolean": "boolean", "text": "text"} | {t: t for t in _SQL_MAX}
        for f in GPU_FIELDS:
            assert samples.get(f.name) == types[f.sql], f"gpu_samples.{f.name}: {samples.get(f.name)} vs {f.sql}"
        for f in PROCESS_FIELDS:
            assert processes.get(f.name) == types[f.sql], f"process_samples.{f.name}"
        gpu_rollup, process_rollup = columns("gpu_rollup"), columns("process_rollup")
        assert set(rollup.field_columns(GPU_FIELDS)) <= set(gpu_rollup)
        assert set(rollup.field_columns(PROCESS_FIELDS)) <= set(process_rollup)
        returned = [c.name for c in conn.execute(
            "SELECT * FROM jobpulse.gpu_series('x', 'x', now(), now())").description]
        assert returned == ["time", "node", "gpu_uuid", "gpu_index", *(f.series for f in GPU_FIELDS if f.series),
                            "source"]
        assert not series.ensure(conn), "gpu_series re-created although the table did not change"
        for tier in compact.TIERS:  # the compact tier packs every field (its columns made by `db upgrade`)
            packed = columns(tier.compact)
            for column in tier.packed:
                assert {column.name, f"{column.name}_base", f"{column.name}_null"} <= set(packed), column.name
        for table in pyramid.TABLES:  # every counter a node-health panel draws, as its increase per bucket
            assert {f"inc_{c}" for c in pyramid.COUNTERS} <= set(columns(table)), table


_BY_ID = by_id(GPU_FIELDS)


def _missing(sample: dict[str, Any]) -> list[str]:
    return [f for f, v in sample.items() if v is None]


def test_the_sampler_and_exporter_give_every_field_of_a_full_gpu(fake_nvml: Path, tmp_path: Path) -> None:
    """A GPU that supports everything NVML has: no field left NULL, every dcgm-exporter name exposed,
    GPM metrics sent at the field table's resolution (NVML's double 33.2549 as 33.25)."""
    counters = {key: 3 + i for i, key in enumerate(_BY_ID)}
    scenario = Scenario().gpu(0, "GPU-full", "00000000:17:00.0", **{**FULL_H100, "gpm_occ": 33.2549},
                              **counters).write(tmp_path / "s.scn")
    got = sample_twice(fake_nvml, scenario)
    assert _missing(got["samples"]["GPU-full"]) == []
    assert got["samples"]["GPU-full"]["gpm_sm_occupancy"] == 33.25
    for f in GPU_FIELDS:
        if f.dcgm:
            assert f'\n{f.dcgm.name}{{' in got["metrics"], f.dcgm.name


def test_a_field_value_not_supported_inside_the_batch_empties_only_its_field(fake_nvml: Path,
                                                                             tmp_path: Path) -> None:
    """nvmlDeviceGetFieldValues answers per value: one NOT_SUPPORTED entry is that field's NULL, the
    others of the same call still arrive. Power falls back from the 1 s average to the instantaneous
    reading (as nvmlDeviceGetPowerUsage does on GPUs without the average), then, on a driver that
    knows neither field id, to nvmlDeviceGetPowerUsage itself; NULL where the GPU has no power reading."""
    sbe, avg, inst = (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, pynvml.NVML_FI_DEV_POWER_AVERAGE,
                      pynvml.NVML_FI_DEV_POWER_INSTANT)
    nvlink = dict.fromkeys(_BY_ID, 1)
    scenario = (Scenario().gpu(0, "GPU-a", "00000000:17:00.0", **FULL_H100, **nvlink)
                .gpu(1, "GPU-b", "00000000:65:00.0", **FULL_H100, **nvlink)
                .gpu(2, "GPU-c", "00000000:66:00.0", **{k: v for k, v in FULL_H100.items() if k != "power_mw"},
                     **nvlink)
                .add(f"unsupported fi.{sbe} 0").add(f"unsupported fi.{avg} 0")
                .add(f"unsupported fi.{avg} 1").add(f"unsupported fi.{inst} 1").write(tmp_path / "s.scn"))
    got = sample_twice(fake_nvml, scenario)["samples"]
    a, b, c = got["GPU-a"], got["GPU-b"], got["GPU-c"]
    assert _missing(a) == ["ecc_sbe_total"]
    assert a["power_w"] == 312.5 and a["ecc_dbe_total"] == 0 and a["pcie_replay"] == 7 and a["remapped_correctable"] == 1
    assert a["remap_pending"] is False and a["mem_temp_c"] == 72 and a["energy_mj"] > 0
    assert _missing(b) == [] and b["power_w"] == 312.5
    assert b["ecc_sbe_total"] == 2 and b["energy_mj"] > 0
    assert "power_w" in _missing(c)


def test_nvlink_error_counters_flow_from_nvml_to_the_node_health_panel(
        fake_nvml: Path, collector: RunningCollector, dsn: str, tmp_path: Path) -> None:
    """The proof field end to end: NVML field values -> agent -> collector -> PostgreSQL -> roll-ups
    -> the node-health panel the field table asks for (its query expanded as Grafana does)."""
    replay = pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
    crc = pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
    scenario = (Scenario().gpu(0, "GPU-nvl", "00000000:17:00.0", sm=50, **{f"fi.{replay}": 5, f"fi.{crc}": 0})
                .set(5.0, 0, **{f"fi.{replay}": 9}).write(tmp_path / "s.scn"))  # after the agent started, loaded or not
    agent = start_agent(fake_nvml, scenario, tmp_path / "n1", "n1", collector=collector.url, token=collector.token)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with psycopg.connect(dsn) as conn:
                seen = conn.execute("SELECT min(nvlink_replay_errors), max(nvlink_replay_errors),"
                                    " max(nvlink_crc_flit_errors), count(nvlink_recovery_errors)"
                                    " FROM jobpulse.gpu_samples WHERE gpu_uuid = 'GPU-nvl'").fetchone()
            if seen[1] == 9:
                break
            time.sleep(0.3)
    finally:
        agent.stop()
    assert seen == (5, 9, 0, 0), "replay 5 then 9, CRC 0, recovery not supported (NULL)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 15  # the leader folds the samples into their buckets within seconds
        while (folded := conn.execute("SELECT min(min_nvlink_replay_errors), max(max_nvlink_replay_errors)"
                                      " FROM jobpulse.gpu_rollup WHERE width_s = 300 AND gpu_uuid = 'GPU-nvl'"
                                      ).fetchone()) != (5, 9) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert folded == (5, 9)
        panel = next(p for name, fn in dashboards.DASHBOARDS.items() if name == "node-health"
                     for p in dashboards.as_json(fn())["panels"] if p["title"] == "NVLink errors (increase)")
        end = datetime.now(UTC) + timedelta(minutes=10)
        sql = expand(panel["targets"][0]["rawSql"], {"cluster": Var(("testcluster",)), "node": Var(("n1",), True)},
                     end - timedelta(hours=1), end, 3_600_000)
        rows = {metric: value for _, metric, value in conn.execute(sql).fetchall()}
    assert rows == {"n1/GPU0 replay": 4, "n1/GPU0 CRC flit": 0}


ADD_A_FIELD = """
import json, sys, types
from pathlib import Path
import jobpulse.schema

# The field table as a contributor edits it: one row more at the end of GPU_FIELDS, nothing else.
path = Path(jobpulse.schema.__file__).parent / "fields.py"
source, marker = path.read_text(), "\\n)\\n\\nPROCESS_FIELDS"
row = ("    Field('widget_level', 'integer', 'widgets', 'a field added by editing the field table alone',"
       " 'field value NVML_FI_DEV_WIDGET', rollup={'sum_widget_level': 'sum', 'max_widget_level': 'max'},"
       " series='widget_level', dcgm=Dcgm('DCGM_FI_DEV_WIDGET', 'Widgets.'), panel='Widgets', label='widgets'),")
assert source.count(marker) == 1
module = types.ModuleType("jobpulse.schema.fields")
module.__file__ = str(path)
sys.modules[module.__name__] = jobpulse.schema.fields = module
exec(compile(source.replace(marker, "\\n" + row + marker), str(path), "exec"), module.__dict__)

import psycopg
from jobpulse.agent import exporter
from jobpulse.collector.grafana.node_health_dashboard import node_health_dashboard
from jobpulse.collector.store.migrate import migrations
from jobpulse.collector.store.tiers import fold, partitions

with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    migrations.upgrade(conn)
    partitions.ensure_ahead(conn, 1)
    conn.execute("UPDATE jobpulse.fold_mark SET folded_before = now() - interval '1 minute'")  # as a leader left it
    conn.execute("INSERT INTO jobpulse.gpu_samples (cluster, node, ts, gpu_uuid, gpu_index, job_id, sm_util,"
                 " widget_level)"
                 " SELECT 'c', 'n1', now() - make_interval(secs => s), 'GPU-w', 0, '7', 50, s"
                 " FROM generate_series(20, 25) s")
    fold.run(conn, fold.timedelta(0))
    def columns(table):
        return dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns"
                                 " WHERE table_schema = 'jobpulse' AND table_name = %s", (table,)).fetchall())
    out = {t: {c: v for c, v in columns(t).items() if "widget" in c}
           for t in ("gpu_samples", "gpu_rollup", "gpu_rollup_10s", "gpu_samples_compact")}
    out["folded"] = {t: conn.execute(f"SELECT max(max_widget_level), sum(sum_widget_level) FROM jobpulse.{t}"
                                     " WHERE gpu_uuid = 'GPU-w'").fetchone() for t in ("gpu_rollup", "gpu_rollup_10s")}
    out["series"] = [c.name for c in conn.execute("SELECT * FROM jobpulse.gpu_series('c', '7', now(), now())"
                                                  ).description if "widget" in c.name]
    out["again"] = migrations.upgrade(conn) == [] and not any("widget" in s for s in migrations.field_columns.missing(conn))
out["dcgm"] = "DCGM_FI_DEV_WIDGET" in exporter.EXPOSABLE
out["panel"] = [p.title for p in node_health_dashboard().panels if p.title == "Widgets"]
print(json.dumps(out, default=str))
"""


def test_a_field_added_to_the_field_table_alone_reaches_every_place(dsn: str, tmp_path: Path) -> None:
    """Issue: a new field also needed a migration for its sample and roll-up columns, and a third table
    (`gpu_rollup_10s`, made LIKE `gpu_rollup`) that no recipe named. `db upgrade` now makes the columns
    from the field table: a row added there, and nothing else, reaches the samples, both roll-ups (as
    the leader folds them), the compact tier, `gpu_series`, the dcgm-exporter names and a panel."""
    script = tmp_path / "add_a_field.py"
    script.write_text(ADD_A_FIELD)
    done = subprocess.run([sys.executable, str(script), dsn], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["gpu_samples"] == {"widget_level": "integer"}
    for table in ("gpu_rollup", "gpu_rollup_10s"):
        assert got[table] == {"sum_widget_level": "double precision", "max_widget_level": "integer"}, table
        assert got["folded"][table] == [25, 135.0], table
    assert {"widget_level", "widget_level_base", "widget_level_null"} <= set(got["gpu_samples_compact"])
    assert got["series"] == ["widget_level"] and got["again"]
    assert got["dcgm"] and got["panel"] == ["Widgets"]
