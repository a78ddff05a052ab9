"""Store: write batches (ledger, jobs, samples, roll-ups) and answer the API's job queries through a pool.

Batches that arrive together are written in one transaction (group commit). Its first round trip
(pipeline mode, BEGIN included) takes the roll-up mark's lock and the batches' advisory locks and
runs the ledger's statement, which inserts the ingest ledger rows and says which batches are new (a
batch whose ``(cluster, node, agent_instance, seq)`` is already in the ledger, or in a run of its
folded days, is a no-op whatever its ``created_at``; an instance already seen under another cluster
or node is refused, so a token bound to one node cannot shadow another node's batches). The rows of
the new batches are then copied in binary straight into the time-series tables; rows that the leader
will not fold (step events, samples older than its mark: `fold.py`) go through the connection's
staging table instead, to be moved and folded into the roll-ups in the last round trip, which also
commits (`Storage._write`, `Storage._copy`). The column lists are the wire structs' field lists,
checked against the catalog once, so the wire format and the migration cannot drift apart silently:
a missing column stops ingest with a clear error. The fixed cost of a transaction (round trips,
statement start-up, commit with its fsync) is paid once per group, not once per batch or per table.
Job records (rare: a job's start and end) are upserted in the same transaction; a group holding GPU
samples older than `pyramid.LATE` marks their hours for the cluster pyramid's next run in it too.
One server and Citus take the same path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import msgspec
import psycopg
from psycopg import errors, sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobpulse.collector.errors import Rejected, Unavailable
from jobpulse.collector.store.connect import check_dsn, connect, lenient_times
from jobpulse.collector.store.migrate import citus
from jobpulse.collector.store.state import captures, runs
from jobpulse.collector.store.tiers import fold, partitions, pyramid, rollup
from jobpulse.schema import wire

# table -> (Batch attribute, record struct); the struct's fields are the columns after cluster, node.
BATCH_TABLES: dict[str, tuple[str, type[msgspec.Struct]]] = {
    "gpu_samples": ("gpu_samples", wire.GpuSample),
    "process_samples": ("process_samples", wire.ProcessSample),
    "fabric_samples": ("fabric_samples", wire.FabricSample),
    "gpu_health_events": ("health_events", wire.HealthEvent),
    "events": ("events", wire.AppEvent),
    "topology": ("topology", wire.TopologyGpu),
    "node_validations": ("validations", wire.NodeValidation),
    "partition_queue": ("queue", wire.PartitionQueue),
}

_JOB_COLUMNS = [f for f in wire.JobRecord.__struct_fields__ if f != "gpus"]
_UPSERT_JOB = sql.SQL(
    "INSERT INTO jobpulse.jobs AS j (cluster, {cols}) VALUES (%s, {vals})"
    " ON CONFLICT (cluster, job_id) DO UPDATE SET {sets}, updated_at = EXCLUDED.updated_at"
).format(
    cols=sql.SQL(", ").join(map(sql.Identifier, _JOB_COLUMNS)),
    vals=sql.SQL(", ").join(sql.Placeholder() * len(_JOB_COLUMNS)),
    sets=sql.SQL(", ").join([
        *(sql.SQL("tags = j.tags || EXCLUDED.tags") if c == "tags"
          else sql.SQL("run = greatest(EXCLUDED.run, j.run)") if c == "run"
          # a later run's facts replace the row's whole; an earlier run's go to job_runs (`runs`)
          else sql.SQL("{c} = CASE WHEN {newer} THEN EXCLUDED.{c} WHEN {earlier} THEN j.{c}"
                       " ELSE coalesce(EXCLUDED.{c}, j.{c}) END").format(
              c=sql.Identifier(c), newer=sql.SQL(runs.NEWER), earlier=sql.SQL(runs.EARLIER)) if c in runs.RUN_SCOPED
          else sql.SQL("{c} = coalesce(EXCLUDED.{c}, j.{c})").format(c=sql.Identifier(c))
          for c in _JOB_COLUMNS if c != "job_id"),
        sql.SQL("rules_final_at = CASE WHEN {newer} THEN NULL ELSE j.rules_final_at END").format(
            newer=sql.SQL(runs.NEWER)),
    ]),
)
_UPSERT_JOB_GPU = (
    "INSERT INTO jobpulse.job_gpus AS g (cluster, job_id, node, gpu_uuid, gpu_index, pci_bus_id, share)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (cluster, job_id, node, gpu_uuid) DO UPDATE SET"
    " gpu_index = coalesce(EXCLUDED.gpu_index, g.gpu_index), pci_bus_id = coalesce(EXCLUDED.pci_bus_id, g.pci_bus_id),"
    " share = coalesce(EXCLUDED.share, g.share)"
)
_JOBS_KNOWN = (
    "SELECT j.job_id, nullif(j.nodes, '{}'), j.run, j.end_time IS NOT NULL,"
    " EXISTS (SELECT 1 FROM jobpulse.job_gpus g WHERE g.cluster = j.cluster AND g.job_id = j.job_id AND g.node = %s) FROM jobpulse.jobs j WHERE j.cluster = %s AND j.job_id = ANY(%s)"
)
# The ledger is partitioned by created_at, so its primary key cannot stop a replay that carries a
# new created_at: the (instance, seq) lock serializes collectors, and the insert looks in every day
# (each look a LATERAL ... LIMIT 1, an index probe per partition whatever the plan: a generic plan
# of NOT EXISTS is a hash anti-join that reads the whole ledger) and in the folded runs (`ledger`:
# the run that starts at or before the seq, one index probe).
# An instance's rows all name one cluster and node (a batch naming others is refused), so one row of
# it tells whether a batch claims another node's instance. (Locks in key order: two groups holding
# some of the same batches cannot deadlock.) The arrays go
# as binary parameters: a text array would pass every element through psycopg's quoting regex.
_LOCK_BATCHES = (
    "SELECT pg_advisory_xact_lock(k) FROM (SELECT DISTINCT hashtextextended(i, s) AS k"
    " FROM unnest(%b::text[], %b::bigint[]) AS u(i, s) ORDER BY k) AS keys"
)
_LEDGER = (
    "WITH b AS MATERIALIZED (SELECT * FROM unnest(%b::text[], %b::bigint[], %b::timestamptz[], %b::text[], %b::text[],"
    "                                        %b::text[], %b::text[], %b::text[])"
    "                   AS b(i, s, c, cl, n, v, r, d)),"
    " claimed AS (SELECT DISTINCT b.i FROM b, LATERAL ((SELECT l.cluster, l.node FROM jobpulse.ingest_batches l"
    "             WHERE l.agent_instance = b.i LIMIT 1) UNION ALL (SELECT g.cluster, g.node FROM jobpulse.ingest_ranges g"
    "             WHERE g.agent_instance = b.i LIMIT 1) LIMIT 1) o WHERE o.cluster <> b.cl OR o.node <> b.n),"
    " stored AS (INSERT INTO jobpulse.ingest_batches"
    "  (agent_instance, seq, created_at, cluster, node, agent_version, rows, dropped)"
    "  SELECT b.i, b.s, b.c, b.cl, b.n, b.v, b.r::jsonb, b.d::jsonb FROM b"
    "  LEFT JOIN LATERAL (SELECT true AS hit FROM jobpulse.ingest_batches l"
    "        WHERE l.agent_instance = b.i AND l.seq = b.s AND l.cluster = b.cl AND l.node = b.n LIMIT 1) seen ON true"
    "  WHERE b.i NOT IN (SELECT i FROM claimed) AND seen.hit IS NULL"
    "    AND NOT coalesce((SELECT g.last_seq >= b.s FROM jobpulse.ingest_ranges g"
    "                      WHERE g.agent_instance = b.i AND g.first_seq <= b.s ORDER BY g.first_seq DESC LIMIT 1), false)"
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
    oldest: datetime
    """Its oldest time (created_at or a record's): a batch older than `pyramid.LATE` marks its hours."""

    @classmethod
    def spanning(cls, batch: wire.Batch, oldest: datetime, newest: datetime) -> ValidBatch:
        return cls(batch, frozenset(partitions.days_spanning(oldest, newest)), oldest)


@dataclass(frozen=True)
class StoreResult:
    duplicate: bool
    rows: dict[str, int]
    claimed: bool = False
    """The batch's agent instance was seen under another cluster or node: refused, nothing stored."""


def _columns(table: str) -> tuple[str, ...]:
    """A batch table's columns as ingest writes them: cluster, node, then its wire struct's fields."""
    return ("cluster", "node", *BATCH_TABLES[table][1].__struct_fields__)


def _nonzero(counts: dict[str, int]) -> str:
    """A ledger count as stored: only what is not zero (a key it lacks reads as none). A batch a second
    per node makes the ledger a large table, and most of a row's counts are zeros."""
    return _json.encode({k: v for k, v in counts.items() if v}).decode()


def _rows(b: wire.Batch) -> dict[str, int]:
    """Rows per table a batch carries (recorded in the ledger and answered to the agent)."""
    rows = {table: len(getattr(b, attr)) for table, (attr, _) in BATCH_TABLES.items()}
    rows["jobs"] = len(b.jobs)
    return rows


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    lenient_times(conn.adapters)
    # The ledger's statement is prepared; left to choose, PostgreSQL plans it again at every execution
    # (a custom plan prunes the ledger's partitions), and that planning costs more of the server's CPU
    # than the statement at one batch a transaction (perf shows it). Its generic plan prunes at run time just as well. The
    # pool's other statements are key lookups, planned the same either way. Citus cannot distribute
    # a plan whose parameters are not yet known: there the choice stays PostgreSQL's.
    cur = await conn.execute(citus.INSTALLED)
    if (await cur.fetchone()) == (True,):
        # A group's rows reach many shards. By default Citus works on them over a connection per
        # shard in parallel; one connection per worker takes less database CPU a GPU sample (the
        # Citus part of bench/versus_tsdb.py measures it). The
        # pool's few multi-shard reads (the job list) run that way too; the rules, the leader and
        # compaction have connections of their own.
        await conn.execute("SET citus.multi_shard_modify_mode = 'sequential'")
    else:
        await conn.execute("SET plan_cache_mode = force_generic_plan")


class Storage:
    """PostgreSQL access for the collector through an async connection pool."""

    def __init__(self, dsn: str, *, pool_min: int = 1, pool_max: int = 4, wait_s: float = 2.0) -> None:
        self.dsn = dsn
        self.pool = AsyncConnectionPool(
            check_dsn(dsn), min_size=pool_min, max_size=pool_max, timeout=wait_s, open=False,
            reconnect_timeout=60, kwargs={"autocommit": True, "connect_timeout": 5}, name="jobpulse",
            configure=_configure, check=AsyncConnectionPool.check_connection,
        )
        self._checked = False  # the catalog has every column the wire structs name
        self._types: dict[str, list[str]] = {}  # table -> the types of cluster, node and its struct's fields
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
            self._checked = False
            raise Unavailable(_SCHEMA_HINT) from None

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Check once that every table has the columns its wire struct names."""
        if self._checked:
            return
        cur = await conn.execute(
            "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'jobpulse' AND c.relname = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped",
            ([*BATCH_TABLES, *rollup.ROLLUP_TABLES],),
        )
        columns: dict[str, dict[str, str]] = {}
        for table, column, type_name in await cur.fetchall():
            columns.setdefault(table, {})[column] = type_name
        for table in rollup.ROLLUP_TABLES:
            if table not in columns:
                raise Unavailable(f"{_SCHEMA_HINT} (jobpulse.{table} is missing)")
        for table in BATCH_TABLES:
            missing = [c for c in _columns(table) if c not in columns.get(table, {})]
            if missing:
                raise Unavailable(f"{_SCHEMA_HINT} (jobpulse.{table} lacks {', '.join(missing)})")
            self._types[table] = [columns[table][c] for c in _columns(table)]
        self._days = await asyncio.to_thread(self._sync, partitions.common_days)
        self._checked = True

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
        """Write a group of batches in one transaction (`_write`). Returns after COMMIT (the agents may
        then forget them), one result per batch in order. A data error rejects the whole group (the
        caller retries its members one by one, so only the bad batch gets the error)."""
        results = [StoreResult(duplicate=False, rows=_rows(v.batch)) for v in group]
        first: dict[tuple[str, str, str, int], int] = {}
        for i, v in enumerate(group):  # the same batch twice in a group: stored once
            a = v.batch.agent
            first.setdefault((a.cluster, a.node, a.instance, v.batch.seq), i)
        batches = [group[i].batch for i in first.values()]
        tables = tuple(t for t, (attr, _) in BATCH_TABLES.items() if any(getattr(b, attr) for b in batches))
        instances, seqs = [b.agent.instance for b in batches], [b.seq for b in batches]
        ledger: list[list[Any]] = [
            instances, seqs, [b.created_at for b in batches], [b.agent.cluster for b in batches],
            [b.agent.node for b in batches], [b.agent.version for b in batches],
            [_nonzero(results[i].rows) for i in first.values()],
            [_nonzero(msgspec.structs.asdict(b.dropped)) for b in batches]]
        jobs = any(b.jobs for b in batches)
        late = datetime.now(UTC) - pyramid.LATE  # their hours marked for the pyramid's next run
        hours = pyramid.late_hours([v.batch for v in group if v.oldest < late], late)
        days = {d for v in group for d in v.days} | {v.batch.created_at.astimezone(UTC).date() for v in group}
        for attempt in (1, 2):  # a day dropped since this process looked (retention, the ledger's fold), or a
            # deadlock with retention's DDL (PostgreSQL rolled this transaction back): once more
            async with self._connection() as conn:
                await self._check(conn)
                await self._ensure_days(days)
                try:
                    found = await self._write(conn, batches, tables, ledger, jobs, hours)
                    break
                except errors.CheckViolation as exc:
                    if "no partition" not in str(exc):
                        raise Rejected(422, f"rejected by the database: {exc.diag.message_primary}") from None
                    self._days.clear()
                    self._checked = False
                    if attempt == 2:
                        raise Unavailable("time partition missing; retry") from None
                except (errors.DataError, errors.IntegrityError, errors.ProgramLimitExceeded) as exc:
                    raise Rejected(422, f"rejected by the database: {exc.diag.message_primary}") from None
                except errors.DeadlockDetected:
                    if attempt == 2:
                        raise
        new = {(i, seq) for i, seq in found if seq >= 0}
        claimed = {i for i, seq in found if seq < 0}
        for i, v in enumerate(group):
            a = v.batch.agent
            key = (a.cluster, a.node, a.instance, v.batch.seq)
            fresh = first[key] == i and key[2:] in new
            results[i] = StoreResult(duplicate=not fresh and a.instance not in claimed, rows=results[i].rows,
                                     claimed=a.instance in claimed)
        return results

    async def _write(self, conn: psycopg.AsyncConnection[Any], batches: list[wire.Batch], tables: tuple[str, ...],
                     ledger: list[list[Any]], jobs: bool, hours: list[datetime]) -> list[tuple[str, int]]:
        """One transaction in two round trips and a COPY per table: BEGIN, the locks, the ledger's
        statement and the mark; the new batches' rows copied (`_copy`); the staged rows' moves and
        folds, the jobs, the pyramid's hours and COMMIT. BEGIN and COMMIT ride in the pipelines
        (psycopg's transaction block gives each a round trip of its own). With the rows copied
        straight into their tables, a group of one batch fell from 1.3 to 1.0 ms of the collector's
        CPU and from 1.0 to 0.6 ms of PostgreSQL's (scaling.md). Returns the ledger statement's
        (instance, seq) rows."""
        try:
            async with conn.pipeline():
                await conn.execute("BEGIN")
                await conn.execute(fold.LOCK_SHARED)
                await conn.execute(_LOCK_BATCHES, ledger[:2])
                cur = await conn.execute(_LEDGER, ledger)
                marked = await conn.execute(fold.READ_MARK)
            found: list[tuple[str, int]] = await cur.fetchall()
            mark = await marked.fetchone()
            new = {(i, seq) for i, seq in found if seq >= 0}
            taken = [b for b in batches if (b.agent.instance, b.seq) in new]
            staged = await self._copy(conn, taken, tables, mark[0] if mark else None) if taken else []
            async with conn.pipeline():
                for table in staged:
                    await conn.execute(rollup.move(table))
                    for statement in rollup.fold(table, fold.pending(table, f"pg_temp.{rollup.stage_name(table)}")):
                        await conn.execute(statement)
                if jobs:
                    await self._upsert_jobs(conn, taken)
                if hours:
                    await conn.execute(pyramid.MARK, (hours,))
                await conn.execute("COMMIT")
            return found
        except BaseException:
            if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                await conn.rollback()
            raise

    async def _copy(self, conn: psycopg.AsyncConnection[Any], batches: list[wire.Batch], tables: tuple[str, ...],
                    mark: datetime | None) -> list[str]:
        """Each table's rows of the new ``batches`` copied in binary: straight into the table, or,
        when some of them are rows ingest folds (`fold.folds_at_ingest`: step events, samples before
        the leader's mark), into the connection's staging table, to be moved and folded from there
        (the tables returned). PostgreSQL parses no JSON and no text, and a live group's rows are
        written once (scaling.md says what each step bought). A binary COPY wraps a number past its
        column's type instead of refusing it: the wire schema's bounds keep every number inside
        (tests/test_fields.py)."""
        staged = []
        for table in tables:
            attr = BATCH_TABLES[table][0]
            target = f"jobpulse.{table}"
            if table in rollup.FOLDS:
                oldest = min((r.ts for b in batches for r in getattr(b, attr)), default=None)
                if oldest is not None and fold.folds_at_ingest(table, oldest, mark):
                    await conn.execute(rollup.create_stage(table))
                    staged.append(table)
                    target = f"pg_temp.{rollup.stage_name(table)}"
            names = ", ".join(f'"{c}"' for c in _columns(table))
            async with conn.cursor().copy(f"COPY {target} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(self._types[table])
                for b in batches:
                    head = (b.agent.cluster, b.agent.node)
                    for record in getattr(b, attr):
                        await copy.write_row(head + msgspec.structs.astuple(record))
        return staged

    async def _upsert_jobs(self, conn: psycopg.AsyncConnection[Any], batches: list[wire.Batch]) -> None:
        """Jobs and their GPUs in key order (two collectors' groups cannot deadlock on them); a job's
        records keep their arrival order (a later record's state wins), each with its runs' and
        states' statements around it (`runs`)."""
        job_params: list[tuple[tuple[Any, ...], wire.JobRecord]] = []
        gpu_params: list[tuple[Any, ...]] = []
        for b in batches:
            cluster, node = b.agent.cluster, b.agent.node
            for job in b.jobs:
                values = [getattr(job, c) for c in _JOB_COLUMNS]
                values[_JOB_COLUMNS.index("tags")] = Jsonb(job.tags)
                job_params.append(((cluster, *values), job))
                gpu_params.extend((cluster, job.job_id, node, g.gpu_uuid, g.gpu_index, g.pci_bus_id, g.share)
                                  for g in job.gpus)
        async with conn.cursor() as cur:
            for params, job in sorted(job_params, key=lambda p: p[0][:2]):
                before, after = runs.statements(params[0], job)
                for statement, args in before:
                    await cur.execute(statement, args)
                await cur.execute(_UPSERT_JOB, params)
                for statement, args in after:
                    await cur.execute(statement, args)
            if gpu_params:
                gpus_in_order: list[tuple[Any, ...]] = sorted(gpu_params, key=lambda p: p[:4])
                await cur.executemany(_UPSERT_JOB_GPU, gpus_in_order)

    async def jobs_known(self, cluster: str, node: str, job_ids: list[str]) -> dict[str, tuple[Any, ...]]:
        """Each stored job's node list, run, whether it ended, and whether ``node`` holds GPUs of it:
        what ingest's authority (`ingest.authority`) checks a node's batch against."""
        async with self._connection() as conn:
            cur = await conn.execute(_JOBS_KNOWN, (node, cluster, job_ids))
            return {r[0]: tuple(r[1:]) for r in await cur.fetchall()}

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
