"""Delivery: the leading collector posts what the outbox holds, apart from ingest and the rule
cycles (its own thread and connection), so a receiver that is down or slow delays notices but never
loses them and never slows anything else. At least once: a notice is marked delivered after its
receiver answered 2xx, and carries an `Idempotency-Key` for a receiver that must see it once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog

from jobpulse.collector.notify.channels import Channels
from jobpulse.collector.store.connect import connect
from jobpulse.collector.store.state import notifications
from jobpulse.schema import storable

if TYPE_CHECKING:
    import httpx

log = structlog.get_logger("jobpulse.notify")

BATCH = 50


def backoff_s(attempts: int) -> float:
    """5 s, 10 s, 20 s ... at most 5 minutes between attempts."""
    return float(min(5 * 2 ** max(attempts - 1, 0), 300))


def _one_line(value: object, limit: int = 300) -> str:
    return " ".join(str(value).split())[:limit]


def _slack_escape(text: str) -> str:
    """Slack's and Mattermost's markup: &, < and > escaped (Slack's links and mentions), every @ followed
    by a zero-width space and [ ] ( ) escaped (Mattermost's @channel and Markdown links), so a job
    name cannot make a link or ping a channel."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("@", "@\u200b")
    return "".join("\\" + ch if ch in "[]()" else ch for ch in text)


def payload(note: dict[str, Any], flag: dict[str, Any]) -> dict[str, Any]:
    """What is posted: Slack/Mattermost's incoming-webhook text, or the flag as JSON."""
    where = flag["scope_key"] or "the job"
    if note["format"] == "slack":
        text = (f"[{flag['severity']}] job {flag['job_id']} ({_one_line(flag['job_name'] or '', 80)}, "
                f"{_one_line(flag['user_name'] or '?', 64)}) on {flag['cluster']}: {flag['rule_id']} at {where}\n"
                f"{_one_line(flag['advice'], 600)}")
        return {"text": _slack_escape(text), "username": "jobpulse"}
    return {"id": f"jobpulse-{note['id']}", "event": "flag", "cluster": flag["cluster"], "job_id": flag["job_id"],
            "job_name": flag["job_name"], "user": flag["user_name"], "partition": flag["partition"],
            "rule": flag["rule_id"], "severity": flag["severity"], "category": flag["category"],
            "scope": flag["scope"], "where": flag["scope_key"], "since": flag["started_at"].isoformat(),
            "ended": flag["ended_at"].isoformat() if flag["ended_at"] else None, "evidence": flag["evidence"],
            "advice": flag["advice"]}


@dataclass
class Outcome:
    delivered: int = 0
    failed: int = 0  # attempts that will be retried
    given_up: int = 0
    held: int = 0  # a user's notices past the hourly limit, held back


class Notifier:
    """Posts the due notifications; `run_once` is one pass (the service runs it every second while
    it leads)."""

    def __init__(self, dsn: str, channels: Channels) -> None:
        import httpx  # here: a collector without channels never loads an HTTP client (each start is faster)

        self.dsn = dsn
        self.channels = channels
        self.http: httpx.Client = httpx.Client(timeout=channels.timeout_s, follow_redirects=False)

    def close(self) -> None:
        self.http.close()

    def run_once(self) -> Outcome:
        out = Outcome()
        with connect(self.dsn, autocommit=True) as conn:
            due = notifications.due(conn, BATCH)
            if not due:
                return out
            found = notifications.flags(conn, sorted({n["flag_id"] for n in due}))
            hour_ago = datetime.now(UTC) - timedelta(hours=1)
            for note in due:
                try:
                    self._one(conn, note, found.get(note["flag_id"]), hour_ago, out)
                except Exception as exc:  # noqa: BLE001 - one bad note never blocks the ones behind it
                    log.warning("notification failed", id=note["id"], channel=note["channel"], error=str(exc)[:300])
                    notifications.mark(conn, note["id"], retry_in_s=backoff_s(note["attempts"] + 1),
                                       error=storable.text(f"{type(exc).__name__}: {exc}"[:300]))
                    out.failed += 1
        return out

    def _one(self, conn: Any, note: dict[str, Any], flag: dict[str, Any] | None, hour_ago: datetime,
             out: Outcome) -> None:
        if flag is None:  # its job's rows are gone (retention): nothing left to tell
            notifications.mark(conn, note["id"], error="flag no longer stored", attempted=False)
            out.given_up += 1
            return
        if (note["channel"] == "user" and notifications.delivered_to_user(conn, note["user_name"], hour_ago)
                >= self.channels.users.per_hour):
            notifications.mark(conn, note["id"], retry_in_s=300, error="user's hourly limit", attempted=False)
            out.held += 1
            return
        self._post(conn, note, flag, out)

    def _post(self, conn: Any, note: dict[str, Any], flag: dict[str, Any], out: Outcome) -> None:
        """One note's attempt. Whatever goes wrong with this note (a URL the client will not send to,
        a payload it cannot build) is this note's failure, marked with its backoff: the queue moves on."""
        try:
            r = self.http.post(note["url"], content=json.dumps(payload(note, flag), default=str),
                               headers={"Content-Type": "application/json",
                                        "Idempotency-Key": f"jobpulse-{note['id']}"})
            error = None if 200 <= r.status_code < 300 else f"HTTP {r.status_code}"
        except Exception as exc:  # noqa: BLE001 - e.g. httpx.InvalidURL, which is not an HTTPError
            error = storable.text(f"{type(exc).__name__}: {exc}"[:300])
        if error is None:
            notifications.mark(conn, note["id"], delivered=True)
            out.delivered += 1
            return
        old = datetime.now(UTC) - note["created_at"] > timedelta(hours=self.channels.give_up_hours)
        notifications.mark(conn, note["id"], retry_in_s=None if old else backoff_s(note["attempts"] + 1), error=error)
        if old:
            out.given_up += 1
            log.warning("notification given up", id=note["id"], channel=note["channel"], error=error)
        else:
            out.failed += 1
