"""The collector's HTTP requests: receive -> validate -> store, plus job queries and health.

A batch is acknowledged (200) only after its transaction committed (batches arriving together
share one: `group_commit`); a replay of a stored batch is acknowledged as ``duplicate`` and not
stored again. Rules and partition maintenance run on one collector of several, the leader
(`service`). While PostgreSQL is down every write answers 503 with Retry-After and the service
keeps running; the pool reconnects by itself. Bad input gets a 4xx naming the reason and nothing is stored.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

import msgspec
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from jobpulse.collector.errors import Rejected, Unavailable
from jobpulse.collector.ingest import munge, openapi
from jobpulse.collector.ingest.auth import Grant, TokenFile
from jobpulse.collector.ingest.authority import Authority, Known
from jobpulse.collector.ingest.group_commit import GroupCommit
from jobpulse.collector.ingest.held_bound import HeldBound
from jobpulse.collector.ingest.metrics import CollectorMetrics
from jobpulse.collector.ingest.receive import read_body
from jobpulse.collector.ingest.validate import Limits, validate
from jobpulse.collector.store.database import Storage
from jobpulse.collector.store.tiers import partitions
from jobpulse.schema import wire

log = structlog.get_logger("jobpulse.collector")
_json = msgspec.json.Encoder()


@dataclass(frozen=True)
class RequestLimits:
    """What a request may be: the collector's settings for the HTTP side."""

    max_body_bytes: int
    request_timeout_s: float  # a body that takes longer is refused (408)
    retention_days: int  # records older than the retention horizon are refused
    max_clock_skew_s: float  # ... and records further in the future
    retry_after_s: int  # what a 503 asks the agent to wait
    munge_socket: Path | None = None  # munged's socket, to check users' MUNGE credentials (None: its default)


_JOB_ID = re.compile(wire.JOB_ID_PATTERN)


def _name_param(query: Any, name: str) -> str | None:
    """A cluster or user name from the query string: printable, no NUL, at most 255 characters."""
    value = query.get(name)
    if value is not None and (not value or len(value) > 255 or not value.isprintable()):
        raise Rejected(422, f"{name} must be 1-255 printable characters", name)
    return value


def _respond(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(body), status_code=status, headers=headers, media_type="application/json")


