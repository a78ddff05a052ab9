"""Store: write batches (ledger, jobs, COPY) and answer the API's job queries through a pool.

Batches that arrive together are written in one transaction (group commit): the ingest ledger
rows first, in one statement (a batch whose ``(cluster, node, agent_instance, seq)`` is already in
the ledger is a no-op, whatever its ``created_at``; an instance already seen under another cluster
or node is refused, so a token bound to one node cannot shadow another node's batches), then job upserts, then one binary COPY per
time-series table and one roll-up fold for the whole group. The fixed cost of a transaction
(round trips, fold, commit with its fsync) is then paid once per group, not once per batch. The column list of each COPY is the wire
struct's field list; the column types come from the catalog, so the wire format and the
migration cannot drift apart silently (a missing column stops ingest with a clear error).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, date
from typing import Any

import msgspec
import psycopg
from psycopg import errors, sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobpulse.collector.errors import Rejected, Unavailable
from jobpulse.collector.store import captures, partitions, rollup
from jobpulse.collector.store.connect import check_dsn, connect, lenient_times
from jobpulse.schema import wire

# table -> (Batch attribute, record struct); the struct's fields are the columns after cluster, node.
COPY_TABLES: dict[str, tuple[str, type[msgspec.Struct]]] = {
    "gpu_samples": ("gpu_samples", wire.GpuSample),
    "process_samples": ("process_samples", wire.ProcessSample),
    "gpu_health_events": ("health_events", wire.HealthEvent),
    "events": ("events", wire.AppEvent),
    "topology": ("topology", wire.TopologyGpu),
    "node_validations": ("validations", wire.NodeValidation),
}

_JOB_COLUMNS = [f for f in wire.JobRecord.__struct_fields__ if f != "gpus"]
_UPSERT_JOB = sql.SQL(
    "INSERT INTO jobpulse.jobs AS j (cluster, {cols}) VALUES (%s, {vals})"
    " ON CONFLICT (cluster, job_id) DO UPDATE SET {sets}, updated_at = EXCLUDED.updated_at"
).format(
    cols=sql.SQL(", ").join(map(sql.Identifier, _JOB_COLUMNS)),
    vals=sql.SQL(", ").join(sql.Placeholder() * len(_JOB_COLUMNS)),
    sets=sql.SQL(", ").join(
        sql.SQL("tags = j.tags || EXCLUDED.tags") if c == "tags"
        else sql.SQL("{c} = coalesce(EXCLUDED.{c}, j.{c})").format(c=sql.Identifier(c))
        for c in _JOB_COLUMNS if c != "job_id"
    ),
)
_UPSERT_JOB_GPU = (
    "INSERT INTO jobpulse.job_gpus AS g (cluster, job_id, node, gpu_uuid, gpu_index, pci_bus_id, share)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (cluster, job_id, node, gpu_uuid) DO UPDATE SET"
    " gpu_index = coalesce(EXCLUDED.gpu_index, g.gpu_index), pci_bus_id = coalesce(EXCLUDED.pci_bus_id, g.pci_bus_id),"
    " share = coalesce(EXCLUDED.share, g.share)"
)
# The ledger is partitioned by created_at, so its primary key cannot stop a replay that carries a
# new created_at: the (instance, seq) lock serializes collectors, and the insert looks in every day.
# An instance's rows all name one cluster and node (a batch naming others is refused), so one row of
# it tells whether a batch claims another node's instance. (Locks in key order: two groups holding
# some of the same batches cannot deadlock.) The arrays go
# as binary parameters: a text array would pass every element through psycopg's quoting regex.
_LOCK_BATCHES = (
    "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended(i, s) AS k"
    " FROM unnest(%b::text[], %b::bigint[]) AS u(i, s) ORDER BY k) AS keys"
)
_INSERT_LEDGER = (
    "WITH b AS MATERIALIZED (SELECT * FROM unnest(%b::text[], %b::bigint[], %b::timestamptz[], %b::text[], %b::text[],"
    "                                            %b::text[], %b::text[], %b::text[]) AS b(i, s, c, cl, n, v, r, d)),"
    " claimed AS (SELECT DISTINCT b.i FROM b, LATERAL (SELECT l.cluster, l.node FROM jobpulse.ingest_batches l"
    "             WHERE l.agent_instance = b.i LIMIT 1) o WHERE o.cluster <> b.cl OR o.node <> b.n),"
    " stored AS (INSERT INTO jobpulse.ingest_batches"
    "  (agent_instance, seq, created_at, cluster, node, agent_version, rows, dropped)"
    "  SELECT b.i, b.s, b.c, b.cl, b.n, b.v, b.r::jsonb, b.d::jsonb FROM b"
    "  WHERE b.i NOT IN (SELECT i FROM claimed) AND NOT EXISTS (SELECT 1 FROM jobpulse.ingest_batches l"
    "        WHERE l.agent_instance = b.i AND l.seq = b.s AND l.cluster = b.cl AND l.node = b.n)"
    "  RETURNING agent_instance, seq)"
    " SELECT agent_instance, seq FROM stored UNION ALL SELECT i, -1 FROM claimed"
)
_json = msgspec.json.Encoder()
_SCHEMA_HINT = "the database schema is missing or older than this collector: run `jobpulse db upgrade`"


def _ensure_tuned(conn: psycopg.Connection[Any], days: list[date]) -> None:
    if partitions.ensure(conn, days):
        rollup.tune(conn)


@dataclass(frozen=True)
class ValidBatch:
    """A batch validation accepted (`ingest.validate`), ready to store."""

    batch: wire.Batch
    days: frozenset[date]
    """UTC days the batch writes to (time-series partitions it needs)."""


@dataclass(frozen=True)
class StoreResult:
    duplicate: bool
    rows: dict[str, int]
    claimed: bool = False
    """The batch's agent instance was seen under another cluster or node: refused, nothing stored."""


