"""The collector's ASGI service: receive -> validate -> store, plus job queries and health.

A batch is acknowledged (200) only after its transaction committed (batches arriving together
share one: `group_commit`); a replay of a stored batch is acknowledged as ``duplicate`` and not
stored again. Rules and partition maintenance run on one collector of several, the leader
(`leader`). While PostgreSQL is down every write answers 503 with Retry-After and the service
keeps running; the pool reconnects by itself. Bad input gets a 4xx naming the reason and nothing is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

import msgspec
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from jobpulse.collector.errors import Rejected, Unavailable
from jobpulse.collector.ingest import openapi
from jobpulse.collector.ingest.auth import Grant, TokenFile
from jobpulse.collector.ingest.group_commit import GroupCommit
from jobpulse.collector.ingest.metrics import CollectorMetrics
from jobpulse.collector.ingest.receive import read_body
from jobpulse.collector.ingest.validate import Limits, validate
from jobpulse.collector.leader import Leader, Task
from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.rules.workers import Judges
from jobpulse.collector.store import compact, partitions, pyramid, rollup
from jobpulse.collector.store.database import Storage
from jobpulse.collector.store.rule_inputs import Blocks
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.collector")
_json = msgspec.json.Encoder()


@dataclass(frozen=True)
class Settings:
    dsn: str
    token_file: Path
    max_body_bytes: int = 32 * 1024 * 1024
    retention_days: int = 30
    partitions_ahead_days: int = 3
    max_clock_skew_s: float = 300.0
    maintenance_interval_s: float = 3600.0
    retry_after_s: int = 2
    pool_max: int = 4
    rules_path: Path | None = None  # None: the shipped defaults (rules_default.toml)
    rules_interval_s: float = 30.0
    request_timeout_s: float = 10.0  # a body that takes longer is refused (408)
    group_wait_s: float = 0.005  # how long a batch waits for others to share its transaction
    group_max_batches: int = 512
    compact_interval_s: float = 60.0  # the leader compacts samples older than the hot window ...
    compact_budget_s: float = 5.0  # ... for at most this long per run, so rule cycles stay on time
    pyramid_interval_s: float = 60.0  # the cluster dashboards' per-node and per-job sums, rebuilt ...
    pyramid_budget_s: float = 10.0  # ... for at most this long per run (the first run catches up over several)
    group_writers: int = 2  # groups in flight at once (one fills while another commits)
    rules_processes: int = 0  # processes judging a share of the jobs each (0: the leader's own, rules/workers.py)
    log_level: str | None = None  # the rule processes' (None: as logging is set up by default)


_JOB_ID = re.compile(wire.JOB_ID_PATTERN)


def _name_param(query: Any, name: str) -> str | None:
    """A cluster or user name from the query string: printable, no NUL, at most 255 characters."""
    value = query.get(name)
    if value is not None and (not value or len(value) > 255 or not value.isprintable()):
        raise Rejected(422, f"{name} must be 1-255 printable characters", name)
    return value


def _respond(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(body), status_code=status, headers=headers, media_type="application/json")


class Collector:
    """Request handlers bound to one storage, token file and metrics registry."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.storage = Storage(settings.dsn, pool_max=settings.pool_max)
        self.tokens = TokenFile(settings.token_file)
        self.metrics = CollectorMetrics()
        self.version = dist_version("jobpulse")
        self.thresholds = Thresholds(settings.rules_path)
        self.rule_blocks = Blocks()  # settled blocks kept between this process's rule cycles
        self.judges = (Judges(settings.dsn, settings.rules_path, settings.rules_processes, log_level=settings.log_level)
                       if settings.rules_processes else None)
        self._openapi = _json.encode(openapi.document(self.version))
        self.groups = GroupCommit(self.storage.store, wait_s=settings.group_wait_s,
                                  max_batches=settings.group_max_batches, writers=settings.group_writers,
                                  on_group=self.metrics.group_batches.observe)
        self.leader = Leader(settings.dsn, [
            Task("maintenance", settings.maintenance_interval_s, self._maintain),
            Task("rules", settings.rules_interval_s, self._evaluate_rules),
            Task("compaction", settings.compact_interval_s, self._compact),
            Task("pyramid", settings.pyramid_interval_s, self._build_pyramid),
        ], poll_s=min(5.0, settings.rules_interval_s / 4), on_failure=self._task_failed)

    # -- receive -> validate -> store ------------------------------------------------------
    async def post_batch(self, request: Request) -> Response:
        started = time.perf_counter()
        grant = self._authorize(request)
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise Rejected(415, f"Content-Type must be application/json, not {ctype!r}", "Content-Type")
        body = await read_body(request, self.settings.max_body_bytes, self.settings.request_timeout_s)
        limits = Limits(oldest_day=partitions.horizon(self.settings.retention_days),
                        max_skew=timedelta(seconds=self.settings.max_clock_skew_s))
        valid = validate(body, limits)
        agent = valid.batch.agent
        if not grant.covers(agent.cluster, agent.node):
            raise Rejected(403, f"this token may not write as node {agent.node!r} of cluster {agent.cluster!r}",
                           "$.agent")
        result = await self.groups.submit(valid)
        self.metrics.db_up.set(1)
        batch = valid.batch
        if result.claimed:
            raise Rejected(409, f"agent instance {agent.instance!r} already wrote as another node or cluster; "
                                f"an instance belongs to one node", "$.agent.instance")
        if result.duplicate:
            self.metrics.batches.labels("duplicate").inc()
        else:
            self.metrics.batches.labels("stored").inc()
            for table, n in result.rows.items():
                if n:
                    self.metrics.rows.labels(table).inc(n)
            for kind, n in msgspec.structs.asdict(batch.dropped).items():
                if n:
                    self.metrics.agent_dropped.labels(kind).inc(n)
                    log.warning("agent dropped data", node=batch.agent.node, kind=kind, count=n)
            self.metrics.batch_seconds.observe(time.perf_counter() - started)
        return _respond(openapi.Ack("duplicate" if result.duplicate else "stored", batch.seq, result.rows))

    def _authorize(self, request: Request) -> Grant:
        grant = self.tokens.grant(request.headers.get("authorization"))
        if grant is None:
            raise Rejected(401, "missing or wrong bearer token", "Authorization")
        return grant

    # -- queries ----------------------------------------------------------------------------
    @staticmethod
    def _readable_cluster(grant: Grant, asked: str | None) -> str | None:
        """The cluster a query may read: a token bound to a cluster reads only that one."""
        if grant.cluster is None:
            return asked
        if asked is not None and asked != grant.cluster:
            raise Rejected(403, f"this token reads only cluster {grant.cluster!r}", "cluster")
        return grant.cluster

    async def list_jobs(self, request: Request) -> Response:
        grant = self._authorize(request)
        q = request.query_params
        state = q.get("state")
        if state not in (None, "running", "ended"):
            raise Rejected(422, "state must be 'running' or 'ended'", "state")
        limit_text = q.get("limit", "100")
        if not (limit_text.isascii() and limit_text.isdigit() and 1 <= int(limit_text) <= 10_000):
            raise Rejected(422, "limit must be an integer from 1 to 10000", "limit")
        jobs = await self.storage.jobs(cluster=self._readable_cluster(grant, _name_param(q, "cluster")),
                                       user=_name_param(q, "user"),
                                       running=None if state is None else state == "running",
                                       limit=int(limit_text))
        return _respond(jobs)

    async def get_job(self, request: Request) -> Response:
        grant = self._authorize(request)
        job_id = request.path_params["job_id"]
        if len(job_id) > 64 or not _JOB_ID.fullmatch(job_id):
            raise Rejected(422, "job id must look like 123, 123_4 (array task) or 123+1 (het component)", "job_id")
        found = await self.storage.job(job_id, self._readable_cluster(grant, _name_param(request.query_params, "cluster")))
        if not found:
            raise Rejected(404, f"no job {job_id!r}", "job_id")
        if len(found) > 1:
            clusters = ", ".join(sorted(j["cluster"] for j in found))
            raise Rejected(409, f"job {job_id!r} exists in clusters {clusters}; pass ?cluster=", "cluster")
        return _respond(found[0])

    # -- health, metrics, contract --------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        db_ok = await self.storage.ping()
        self.metrics.db_up.set(1 if db_ok else 0)
        body = {"status": "ok" if db_ok else "degraded", "database": "ok" if db_ok else "unreachable",
                "version": self.version, "leader": self.leader.leading}
        return _respond(body, 200 if db_ok else 503)

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def openapi_json(self, request: Request) -> Response:
        return Response(self._openapi, media_type="application/json")

    # -- errors -------------------------------------------------------------------------------
    async def on_rejected(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Rejected)
        self.metrics.rejects.labels(str(exc.status)).inc()
        if request.url.path == "/v1/batches":
            self.metrics.batches.labels("rejected").inc()
        log.info("rejected", path=request.url.path, status=exc.status, reason=exc.reason[:300], field=exc.field)
        return _respond(openapi.ErrorBody(exc.reason, exc.field), exc.status)

    async def on_unavailable(self, request: Request, exc: Exception) -> Response:
        self.metrics.db_errors.inc()
        self.metrics.db_up.set(0)
        if request.url.path == "/v1/batches":
            self.metrics.batches.labels("unavailable").inc()
        log.warning("database unavailable", path=request.url.path, reason=str(exc)[:300])
        return _respond(openapi.ErrorBody(f"database unavailable: {exc}"), 503,
                        {"Retry-After": str(self.settings.retry_after_s)})

    # -- background: on the leader only -------------------------------------------------------
    def _maintain(self, conn: Any) -> None:
        """Partitions ahead and retention."""
        created = partitions.ensure_ahead(conn, self.settings.partitions_ahead_days)
        dropped = partitions.drop_expired(conn, self.settings.retention_days)
        rollup.tune(conn)
        if created or dropped:
            log.info("partition maintenance", created=created, dropped=dropped)

    def _compact(self, conn: Any) -> None:
        """Samples older than the hot window into the compact tier, a few chunks per run (each chunk
        its own transaction, so the connection runs in autocommit meanwhile)."""
        conn.autocommit = True
        try:
            done = compact.compact(conn, max_seconds=self.settings.compact_budget_s)
        finally:
            conn.autocommit = False
        if done.chunks:
            log.info("compacted", chunks=done.chunks, samples=done.samples, seconds=round(done.seconds, 2),
                     finished=done.finished)

    def _build_pyramid(self, conn: Any) -> None:
        """The cluster dashboards' per-(job, node, bucket) sums, newest buckets rebuilt."""
        done = pyramid.build(conn, max_seconds=self.settings.pyramid_budget_s)
        log.debug("pyramid built", rows=done.rows, hours=done.hours, seconds=round(done.seconds, 2),
                  finished=done.finished)

    def _evaluate_rules(self, conn: Any) -> None:
        """Flags for running jobs; a failed cycle is logged and the next one runs on time."""
        result = evaluate(conn, self.thresholds, self.rule_blocks, self.judges)
        self.metrics.rule_seconds.observe(result.seconds)
        if result.hits or result.closed:
            log.info("rules evaluated", jobs=result.jobs, gpus=result.gpus, hits=result.hits,
                     closed=result.closed, seconds=round(result.seconds, 3))

    def _task_failed(self, task: Task, exc: Exception) -> None:
        (self.metrics.rule_errors if task.name == "rules" else self.metrics.maintenance_errors).inc()

    async def leader_loop(self) -> None:
        """Lead when no other collector does; never stops ingest."""
        try:
            while True:
                try:
                    delay = await asyncio.to_thread(self.leader.step)
                except Exception as exc:  # noqa: BLE001 - e.g. the database is down: try again later
                    log.warning("leader election failed", error=str(exc)[:300])
                    delay = self.leader.poll_s
                self.metrics.leader.set(1 if self.leader.leading else 0)
                await asyncio.sleep(delay)
        finally:  # in its own thread: a rule cycle running now finishes first
            await asyncio.to_thread(self.leader.close)
            if self.judges is not None:
                await asyncio.to_thread(self.judges.close)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.storage.open()
        self.groups.start()
        leading = asyncio.create_task(self.leader_loop())
        log.info("collector started", version=self.version)
        try:
            yield
        finally:
            leading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leading
            await self.groups.stop()
            await self.storage.close()


def create_app(settings: Settings) -> Starlette:
    c = Collector(settings)
    routes = [
        Route("/v1/batches", c.post_batch, methods=["POST"]),
        Route("/v1/jobs", c.list_jobs, methods=["GET"]),
        Route("/v1/jobs/{job_id}", c.get_job, methods=["GET"]),
        Route("/healthz", c.healthz, methods=["GET"]),
        Route("/metrics", c.prometheus, methods=["GET"]),
        Route("/openapi.json", c.openapi_json, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=c.lifespan,
                    exception_handlers={Rejected: c.on_rejected, Unavailable: c.on_unavailable})
    app.state.collector = c
    return app
