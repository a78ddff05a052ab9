"""Store: fold GPU samples into `gpu_rollup_10s` (10 s buckets) and `gpu_rollup` (300 s), process
samples into `process_rollup` and step events into `step_rollup` (60 s and 300 s).

A fold is one INSERT ... ON CONFLICT that adds a set of rows to their buckets; `fold(table, source)`
reads them from any relation shaped like the table: the leader's fold the raw rows of a time range
(`fold.py`: GPU and process samples, a few seconds behind ingest), the collector's ingest statement
the rows it is inserting that the leader will not fold (`database.py`: step events, late samples,
through a temporary staging table: `create_stage`, `move`), seeding code the same (`FOLDS`). A
batch's rows are folded once: ingest folds only rows of a batch the ledger took (a replay is a no-op
before it gets here), and `fold.py` says how ingest and the leader split them.
Rules and long-range Grafana panels read the buckets; see migrations 0005 and 0006 for the columns.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from jobpulse.schema.fields import GPU_FIELDS, PROCESS_FIELDS, Field
from jobpulse.schema.semantics import BUSY_PERCENT, HW_SLOWDOWN_BITS, IDLE_PERCENT, activity_sql

FINE_TABLE, FINE_WIDTH_S = "gpu_rollup_10s", 10  # kept while samples are raw (partitions.FINE_TIER)
WIDTH_S = 300  # gpu_rollup's buckets made at ingest (compaction adds coarser ones, coarse.py)
ROLLUP_TABLES = ("gpu_rollup", FINE_TABLE, "process_rollup", "step_rollup")
# Every stored batch updates its buckets' rows in place: room left in each page lets PostgreSQL
# keep a row's new version beside the old (a HOT update, no index entry to add): the fold costs
# less with pages half full (`bench/ingest.py`, 64-batch groups).
FILLFACTOR = 50
PROCESS_WIDTHS_S = (60, 300)


def stage_name(table: str) -> str:
    return f"jobpulse_batch_{table}"


def create_stage(table: str) -> str:
    return f"CREATE TEMP TABLE IF NOT EXISTS {stage_name(table)} (LIKE jobpulse.{table}) ON COMMIT DELETE ROWS"


def _widths(widths: tuple[int, ...]) -> str:
    return f"(VALUES {', '.join(f'({w}::smallint)' for w in widths)}) AS w(width_s)"


def move(table: str) -> str:
    return f"INSERT INTO jobpulse.{table} SELECT * FROM pg_temp.{stage_name(table)}"


# column -> (aggregate over the batch's samples, how a stored bucket merges with the new one)
_ADD = "{c} = r.{c} + EXCLUDED.{c}"
_ADDN = "{c} = coalesce(r.{c} + EXCLUDED.{c}, r.{c}, EXCLUDED.{c})"
_MAX = "{c} = greatest(r.{c}, EXCLUDED.{c})"
_NEWER = "{c} = CASE WHEN EXCLUDED.last_ts >= r.last_ts THEN EXCLUDED.{c} ELSE r.{c} END"
_MIN = "{c} = least(r.{c}, EXCLUDED.{c})"
_ANY = "{c} = coalesce(EXCLUDED.{c}, r.{c})"
_OR = "{c} = coalesce(r.{c} OR EXCLUDED.{c}, r.{c}, EXCLUDED.{c})"
_FIRST = "{c} = coalesce(r.{c}, EXCLUDED.{c})"
_AGGREGATES = {  # a field table roll-up aggregate -> (SQL over the batch, merge)
    "sum": ("sum({f})", _ADDN),
    "max": ("max({f})", _MAX),
    "min": ("min({f})", _MIN),
    "count": ("count({f})", _ADD),
    "any": ("max({f})", _ANY),
    "or": ("bool_or({f})", _OR),
    "true": ("count(*) FILTER (WHERE {f})", _ADD),
}
# merge -> the same merge as an aggregate over stored buckets (the coarse buckets, coarse.py)
COARSEN = {_ADD: "sum({c})", _ADDN: "sum({c})", _MAX: "max({c})", _MIN: "min({c})", _OR: "bool_or({c})",
           _ANY: "(array_agg({c} ORDER BY bucket DESC) FILTER (WHERE {c} IS NOT NULL))[1]",
           _NEWER: "(array_agg({c} ORDER BY bucket DESC))[1]",
           _FIRST: "(array_agg({c} ORDER BY bucket) FILTER (WHERE {c} IS NOT NULL))[1]"}


def field_columns(table: tuple[Field, ...]) -> dict[str, tuple[str, str]]:
    """The roll-up columns the field table declares, with their aggregate and merge."""
    return {column: (_AGGREGATES[agg][0].format(f=f.name), _AGGREGATES[agg][1])
            for f in table for column, agg in f.rollup.items()}


# Columns that are not one field's aggregate: counts, times, and the shared meanings (idle, busy,
# hardware slowdown, PCIe link under load) as the rules read them.
_COLUMNS: dict[str, tuple[str, str]] = {
    "gpu_index": ("max(gpu_index)", _NEWER),
    "n": ("count(*)", _ADD),
    "first_ts": ("min(ts)", _MIN),
    "last_act": ("(array_agg(act ORDER BY ts DESC))[1]", _NEWER),
    "last_fb_used_mib": ("(array_agg(fb_used_mib ORDER BY ts DESC))[1]", _NEWER),
    "last_busy_ts": (f"max(ts) FILTER (WHERE act > {IDLE_PERCENT})", _MAX),
    "n_idle": (f"count(*) FILTER (WHERE act <= {IDLE_PERCENT})", _ADD),
    "n_busy": (f"count(*) FILTER (WHERE act >= {BUSY_PERCENT})", _ADD),
    "n_gpm": ("count(gpm_sm_active)", _ADD),
    "n_hw_throttle": (f"count(*) FILTER (WHERE clock_event_reasons & {HW_SLOWDOWN_BITS} <> 0)", _ADD),
    "n_loaded": ("count(*) FILTER (WHERE loaded)", _ADD),
    "n_pcie_low": ("count(*) FILTER (WHERE loaded AND link_low)", _ADD),
    "pcie_link_low": ("min(link) FILTER (WHERE loaded AND link_low)", _FIRST),
    **field_columns(GPU_FIELDS),
    "last_ts": ("max(ts)", _MAX),  # SET expressions all see the stored row: order does not matter
}



def gpu_buckets(source: str, width_s: int) -> str:
    """GPU samples of ``source`` (a relation with gpu_samples' columns) binned into buckets of
    ``width_s``: rows with a roll-up table's columns, as the ingest fold makes them."""
    return f"""
SELECT {width_s}::smallint AS width_s, date_bin(interval '{width_s} seconds', s.ts, timestamptz 'epoch') AS bucket,
       s.cluster, coalesce(s.job_id, '') AS job_id, s.node, s.gpu_uuid,
       {", ".join(f"{agg} AS {c}" for c, (agg, _) in _COLUMNS.items())}
  FROM (SELECT g.*, {activity_sql('g.gpm_sm_active', 'g.sm_util')} AS act,
               g.sm_util >= {BUSY_PERCENT} AND g.pcie_gen_max IS NOT NULL AS loaded,
               g.pcie_gen < g.pcie_gen_max OR g.pcie_width < g.pcie_width_max AS link_low,
               g.pcie_gen || 'x' || g.pcie_width || '/' || g.pcie_gen_max || 'x' || g.pcie_width_max AS link
          FROM {source} g) s
 GROUP BY 1, 2, 3, 4, 5, 6"""


_KEYS = "width_s, cluster, job_id, node, gpu_uuid, bucket"
_MERGES = ", ".join(merge.format(c=c) for c, (_, merge) in _COLUMNS.items())


def _fold_gpus(table: str, width_s: int, source: str = "{source}") -> str:
    return f"""
INSERT INTO jobpulse.{table} AS r (width_s, bucket, cluster, job_id, node, gpu_uuid, {", ".join(_COLUMNS)})
{gpu_buckets(source, width_s)}
ON CONFLICT ({_KEYS}) DO UPDATE SET {_MERGES}
"""


# The samples of a late batch get 10 s buckets only from the day the readers take them from: an
# older day has no partition for them (partitions.ensure), its readers bin the samples.
_FINE_SOURCE = "(SELECT * FROM {source} f WHERE ts >= (SELECT jobpulse.gpu_rollup_10s_since()))"

# A process row stands for 1 + held ticks (the agent holds back a node's unchanged ticks:
# `agent.sources.processes.ChangeOnly`): counts and sums weigh it so, maxima take it once.
WEIGHT = "(1 + coalesce({p}held, 0))"
_WEIGHED = {
    "sum": f"sum({{f}} * {WEIGHT.format(p='')})",
    "count": f"coalesce(sum({WEIGHT.format(p='')}) FILTER (WHERE {{f}} IS NOT NULL), 0)",
    "true": f"coalesce(sum({WEIGHT.format(p='')}) FILTER (WHERE {{f}}), 0)",
}
_PROCESS_COLUMNS: dict[str, tuple[str, str]] = {
    "n": (f"sum({WEIGHT.format(p='')})", _ADD),
    **{column: (_WEIGHED.get(agg, _AGGREGATES[agg][0]).format(f=f.name), _AGGREGATES[agg][1])
       for f in PROCESS_FIELDS for column, agg in f.rollup.items()}}
_FOLD_PROCESSES = f"""
INSERT INTO jobpulse.process_rollup AS r (width_s, bucket, cluster, job_id, node, pid, {", ".join(_PROCESS_COLUMNS)})
SELECT w.width_s, date_bin(make_interval(secs => w.width_s), p.ts, timestamptz 'epoch'),
       p.cluster, p.job_id, p.node, p.pid, {", ".join(agg for agg, _ in _PROCESS_COLUMNS.values())}
  FROM {{source}} p CROSS JOIN {_widths(PROCESS_WIDTHS_S)}
 WHERE p.job_id IS NOT NULL
 GROUP BY 1, 2, 3, 4, 5, 6
ON CONFLICT (width_s, cluster, job_id, node, pid, bucket) DO UPDATE SET
 {", ".join(merge.format(c=c) for c, (_, merge) in _PROCESS_COLUMNS.items())}
"""

# roll-up table -> (its key after width and bucket, its other columns with their aggregate and merge)
COLUMNS = {"gpu_rollup": (("cluster", "job_id", "node", "gpu_uuid"), _COLUMNS),
           "process_rollup": (("cluster", "job_id", "node", "pid"), _PROCESS_COLUMNS)}

# step events: how many, the mean of the reported samples/s, the furthest step (rank -1: none)
_FOLD_STEPS = f"""
INSERT INTO jobpulse.step_rollup AS r (width_s, bucket, cluster, job_id, rank, n, n_rate, sum_samples_per_s,
                                       max_step_number)
SELECT w.width_s, date_bin(make_interval(secs => w.width_s), e.ts, timestamptz 'epoch'), e.cluster, e.job_id,
       coalesce(e.rank, -1), count(*), count(e.rate), sum(e.rate),
       max(jobpulse.attr_bigint(e.attrs, 'step'))
  FROM (SELECT *, jobpulse.attr_number(attrs, 'samples_per_s') AS rate FROM {{source}}
         WHERE kind = 'step' AND job_id IS NOT NULL) e
 CROSS JOIN {_widths(PROCESS_WIDTHS_S)}
 GROUP BY 1, 2, 3, 4, 5
ON CONFLICT (width_s, cluster, job_id, rank, bucket) DO UPDATE SET
 n = r.n + EXCLUDED.n, n_rate = r.n_rate + EXCLUDED.n_rate,
 sum_samples_per_s = coalesce(r.sum_samples_per_s + EXCLUDED.sum_samples_per_s, r.sum_samples_per_s,
                              EXCLUDED.sum_samples_per_s),
 max_step_number = greatest(r.max_step_number, EXCLUDED.max_step_number)
"""

_FOLD_SQL = {"gpu_samples": (_fold_gpus(FINE_TABLE, FINE_WIDTH_S, _FINE_SOURCE), _fold_gpus("gpu_rollup", WIDTH_S)),
             "process_samples": (_FOLD_PROCESSES,), "events": (_FOLD_STEPS,)}


def _fine_first(fine_table: str, fine: str, coarse_table: str, keys: tuple[str, ...],
                columns: dict[str, tuple[str, str]]) -> str:
    """One statement of the leader's fold: the fine buckets of its rows (``fine``, a SELECT with the
    roll-up's columns) made once, added to ``fine_table``, and the ``WIDTH_S`` buckets made of those
    (a fraction of the rows to aggregate again, by the merge each column's fold uses, as coarse.py
    makes 1,800 s buckets of 300 s ones) added to ``coarse_table``."""
    names = ", ".join(["width_s", "bucket", *keys, *columns])
    conflict = f"ON CONFLICT (width_s, {', '.join(keys)}, bucket) DO UPDATE SET " + ", ".join(
        merge.format(c=c) for c, (_, merge) in columns.items())
    return f"""
WITH fine AS MATERIALIZED ({fine}),
f AS (INSERT INTO jobpulse.{fine_table} AS r ({names}) SELECT * FROM fine {conflict})
INSERT INTO jobpulse.{coarse_table} AS r ({names})
SELECT {WIDTH_S}::smallint, date_bin(interval '{WIDTH_S} seconds', bucket, timestamptz 'epoch') AS b, {", ".join(keys)},
       {", ".join(COARSEN[merge].format(c=c) for c, (_, merge) in columns.items())}
  FROM fine GROUP BY b, {", ".join(keys)}
{conflict}
"""


# The leader's GPU fold. Its processes' fold stays `_FOLD_PROCESSES`: over the leader's 5 s of
# rows a process has one 60 s bucket as it has one 300 s bucket, and the statement made that way was
# no cheaper (`python -m bench --only versus_tsdb`, alternated runs).
_FOLD_GPUS_BEHIND = _fine_first(FINE_TABLE, gpu_buckets("{source}", FINE_WIDTH_S), "gpu_rollup",
                                *COLUMNS["gpu_rollup"])


def fold_behind(table: str, source: str) -> tuple[str, ...]:
    """`fold` as the leader runs it over seconds of rows: the GPU buckets in one statement that
    aggregates the samples once, cheaper than two statements."""
    return (_FOLD_GPUS_BEHIND.replace("{source}", source),) if table == "gpu_samples" else fold(table, source)


def fold(table: str, source: str) -> tuple[str, ...]:
    """The roll-up statements of a time-series table (`gpu_samples`, `process_samples`, `events`)
    adding the rows of ``source`` (a table or CTE name with the table's columns)."""
    return tuple(statement.replace("{source}", source) for statement in _FOLD_SQL[table])


# time-series table -> the roll-up statement fed from its staging table
FOLDS = {table: ";\n".join(fold(table, f"pg_temp.{stage_name(table)}")) for table in _FOLD_SQL}


def tune(conn: psycopg.Connection[Any]) -> list[str]:
    """Leave room for in-place updates in every roll-up partition that does not yet (a partitioned
    table cannot carry the setting for its partitions); returns the partitions changed."""
    names = [r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n ON n.oid = p.relnamespace"
        " WHERE n.nspname = 'jobpulse' AND p.relname = ANY(%s)"
        " AND NOT coalesce(c.reloptions, '{}') @> ARRAY[%s]", (list(ROLLUP_TABLES), f"fillfactor={FILLFACTOR}"))]
    for name in names:
        conn.execute(sql.SQL("ALTER TABLE jobpulse.{} SET (fillfactor = {})").format(
            sql.Identifier(name), sql.Literal(FILLFACTOR)))
    conn.commit()
    return names
