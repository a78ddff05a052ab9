"""The collector service: its settings, what runs on the leader beside the HTTP requests (partition
maintenance and retention, rule cycles, compaction, the ledger's fold, the cluster pyramid) and the
lifecycle of it all.

Several collectors may serve one database; work that must happen once runs on the leader, chosen by
a PostgreSQL advisory lock (`leader`). The HTTP side (`ingest.app`) only handles requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.types import ASGIApp

from jobpulse.collector.ingest.app import Api, RequestLimits
from jobpulse.collector.ingest.auth import TokenFile
from jobpulse.collector.ingest.group_commit import GroupCommit
from jobpulse.collector.ingest.metrics import CollectorMetrics
from jobpulse.collector.ingest.server import open_connections
from jobpulse.collector.notify import channels, policy
from jobpulse.collector.notify.delivery import Notifier
from jobpulse.collector.report import summary
from jobpulse.collector.rules.capture_policy import ask_for_new_flags
from jobpulse.collector.rules.engine import evaluate
from jobpulse.collector.rules.inputs import Blocks
from jobpulse.collector.rules.thresholds import Thresholds
from jobpulse.collector.rules.workers import Judges
from jobpulse.collector.settings import CollectorSettings
from jobpulse.collector.store.database import Storage
from jobpulse.collector.store.state import captures
from jobpulse.collector.store.state.leader import Leader, Task
from jobpulse.collector.store.tiers import compact, fold, ledger, partitions, pyramid, rollup

log = structlog.get_logger("jobpulse.collector")
GC_THRESHOLD = 50_000  # allocations between young-generation passes (Python's default: 700)


def request_limits(s: CollectorSettings) -> RequestLimits:
    return RequestLimits(s.max_body_bytes, s.request_timeout_s, s.retention_days, s.max_clock_skew_s, s.retry_after_s,
                         s.munge_socket)


class Service:
    """One collector process: the HTTP requests' parts, and the leader's tasks."""

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.storage = Storage(settings.dsn, pool_max=settings.pool_max)
        self.metrics = CollectorMetrics()
        self.thresholds = Thresholds(settings.rules_path)
        self.rule_blocks = Blocks()  # settled blocks kept between this process's rule cycles
        self.judges = (Judges(settings.dsn, settings.rules_path, settings.rules_processes, log_level=settings.log_level)
                       if settings.rules_processes else None)
        self.groups = GroupCommit(self.storage.store, wait_s=settings.group_wait_s,
                                  max_batches=settings.group_max_batches,
                                  max_wait_s=settings.group_max_wait_s, writers=settings.group_writers,
                                  on_group=self.metrics.group_batches.observe, senders=open_connections)
        self.leader = Leader(settings.dsn, [
            Task("maintenance", settings.maintenance_interval_s, self._maintain),
            Task("fold", settings.fold_interval_s, self._fold),
            Task("rules", settings.rules_interval_s, self._evaluate_rules),
            Task("compaction", settings.compact_interval_s, self._compact),
            Task("ledger", settings.maintenance_interval_s, self._fold_ledger),
            Task("pyramid", settings.pyramid_interval_s, self._build_pyramid),
            Task("summaries", settings.rules_interval_s, self._summarize),
        ], poll_s=min(5.0, settings.rules_interval_s / 4), on_failure=self._task_failed)
        self.channels = channels.load(settings.notify_path) if settings.notify_path else channels.Channels()
        self.notifier = Notifier(settings.dsn, self.channels) if self.channels.any else None
        self.policy = policy.load_all(settings.policy_path) if settings.policy_path else None
        self.api = Api(request_limits(settings), self.storage, TokenFile(settings.token_file), self.groups,
                       self.metrics, lambda: self.leader.leading)

    # -- on the leader only ----------------------------------------------------------------------
    def _maintain(self, conn: Any) -> None:
        """Partitions ahead and retention."""
        created = partitions.ensure_ahead(conn, self.settings.partitions_ahead_days)
        dropped = partitions.drop_expired(conn, self.settings.retention_days)
        traces = captures.drop_traces(conn, self.settings.captures.trace_days)
        rollup.tune(conn)
        if created or dropped or traces:
            log.info("partition maintenance", created=created, dropped=dropped, traces_dropped=traces)

    def _fold(self, conn: Any) -> None:
        """The samples ingest left raw, up to `fold.LAG` ago, into their roll-ups (a rule cycle and
        compaction fold up to their start themselves)."""
        done = fold.run(conn, align=fold.ALIGN)
        if done.start is None and done.end is not None:
            log.info("roll-ups folded behind ingest from now on", mark=done.end.isoformat())

    def _fold_ledger(self, conn: Any) -> None:
        """The ingest ledger's days before yesterday folded into runs of seqs (each day its own
        transaction)."""
        conn.autocommit = True
        try:
            done = ledger.fold(conn, partitions.utc_today() - timedelta(days=1), self.settings.retention_days)
        finally:
            conn.autocommit = False
        if done.batches or done.expired:
            log.info("ledger folded", batches=done.batches, days_dropped=[d.isoformat() for d in done.dropped],
                     runs_expired=done.expired)

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
        log.debug("pyramid built", rows=done.rows, hours=done.hours, late_hours=done.late_hours,
                  seconds=round(done.seconds, 2), finished=done.finished)

    def _evaluate_rules(self, conn: Any) -> None:
        """Flags for running jobs; a failed cycle is logged and the next one runs on time."""
        result = evaluate(conn, self.thresholds, self.rule_blocks, self.judges)
        self.metrics.rule_seconds.observe(result.seconds)
        try:  # the stacks of the ranks this cycle flagged; the cycle's flags stand whatever happens here
            with conn.transaction():
                ask_for_new_flags(conn, self.settings.captures)
        except Exception as exc:  # noqa: BLE001
            log.warning("captures not asked for", error=str(exc)[:300])
        if self.notifier is not None:  # the flags this cycle opened, into the outbox (delivered apart)
            channels.enqueue(conn, self.channels)
        if self.policy is not None:  # warn, then cancel (or requeue), jobs that hold idle GPUs or hang
            policy.enforce(conn, self.policy)
        if result.hits or result.closed:
            log.info("rules evaluated", jobs=result.jobs, gpus=result.gpus, hits=result.hits,
                     closed=result.closed, seconds=round(result.seconds, 3))

    def _summarize(self, conn: Any) -> None:
        """A summary of every job that ended and whose rules are final (job-end mail, `summary`)."""
        written = summary.write_pending(conn)
        if written:
            log.info("job summaries written", jobs=written)

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
            self.rule_blocks.close()
            if self.judges is not None:
                await asyncio.to_thread(self.judges.close)

    async def notify_loop(self, notifier: Notifier) -> None:
        """Deliver the outbox every second while this collector leads, in a thread of its own: a slow
        or dead receiver holds up notices, never ingest or the rule cycles."""
        try:
            while True:
                if self.leader.leading:
                    try:
                        done = await asyncio.to_thread(notifier.run_once)
                        for outcome in ("delivered", "failed", "given_up", "held"):
                            self.metrics.notifications.labels(outcome).inc(getattr(done, outcome))
                    except Exception as exc:  # noqa: BLE001 - e.g. the database is down: try again
                        log.warning("notification delivery failed", error=str(exc)[:300])
                await asyncio.sleep(1.0)
        finally:
            await asyncio.to_thread(notifier.close)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.storage.open()
        self.groups.start()
        leading = asyncio.create_task(self.leader_loop())
        notifying = asyncio.create_task(self.notify_loop(self.notifier)) if self.notifier else None
        log.info("collector started", version=self.api.version)
        _settle_gc()
        try:
            yield
        finally:
            for task in (notifying, leading):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await self.groups.stop()
            await asyncio.to_thread(self._fold_at_exit)
            await self.storage.close()

    def _fold_at_exit(self) -> None:
        """Fold what this collector's last groups stored: a collector stopped in order leaves no
        sample outside the roll-ups (one killed leaves them to the next leader's fold)."""
        try:
            fold.catch_up(self.settings.dsn)
        except Exception as exc:  # noqa: BLE001 - e.g. the database is down: nothing to do about it now
            log.warning("samples left for the next fold", error=str(exc)[:300])


def _settle_gc() -> None:
    """Leave what start-up built (modules, the app, the pool) out of the cyclic collector's passes and
    run them less often: every request allocates thousands of short-lived objects (the decoded batch,
    its records) that refcounting frees, and each full pass scanned the whole start-up heap again."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)


def create_app(settings: CollectorSettings) -> ASGIApp:
    service = Service(settings)
    app = Starlette(routes=service.api.routes(), lifespan=service.lifespan,
                    exception_handlers=service.api.exception_handlers())
    return service.api.with_fast_ingest(app)
