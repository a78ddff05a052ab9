"""Leader: of several collectors on one database, exactly one runs the work that must happen once
(rule cycles, partition maintenance, retention).

Leadership is a PostgreSQL session advisory lock held on a connection of its own: it lasts as
long as that session, so a leader that dies (killed, host gone: the session's TCP keepalives
notice within seconds) frees it, and a follower polling ``pg_try_advisory_lock`` takes over.
Every task runs on the lock's connection, so a leader that lost its session cannot finish a
task on borrowed time. Each task's last start is kept in ``jobpulse.leader_tasks`` and claimed
before the task runs: a new leader continues the schedule (no cycle runs twice, none is skipped
for longer than one poll) instead of starting it over. The leader remembers when each task is due
next and asks the table only then: a claim is a write (the row's lock), and asking for every task
at every wake-up cost the database a transaction a second for nothing.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import structlog

from jobpulse.collector.store.connect import connect

log = structlog.get_logger("jobpulse.leader")

LOCK_KEY = 0x6A6F626C  # "jobl"
RETRY_S = 30.0  # a failed task is due again after this (or its interval, if shorter)

_CLAIM = """
INSERT INTO jobpulse.leader_tasks AS t (task, ran_at, holder) VALUES (%(task)s, now(), %(holder)s)
ON CONFLICT (task) DO UPDATE SET ran_at = now(), holder = EXCLUDED.holder
 WHERE t.ran_at <= now() - %(interval)s
RETURNING ran_at"""
_UNTIL_DUE = ("SELECT extract(epoch FROM ran_at + %(interval)s - now())::float8 FROM jobpulse.leader_tasks"
              " WHERE task = %(task)s")
_RETRY = "UPDATE jobpulse.leader_tasks SET ran_at = now() - %(interval)s + %(retry)s WHERE task = %(task)s"


@dataclass(frozen=True)
class Task:
    name: str
    interval_s: float
    run: Callable[[psycopg.Connection[Any]], None]
    """Runs on the leader's connection; what it leaves uncommitted is committed after it."""


class Leader:
    """Try to lead; while leading, run each task when its interval has passed since its last start
    (by whichever collector ran it)."""

    def __init__(self, dsn: str, tasks: list[Task], *, poll_s: float,
                 on_failure: Callable[[Task, Exception], None] = lambda task, exc: None) -> None:
        self.dsn = dsn
        self.tasks = tasks
        self.poll_s = poll_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self._on_failure = on_failure
        self._conn: psycopg.Connection[Any] | None = None
        self._busy = threading.Lock()  # a step and close() never use the connection at once
        self._due: dict[str, float] = {}  # task -> monotonic time before which its claim would fail

    @property
    def leading(self) -> bool:
        return self._conn is not None

    def step(self) -> float:
        """Lead if we can and run what is due; returns the seconds until there is more to do."""
        with self._busy:
            try:
                if self._conn is None and not self._acquire():
                    return self.poll_s
                return min([self._run_if_due(task) for task in self.tasks] + [self.poll_s])
            except psycopg.Error as exc:  # the lock's session is in doubt: give it up, try again later
                log.warning("leadership lost", holder=self.holder, error=str(exc)[:300])
                self._close()
                return self.poll_s

    def close(self) -> None:
        """Give up leading (after the task running now, if any, has finished)."""
        with self._busy:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()  # ends the session: the lock is free for another collector
            self._conn = None
            self._due.clear()  # a leader again later reads the schedule afresh

    def _acquire(self) -> bool:
        conn = connect(self.dsn, connect_timeout=5)
        try:
            # A vanished leader host is noticed by the server within ~10 s, not hours.
            conn.execute("SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3")
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
            conn.commit()
        except BaseException:
            conn.close()
            raise
        if not (row and row[0]):
            conn.close()
            return False
        self._conn = conn
        log.info("leading", holder=self.holder)
        return True

    def _run_if_due(self, task: Task) -> float:
        conn = self._conn
        assert conn is not None
        asked = time.monotonic()
        if self._due.get(task.name, 0.0) > asked:
            return self._due[task.name] - asked
        params = {"task": task.name, "holder": self.holder, "interval": timedelta(seconds=task.interval_s),
                  "retry": timedelta(seconds=min(RETRY_S, task.interval_s))}
        claimed = conn.execute(_CLAIM, params).fetchone()
        # The table's times are the server's now(), taken after ``asked``: a due time counted from
        # ``asked`` came a few ms early, and the claim then failed. Counted from the answer, never.
        answered = time.monotonic()
        if claimed is None:
            row = conn.execute(_UNTIL_DUE, params).fetchone()
            conn.commit()
            wait = max(0.01, row[0] if row else 0.0)
            self._due[task.name] = time.monotonic() + wait
            return wait
        conn.commit()
        try:
            task.run(conn)
            conn.commit()
        except Exception as exc:  # a failed task is retried; it never stops the others
            conn.rollback()
            if conn.broken or conn.closed:
                raise psycopg.OperationalError(f"{task.name}: {exc}") from exc
            log.warning("leader task failed", task=task.name, error=str(exc)[:300])
            self._on_failure(task, exc)
            conn.execute(_RETRY, params)
            conn.commit()
            self._due[task.name] = time.monotonic() + min(RETRY_S, task.interval_s)
            return min(RETRY_S, task.interval_s)
        self._due[task.name] = answered + task.interval_s
        return max(0.01, self._due[task.name] - time.monotonic())