def _nonzero(counts: dict[str, int]) -> str:
    """A ledger count as stored: only what is not zero (a key it lacks reads as none). A batch a second
    per node makes the ledger a large table, and most of a row's counts are zeros."""
    return _json.encode({k: v for k, v in counts.items() if v}).decode()


def _rows(b: wire.Batch) -> dict[str, int]:
    """Rows per table a batch carries (recorded in the ledger and answered to the agent)."""
    rows = {table: len(getattr(b, attr)) for table, (attr, _) in COPY_TABLES.items()}
    rows["jobs"] = len(b.jobs)
    return rows


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    lenient_times(conn.adapters)


class Storage:
    """PostgreSQL access for the collector through an async connection pool."""

    def __init__(self, dsn: str, *, pool_min: int = 1, pool_max: int = 4, wait_s: float = 2.0) -> None:
        self.dsn = dsn
        self.pool = AsyncConnectionPool(
            check_dsn(dsn), min_size=pool_min, max_size=pool_max, timeout=wait_s, open=False,
            reconnect_timeout=60, kwargs={"autocommit": True, "connect_timeout": 5}, name="jobpulse",
            configure=_configure, check=AsyncConnectionPool.check_connection,
        )
        self._copy: dict[str, tuple[sql.Composed, list[str]]] = {}
        self._staged: set[int] = set()  # backend PIDs whose session has the staging table
        self._days: set[date] = set()

    async def open(self) -> None:
        """Start the pool without waiting: the service runs (and answers 503) while the DB is down."""
        await self.pool.open(wait=False)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        try:
            async with self.pool.connection() as conn:
                yield conn
        except PoolTimeout:
            raise Unavailable("no database connection available") from None
        except psycopg.OperationalError as exc:
            raise Unavailable(f"database error: {exc}") from None
        except (errors.UndefinedTable, errors.UndefinedColumn):
            self._copy.clear()
            self._staged.clear()
            raise Unavailable(_SCHEMA_HINT) from None

    async def _prepare(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Load COPY statements and column types from the catalog, once."""
        if self._copy:
            return
        cur = await conn.execute(
            "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod)"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'jobpulse' AND c.relname = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped",
            ([*COPY_TABLES, *rollup.ROLLUP_TABLES],),
        )
        types: dict[str, dict[str, str]] = {}
        for table, column, typ in await cur.fetchall():
            types.setdefault(table, {})[column] = typ
        for table in rollup.ROLLUP_TABLES:
            if table not in types:
                raise Unavailable(f"{_SCHEMA_HINT} (jobpulse.{table} is missing)")
        prepared = {}
        for table, (_, struct) in COPY_TABLES.items():
            columns = ["cluster", "node", *struct.__struct_fields__]
            missing = [c for c in columns if c not in types.get(table, {})]
            if missing:
                raise Unavailable(f"{_SCHEMA_HINT} (jobpulse.{table} lacks {', '.join(missing)})")
            # Samples land in a staging table first: from there they are moved and rolled up.
            target = sql.SQL("pg_temp.{}").format(sql.Identifier(rollup.stage_name(table))) \
                if table in rollup.FOLDS else sql.SQL("jobpulse.{}").format(sql.Identifier(table))
            stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
                target, sql.SQL(", ").join(map(sql.Identifier, columns)))
            prepared[table] = (stmt, [types[table][c] for c in columns])
        self._days = await asyncio.to_thread(self._sync, partitions.common_days)
        self._copy = prepared

    def _sync(self, fn: Any, *args: Any) -> Any:
        """Run a partition-maintenance function on a short-lived synchronous connection."""
        with connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            return fn(conn, *args)

    async def _ensure_days(self, days: set[date]) -> None:
        missing = days - self._days
        if missing:
            try:
                await asyncio.to_thread(self._sync, _ensure_tuned, sorted(missing))
            except psycopg.OperationalError as exc:
                raise Unavailable(f"database error: {exc}") from None
            self._days |= missing

    async def store(self, group: list[ValidBatch]) -> list[StoreResult]:
        """Write a group of batches in one transaction: one ledger insert, one COPY per table, one
        roll-up fold, one commit. Returns after COMMIT (the agents may then forget them), one result
        per batch in order. A data error rejects the whole group (the caller retries its members
        one by one, so only the bad batch gets the error)."""
        results = [StoreResult(duplicate=False, rows=_rows(v.batch)) for v in group]
        first: dict[tuple[str, str, str, int], int] = {}
        for i, v in enumerate(group):  # the same batch twice in a group: stored once
            a = v.batch.agent
            first.setdefault((a.cluster, a.node, a.instance, v.batch.seq), i)
        async with self._connection() as conn:
            await self._prepare(conn)
            await self._ensure_days({d for v in group for d in v.days}
                                    | {v.batch.created_at.astimezone(UTC).date() for v in group})
            if conn.info.backend_pid not in self._staged:  # outside the batch: a rollback keeps them
                for table in rollup.FOLDS:
                    await conn.execute(rollup.create_stage(table))
                self._staged.add(conn.info.backend_pid)
            try:
                async with conn.transaction():
                    new, claimed = await self._insert_ledger(conn, [group[i].batch for i in first.values()],
                                                             [results[i].rows for i in first.values()])
                    stored = []
                    for i, v in enumerate(group):
                        a = v.batch.agent
                        key = (a.cluster, a.node, a.instance, v.batch.seq)
                        fresh = first[key] == i and key[2:] in new
                        results[i] = StoreResult(duplicate=not fresh and a.instance not in claimed,
                                                 rows=results[i].rows, claimed=a.instance in claimed)
                        if fresh:
                            stored.append(v.batch)
                    if any(b.jobs for b in stored):
                        await self._upsert_jobs(conn, stored)
                    await self._copy_records(conn, stored)
            except errors.CheckViolation as exc:
                if "no partition" in str(exc):  # dropped by another collector's maintenance
                    self._days.clear()
                    self._copy.clear()
                    raise Unavailable("time partition missing; retry") from None
                raise Rejected(422, f"rejected by the database: {exc.diag.message_primary}") from None
            except (errors.DataError, errors.IntegrityError, errors.ProgramLimitExceeded) as exc:
                raise Rejected(422, f"rejected by the database: {exc.diag.message_primary}") from None
        return results

    async def _insert_ledger(self, conn: psycopg.AsyncConnection[Any], batches: list[wire.Batch],
                             rows: list[dict[str, int]]) -> tuple[set[tuple[str, int]], set[str]]:
        """Ledger rows for the batches not stored before; returns their (instance, seq), and the
        instances refused because the ledger holds them under another cluster or node."""
        instances = [b.agent.instance for b in batches]
        seqs = [b.seq for b in batches]
        await conn.execute(_LOCK_BATCHES, (instances, seqs))
        cur = await conn.execute(_INSERT_LEDGER, (
            instances, seqs, [b.created_at for b in batches], [b.agent.cluster for b in batches],
            [b.agent.node for b in batches], [b.agent.version for b in batches],
            [_nonzero(r) for r in rows], [_nonzero(msgspec.structs.asdict(b.dropped)) for b in batches]))
        found = await cur.fetchall()
        return {(i, seq) for i, seq in found if seq >= 0}, {i for i, seq in found if seq < 0}

    async def _upsert_jobs(self, conn: psycopg.AsyncConnection[Any], batches: list[wire.Batch]) -> None:
        """Jobs and their GPUs in key order (two collectors' groups cannot deadlock on them); a job's
        records keep their arrival order (a later record's state wins)."""
        job_params: list[tuple[Any, ...]] = []
        gpu_params: list[tuple[Any, ...]] = []
        for b in batches:
            cluster, node = b.agent.cluster, b.agent.node
            for job in b.jobs:
                values = [getattr(job, c) for c in _JOB_COLUMNS]
                values[_JOB_COLUMNS.index("tags")] = Jsonb(job.tags)
                job_params.append((cluster, *values))
                gpu_params.extend((cluster, job.job_id, node, g.gpu_uuid, g.gpu_index, g.pci_bus_id, g.share)
                                  for g in job.gpus)
        async with conn.cursor() as cur:
            jobs_in_order: list[tuple[Any, ...]] = sorted(job_params, key=lambda p: p[:2])
            await cur.executemany(_UPSERT_JOB, jobs_in_order)
            if gpu_params:
                gpus_in_order: list[tuple[Any, ...]] = sorted(gpu_params, key=lambda p: p[:4])
                await cur.executemany(_UPSERT_JOB_GPU, gpus_in_order)

    async def _copy_records(self, conn: psycopg.AsyncConnection[Any], batches: list[wire.Batch]) -> None:
        astuple = msgspec.structs.astuple
        async with conn.cursor() as cur:
            for table, (attr, _) in COPY_TABLES.items():
                parts = [(b, records) for b in batches if (records := getattr(b, attr))]
                if not parts:
                    continue
                stmt, types = self._copy[table]
                async with cur.copy(stmt) as copy:
                    copy.set_types(types)
                    for b, records in parts:
                        prefix = (b.agent.cluster, b.agent.node)
                        for rec in records:
                            await copy.write_row(prefix + astuple(rec))
                if table in rollup.FOLDS:
                    await cur.execute(rollup.move(table))
                    await cur.execute(rollup.FOLDS[table])

    async def capture_nodes(self) -> set[tuple[str, str]]:
        """(cluster, node) pairs with captures waiting to be handed to their agent."""
        async with self._connection() as conn:
            cur = await conn.execute(captures.WAITING)
            return {(r[0], r[1]) for r in await cur.fetchall()}

    async def exchange_captures(self, cluster: str, node: str, answers: list[wire.CaptureResult],
                                ask: bool) -> list[wire.Capture]:
        """The agent's answers recorded (only for captures sent to its node) and, when ``ask``, the
        node's pending captures handed to it, in one transaction."""
        async with self._connection() as conn, conn.transaction():
            for answer in answers:
                await conn.execute(captures.RECORD, captures.record_params(cluster, node, answer))
            if not ask:
                return []
            cur = await conn.execute(captures.HAND_OUT, (cluster, node))
            return [wire.Capture(id=r[0], job_id=r[1], pids=list(r[2]), seconds=float(r[3]), kind=r[4], steps=r[5],
                                 max_bytes=r[6]) for r in await cur.fetchall()]

    async def trace(self, capture_id: int) -> dict[str, Any] | None:
        """A trace capture: its cluster and job, the job owner's uid, and the trace (None once dropped)."""
        async with self._connection() as conn:
            cur = await conn.execute(captures.TRACE_OF, (capture_id,))
            row = await cur.fetchone()
            if row is None:
                return None
            cur = await conn.execute("SELECT uid FROM jobpulse.jobs WHERE cluster = %s AND job_id = %s",
                                     (row[0], row[1]))
            owner = await cur.fetchone()
        return {"cluster": row[0], "job_id": row[1], "trace": None if row[2] is None else bytes(row[2]),
                "uid": owner[0] if owner else None}

    async def ping(self) -> bool:
        try:
            async with self.pool.connection(timeout=1.0) as conn:
                await conn.execute("SELECT 1")
            return True
        except (PoolTimeout, psycopg.Error):
            return False

    async def jobs(self, *, cluster: str | None, user: str | None, running: bool | None,
                   limit: int) -> list[dict[str, Any]]:
        where = [sql.SQL("true")]
        params: list[Any] = []
        if cluster is not None:
            where.append(sql.SQL("cluster = %s"))
            params.append(cluster)
        if user is not None:
            where.append(sql.SQL("user_name = %s"))
            params.append(user)
        if running is not None:
            where.append(sql.SQL("end_time IS NULL") if running else sql.SQL("end_time IS NOT NULL"))
        query = sql.SQL("SELECT * FROM jobpulse.jobs WHERE {} ORDER BY start_time DESC NULLS LAST,"
                        " first_seen DESC LIMIT %s").format(sql.SQL(" AND ").join(where))
        async with self._connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(query, (*params, limit))
            return await cur.fetchall()

    async def job(self, job_id: str, cluster: str | None) -> list[dict[str, Any]]:
        """The job (with its GPUs, flags and, once it ended and was judged, its summary) in each cluster
        that has this id."""
        async with self._connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT * FROM jobpulse.jobs WHERE job_id = %s AND (%s::text IS NULL OR cluster = %s)",
                (job_id, cluster, cluster))
            found = await cur.fetchall()
            for job in found:
                await cur.execute(
                    "SELECT node, gpu_uuid, gpu_index, pci_bus_id FROM jobpulse.job_gpus"
                    " WHERE cluster = %s AND job_id = %s ORDER BY node, gpu_index", (job["cluster"], job_id))
                job["gpus"] = await cur.fetchall()
                await cur.execute(
                    "SELECT rule_id, severity, category, scope, scope_key, started_at, ended_at, evidence, advice"
                    " FROM jobpulse.job_flags WHERE cluster = %s AND job_id = %s ORDER BY started_at",
                    (job["cluster"], job_id))
                job["flags"] = await cur.fetchall()
                await cur.execute("SELECT summary FROM jobpulse.job_summaries WHERE cluster = %s AND job_id = %s",
                                  (job["cluster"], job_id))
                row = await cur.fetchone()
                job["summary"] = row["summary"] if row else None  # written once its end is judged
            return found
