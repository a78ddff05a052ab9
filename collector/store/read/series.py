"""Store: `gpu_series`, the function Grafana panels and reports read GPU metrics through, generated
from the field table (every field with a ``series`` column) and re-created by `jobpulse db upgrade`
whenever the table changes (the ledger of objects, `objects`, records its definition).

One job's GPU metrics over [from, to] in steps of step_s seconds come from the coarsest source
that still draws the step, within what stays fast for the range: samples for steps under 5 s over
at most 1 h (raw and compact alike, through `gpu_samples_between`; at steps <= 1 s each at its own
time, a GPU's samples of one instant averaged, binned above: one reading of the samples for both,
as each inlined reader costs ~25 ms of planning even where the range prunes it), 10 s roll-ups
for steps under 150 s over at most 12 h, 300 s roll-ups otherwise, and at steps of 1,800 s or
more the coarse buckets where compaction made them (`gpu_rollup_between`). A source is taken once
the step is half its width: a bin then holds one or two of its rows, and a step of 6 s over 64
GPUs reads 5,760 rows of 10 s instead of 57,600 samples. ``source`` says which answered. A plain
SQL function, so the planner inlines it: the range test is a constant that prunes a branch, and a
caller's WHERE (node, GPU) reaches the scan. Rows come unordered: a sort inside made PostgreSQL
aggregate by sorting and spill to disk instead of hashing, so callers ORDER BY.
"""

from __future__ import annotations

import psycopg

from jobpulse.collector.store.migrate import objects
from jobpulse.collector.store.tiers import coarse, compact, pyramid
from jobpulse.schema.fields import GPU_FIELDS, Field

SIGNATURE = "jobpulse.gpu_series(text, text, timestamptz, timestamptz, integer)"


def _sum_column(f: Field) -> str | None:
    return next((c for c, agg in f.rollup.items() if agg == "sum"), None)


def _max_column(f: Field) -> str:
    return next(c for c, agg in f.rollup.items() if agg == "max")


def _parts(f: Field) -> tuple[str, str, str]:
    """(result type, binned raw, roll-up) expressions of one series column."""
    total = _sum_column(f)
    if total is None:  # a limit or capacity: the largest value in the step, in its own type
        return f.sql, f"max(s.{f.name})", f"max(r.{_max_column(f)})"
    count = "n_gpm" if f.gpm else "n"
    return "float8", f"avg(s.{f.name}::float8)", f"sum(r.{total}) / nullif(sum(r.{count}), 0)"


def gpu_series_sql() -> str:
    cols = [(f.series, *_parts(f)) for f in GPU_FIELDS if f.series]
    returns = ", ".join(f"{name} {typ}" for name, typ, *_ in cols)
    binned = ", ".join(c[2] for c in cols)
    rolled = ", ".join(c[3] for c in cols)
    return f"""
CREATE FUNCTION jobpulse.gpu_series(p_cluster text, p_job text, p_from timestamptz, p_to timestamptz,
                                    p_step_s integer DEFAULT 0)
RETURNS TABLE ("time" timestamptz, node text, gpu_uuid text, gpu_index smallint, {returns}, source text)
LANGUAGE sql STABLE AS $$
SELECT CASE WHEN p_step_s <= 1 THEN s.ts ELSE date_bin(make_interval(secs => p_step_s), s.ts, timestamptz 'epoch')
       END, s.node, s.gpu_uuid, min(s.gpu_index), {binned}, 'gpu_samples'::text
  FROM jobpulse.gpu_samples_between(p_from, p_to) s
 WHERE p_to - p_from <= interval '1 hour' AND p_step_s < 5
   AND s.job_id = p_job AND s.cluster = p_cluster
 GROUP BY 1, 2, 3
UNION ALL
SELECT date_bin(make_interval(secs => greatest(p_step_s, r.width_s)), r.bucket, timestamptz 'epoch'), r.node,
       r.gpu_uuid, min(r.gpu_index), {rolled}, 'gpu_rollup ' || min(r.width_s) || ' s'
  FROM jobpulse.gpu_rollup_between(p_cluster, p_job, p_from, p_to,
                                    CASE WHEN p_to - p_from <= interval '12 hours' AND p_step_s < 150 THEN 10
                                         ELSE 300 END,
                                    p_step_s >= {coarse.COARSE_S}) r
 WHERE p_to - p_from > interval '1 hour' OR p_step_s >= 5
 GROUP BY 1, 2, 3
$$"""


def ensure(conn: psycopg.Connection) -> bool:
    """Bring the compact tier's columns and readers, the pyramid's counter columns, then
    `gpu_series`, in line with the field table; True if anything changed."""
    changed = compact.ensure(conn)
    changed = coarse.ensure(conn) or changed
    changed = pyramid.ensure(conn) or changed
    body = gpu_series_sql()
    if objects.current(conn, "gpu_series", body):
        return changed
    conn.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    conn.execute(body.encode())
    conn.execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO PUBLIC".encode())
    objects.record(conn, "gpu_series", body)
    return True