class Api:
    """The HTTP requests: batches in (receive -> validate -> group commit), jobs out, health and
    metrics. What runs beside them (leader, rules, maintenance) is `jobpulse.collector.service`'s."""

    def __init__(self, limits: RequestLimits, storage: Storage, tokens: TokenFile, groups: GroupCommit,
                 metrics: CollectorMetrics, leading: Callable[[], bool]) -> None:
        self.limits, self.storage, self.tokens, self.groups = limits, storage, tokens, groups
        self.metrics, self.leading = metrics, leading
        self.version = dist_version("jobpulse")
        self._openapi = _json.encode(openapi.document(self.version))
        self._capture_nodes: set[tuple[str, str]] = set()
        self._capture_nodes_at = 0.0
        self.authority = Authority(self._jobs_known)
        self.held_bound = HeldBound()

    async def _jobs_known(self, cluster: str, node: str, job_ids: list[str]) -> dict[str, Known]:
        return {j: Known(*k) for j, k in (await self.storage.jobs_known(cluster, node, job_ids)).items()}

    # -- receive -> validate -> store ------------------------------------------------------
    async def post_batch(self, request: Request) -> Response:
        started = time.perf_counter()
        grant = self._authorize(request)
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise Rejected(415, f"Content-Type must be application/json, not {ctype!r}", "Content-Type")
        body = await read_body(request, self.limits.max_body_bytes, self.limits.request_timeout_s)
        bounds = Limits(oldest_day=partitions.horizon(self.limits.retention_days),
                        max_skew=timedelta(seconds=self.limits.max_clock_skew_s))
        valid = validate(body, bounds)
        agent = valid.batch.agent
        if not grant.covers(agent.cluster, agent.node):
            raise Rejected(403, f"this token may not write as node {agent.node!r} of cluster {agent.cluster!r}",
                           "$.agent")
        checked = await self.authority.check(grant, valid.batch)  # a refused part refuses the whole batch
        if checked is not valid.batch:
            valid = dataclasses.replace(valid, batch=checked)
        self.held_bound.check(valid.batch)
        result = await self.groups.submit(valid)
        self.metrics.db_up.set(1)
        batch = valid.batch
        if result.claimed:
            raise Rejected(409, f"agent instance {agent.instance!r} already wrote as another node or cluster; "
                                f"an instance belongs to one node", "$.agent.instance")
        if result.duplicate:
            self.metrics.batches.labels("duplicate").inc()
        else:
            self.held_bound.remember(batch)
            self.metrics.batches.labels("stored").inc()
            for table, n in result.rows.items():
                if n:
                    self.metrics.rows.labels(table).inc(n)
            for kind, n in msgspec.structs.asdict(batch.dropped).items():
                if n:
                    self.metrics.agent_dropped.labels(kind).inc(n)
                    log.warning("agent dropped data", node=batch.agent.node, kind=kind, count=n)
            self.metrics.batch_seconds.observe(time.perf_counter() - started)
        try:  # the batch is committed: evidence's trouble must not make the agent send it again
            asked = await self._captures(agent, batch.captures)
        except Exception as exc:  # noqa: BLE001 - e.g. the database went away meanwhile: next batch
            log.warning("capture answers not recorded", node=agent.node, error=str(exc)[:300])
            asked = []
        return _respond(openapi.Ack("duplicate" if result.duplicate else "stored", batch.seq, result.rows, asked))

    async def _captures(self, agent: wire.AgentInfo, answers: list[wire.CaptureResult]) -> list[wire.Capture]:
        """Record the agent's capture answers (a replayed batch's change nothing) and hand it its node's
        pending captures: which nodes have any is read at most every 2 s, not per batch."""
        now = time.monotonic()
        if now - self._capture_nodes_at > 2.0:
            self._capture_nodes_at = now
            self._capture_nodes = await self.storage.capture_nodes()
        node = (agent.cluster, agent.node)
        ask = node in self._capture_nodes
        if not answers and not ask:
            return []
        self._capture_nodes.discard(node)
        return await self.storage.exchange_captures(agent.cluster, agent.node, answers, ask)

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

    async def get_trace(self, request: Request) -> Response:
        """A flag's profiler trace, for the job's owner (a MUNGE credential whose payload names this
        request: ``munge -n -s "jobpulse trace ID"``) and the admins (a bearer token for its cluster)."""
        text = request.path_params["capture_id"]
        if not (text.isascii() and text.isdigit() and 0 < int(text) < 2**63):
            raise Rejected(422, "capture id must be a positive integer", "capture_id")
        capture_id = int(text)
        header = request.headers.get("authorization") or ""
        found = await self.storage.trace(capture_id)
        if header.startswith("MUNGE:"):
            who = await munge.verify(header, self.limits.munge_socket)
            if who.payload != f"jobpulse trace {capture_id}".encode():
                raise Rejected(401, f"the credential was made for {who.payload[:64]!r}, not for "
                                    f"'jobpulse trace {capture_id}'", "Authorization")
            if found is not None and who.uid != 0 and who.uid != found["uid"]:
                raise Rejected(403, f"capture {capture_id} is evidence of job {found['job_id']}: only its owner "
                                    "and the admins may read it", "Authorization")
        elif found is not None:
            self._readable_cluster(self._authorize(request), found["cluster"])
        else:
            self._authorize(request)
        if found is None:
            raise Rejected(404, f"no trace capture {capture_id}", "capture_id")
        if found["trace"] is None:
            raise Rejected(404, f"capture {capture_id} kept no trace (its summary stays in the job's report): "
                                "it was over the size cap, failed, or was dropped after the trace retention",
                           "capture_id")
        return Response(found["trace"], media_type="application/gzip", headers={
            "Content-Disposition": f"attachment; filename=job-{found['job_id']}-capture-{capture_id}.json.gz"})

    # -- health, metrics, contract --------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        db_ok = await self.storage.ping()
        self.metrics.db_up.set(1 if db_ok else 0)
        body = {"status": "ok" if db_ok else "degraded", "database": "ok" if db_ok else "unreachable",
                "version": self.version, "leader": self.leading()}
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
                        {"Retry-After": str(self.limits.retry_after_s)})


    def routes(self) -> list[Route]:
        return [
            Route("/v1/batches", self.post_batch, methods=["POST"]),
            Route("/v1/jobs", self.list_jobs, methods=["GET"]),
            Route("/v1/jobs/{job_id}", self.get_job, methods=["GET"]),
            Route("/v1/captures/{capture_id}/trace", self.get_trace, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
            Route("/openapi.json", self.openapi_json, methods=["GET"]),
        ]

    def exception_handlers(self) -> dict[Any, Any]:
        return {Rejected: self.on_rejected, Unavailable: self.on_unavailable}

    def with_fast_ingest(self, app: ASGIApp) -> ASGIApp:
        """``app`` with the agents' batches (POST /v1/batches, every node every second) handed
        straight to `post_batch` and its error handlers, past Starlette's middleware and routing,
        which cost CPU on every request. Everything else,
        the lifespan included, goes through ``app``; an unexpected error is uvicorn's 500."""
        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or scope["path"] != "/v1/batches" or scope["method"] != "POST":
                await app(scope, receive, send)
                return
            request = Request(scope, receive)
            try:
                response = await self.post_batch(request)
            except Rejected as exc:
                response = await self.on_rejected(request, exc)
            except Unavailable as exc:
                response = await self.on_unavailable(request, exc)
            await response(scope, receive, send)
        return serve
