"""`jobpulse db upgrade --citus`: spread the schema over a Citus cluster (run on the coordinator).

Which table goes where (`PLACEMENT`), chosen for the queries we run:

- by ``job_id``, co-located with ``jobs``: every table whose rows always name a job (the job, its
  GPUs, its flags, its GPU, process and step roll-ups), so one job's rows of these tables share a
  shard: per-job reads (series over roll-ups, reports) and the rules' per-job statistics touch one
  worker, and the dashboards' joins of roll-ups with jobs and flags run on the shards whole. The
  GPU roll-up's rows of GPUs no job holds (job ``''``) share one shard;
- by ``node``, co-located with each other: the raw tables, which also hold rows with no job
  (samples of unallocated GPUs, node-level events and health events) and node flags. Citus refuses a
  NULL distribution value and a generated distribution column; the node spreads these rows evenly,
  each agent's batch lands on one shard, and a per-job read of raw rows runs on every shard at once;
- reference tables (a copy on every worker) for the small shared data: topology, node validations;
- `LOCAL` tables stay on the coordinator: the ingest ledger (one row per batch, and its folded runs; its insert skips
  replays with a correlated subquery over the batches' arrays, which Citus cannot distribute, and
  every batch passes through the coordinator anyway), the migration ledger and the leader's task
  schedule (only the leader uses it; its claim's ``ON CONFLICT`` compares with ``now()``, which
  Citus refuses on distributed and reference tables).

Upserts on distributed tables take new values from ``EXCLUDED`` (Citus refuses ``now()`` in
``DO UPDATE SET``): the inserted row's ``now()`` is the same transaction time.

Distributing is idempotent (tables already distributed are left alone) and runs after the
migrations; later migrations' DDL on distributed tables is propagated by Citus itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import psycopg
from psycopg import sql

from jobpulse.collector.store.read import series
from jobpulse.collector.store.tiers import coarse, compact, rollup

# Shards a distributed table group gets per active worker unless told otherwise. Every group of
# batches writes each table's rows shard by shard (one statement per shard touched), so the
# coordinator's and workers' CPU per GPU sample grows with the shards a group reaches (the Citus part
# of `python -m bench --only versus_tsdb` shows it). Per-job reads go to one shard whatever the
# count; cluster-wide reads run one task per shard, so four per worker keep four of a worker's cores
# busy.
SHARDS_PER_WORKER = 4


@dataclass(frozen=True)
class Placement:
    """Where one table of schema jobpulse goes on a Citus cluster."""

    table: str
    column: str | None  # None: a reference table
    colocate_with: str | None = None  # the group's first table (None: starts a group)


_WITH_JOBS = ("job_gpus", "job_flags", "job_summaries", "process_rollup", "step_rollup", "gpu_rollup", "gpu_rollup_10s",
              "node_job_rollup", "job_bucket_rollup", "job_runs", "job_states")
_WITH_SAMPLES = ("process_samples", "gpu_health_events", "events", "gpu_samples_compact", "process_samples_compact",
                 "rank_bins_compact", "node_flags", "node_rollup", "fabric_samples",
                 "partition_queue")
PLACEMENT: tuple[Placement, ...] = (
    Placement("topology", None), Placement("node_validations", None), Placement("jobs", "job_id"),
    *(Placement(table, "job_id", "jobs") for table in _WITH_JOBS),
    Placement("gpu_samples", "node"),
    *(Placement(table, "node", "gpu_samples") for table in _WITH_SAMPLES),
)

LOCAL = ("ingest_batches", "ingest_ranges", "schema_migrations", "schema_objects", "leader_tasks",
         "pyramid_progress", "pyramid_late", "notifications", "policy_actions", "flag_captures", "fold_mark")  # stay plain tables on the coordinator


class CitusMissing(ValueError):
    """`--citus` on a database without the citus extension."""


INSTALLED = "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"


def available(conn: psycopg.Connection) -> bool:
    """Whether the citus extension is installed in this database."""
    row = conn.execute(INSTALLED).fetchone()
    return bool(row and row[0])


def require(conn: psycopg.Connection) -> None:
    """CitusMissing unless the citus extension is installed (checked before anything is changed)."""
    if not available(conn):
        raise CitusMissing("--citus: the citus extension is not installed in this database: CREATE EXTENSION citus"
                           " on the coordinator and every worker and add the workers (citus_add_node) first")


def placed(conn: psycopg.Connection) -> dict[str, str | None]:
    """Tables of schema jobpulse Citus knows: name -> distribution column (None: reference table)."""
    rows = conn.execute(
        "SELECT c.relname, CASE WHEN p.partmethod = 'n' THEN NULL ELSE column_to_column_name(p.logicalrelid,"
        " p.partkey) END FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'jobpulse'").fetchall()
    return {r[0]: r[1] for r in rows}


def default_shard_count(conn: psycopg.Connection) -> int:
    """`SHARDS_PER_WORKER` for every active worker (at least one worker's worth)."""
    row = conn.execute("SELECT count(*) FROM citus_get_active_worker_nodes()").fetchone()
    return SHARDS_PER_WORKER * max(1, int(row[0]) if row else 1)


def distribute(conn: psycopg.Connection, shard_count: int | None = None) -> list[str]:
    """Make every table of `PLACEMENT` a reference or distributed table, as placed (``shard_count``
    shards per table group, `default_shard_count` when None); returns those changed now. The
    connection must be in autocommit mode (Citus copies existing rows to shards in transactions of
    their own)."""
    require(conn)
    if shard_count is None:
        shard_count = default_shard_count(conn)
    if shard_count < 1:
        raise ValueError(f"shard count must be positive, got {shard_count}")
    done = placed(conn)
    for p in PLACEMENT:
        if p.table in done and done[p.table] != p.column:
            raise ValueError(f"jobpulse.{p.table} is distributed by {done[p.table]!r}, jobpulse places it by "
                             f"{p.column!r}: undistribute it first (undistribute_table)")
    todo = [p for p in PLACEMENT if p.table not in done]
    if not todo:
        return []
    compact.drop_readers(conn)
    table = sql.Literal
    for p in todo:
        name = f"jobpulse.{p.table}"
        if p.column is None:
            conn.execute(sql.SQL("SELECT create_reference_table({})").format(table(name)))
        elif p.colocate_with is None:
            conn.execute(sql.SQL("SELECT create_distributed_table({}, {}, shard_count => {})").format(
                table(name), table(p.column), table(shard_count)))
        else:
            conn.execute(sql.SQL("SELECT create_distributed_table({}, {}, colocate_with => {})").format(
                table(name), table(p.column), table(f"jobpulse.{p.colocate_with}")))
    ensure_readers(conn)
    return [p.table for p in todo]


# Functions that queries pushed down to the workers call (the codecs unpack compact rows there; the
# attrs readers are in the job_steps view): they must exist on every worker.
WORKER_FUNCTIONS = ("jobpulse.float4_bits(real)", "jobpulse.float4_from_bits(bigint)",
                    "jobpulse.attr_number(jsonb,text)", "jobpulse.attr_bigint(jsonb,text)")


# Functions that read distributed tables. As SQL functions PostgreSQL inlines them on one server;
# Citus plans a query before that and refuses an SQL function's parameterized query over distributed
# tables, so on a coordinator they are PL/pgSQL: each arm of the UNION ALL is its own RETURN QUERY,
# planned with the arguments' values (the arms a range does not use return nothing at once) and
# routed by Citus on its own (one arm reading a coordinator-only function, another a shard, cannot
# be shipped together). A caller's WHERE no longer reaches inside.
READERS = ("jobpulse.gpu_samples_between(timestamptz,timestamptz)",
           "jobpulse.process_samples_between(timestamptz,timestamptz)", series.SIGNATURE,
           "jobpulse.rank_series(text,text,timestamptz,timestamptz,integer)",
           "jobpulse.rank_bins_between(text,text,timestamptz,timestamptz)",
           "jobpulse.step_series(text,text,timestamptz,timestamptz,integer)",
           *(f"jobpulse.{table}_between(text,text,timestamptz,timestamptz,integer,boolean)"
             for table in ("gpu_rollup", "process_rollup")))
_SQL_BODY = re.compile(r"^(.*\n LANGUAGE )sql(\n.*AS \$function\$)(.*?)(\$function\$\s*)$", re.S)
_ARMS = re.compile(r"^UNION ALL$", re.M)


def as_plpgsql(definition: str) -> str:
    """A ``pg_get_functiondef`` of an SQL function whose body is one query, its top-level UNION ALL
    on lines of their own, as the same function in PL/pgSQL."""
    m = _SQL_BODY.match(definition)
    if not m:
        raise ValueError(f"not a one-query SQL function: {definition[:200]}")
    arms = [arm.strip().rstrip(";") for arm in _ARMS.split(m.group(3).strip())]
    body = "".join(f"RETURN QUERY\n{arm};\n" for arm in arms)
    return f"{m.group(1)}plpgsql{m.group(2)}\n#variable_conflict use_column\nBEGIN\n{body}END\n{m.group(4)}"


def ensure_readers(conn: psycopg.Connection) -> None:
    """`series.ensure` on a Citus coordinator: the series functions, the compact tier's readers and
    views are made on the coordinator only (they run there, their queries reach the shards; Citus
    cannot propagate a function that returns a distributed table's rows), the `READERS` in PL/pgSQL;
    then the functions pushed down to the workers are distributed."""
    with conn.transaction():
        conn.execute("SET LOCAL citus.enable_ddl_propagation TO off")
        series.ensure(conn)
        for table in rollup.COLUMNS:
            conn.execute(coarse.fine_reader_sql(table).encode())
        for fn in READERS:
            row = conn.execute("SELECT l.lanname, pg_get_functiondef(p.oid) FROM pg_proc p"
                               " JOIN pg_language l ON l.oid = p.prolang WHERE p.oid = %s::regprocedure",
                               (fn,)).fetchone()
            if row and row[0] == "sql":
                conn.execute(as_plpgsql(row[1]).encode())
        conn.execute("SET LOCAL citus.enable_ddl_propagation TO on")
        for fn in WORKER_FUNCTIONS:
            conn.execute("SELECT create_distributed_function(%s)", (fn,))
        # A slice's name (gpu_name) runs inside queries pushed to the shards and reads the topology
        # there: a reference table, replicated to every worker and read locally, which is what
        # nesting allows safely.
        conn.execute("ALTER FUNCTION jobpulse.mig_slice_name(text,text,text)"
                     " SET citus.allow_nested_distributed_execution TO on")
