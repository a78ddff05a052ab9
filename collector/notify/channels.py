"""Channels: where flags are told while jobs run -- the site's webhooks (Slack/Mattermost-style or
generic JSON), filtered by category and severity (hardware trouble to the admins' channel), and a
job's own `notify` URL (its owner's opt-in from the job comment), code flags only, posted only to
the hosts the site allows. Read from the site's TOML file (`collector serve --notify FILE`)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from jobpulse.collector.store.state import notifications

FORMATS = ("slack", "json")
CATEGORIES = ("code", "hardware")
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Webhook:
    name: str
    url: str
    format: str = "slack"
    categories: tuple[str, ...] = CATEGORIES
    severities: tuple[str, ...] = ("warning", "critical")

    def wants(self, flag: dict[str, Any]) -> bool:
        return flag["category"] in self.categories and flag["severity"] in self.severities


@dataclass(frozen=True)
class Users:
    """Jobs' own webhooks: allowed hosts (none: users cannot opt in), format, limits."""

    hosts: tuple[str, ...] = ()
    format: str = "slack"
    severities: tuple[str, ...] = ("warning", "critical")
    per_hour: int = 10  # a user's notifications delivered per hour, at most (the rest wait)
    allow_http: bool = False  # plain http to the allowed hosts (an internal chat server)

    def url_for(self, flag: dict[str, Any]) -> str | None:
        url = flag.get("notify")
        if not url or flag["category"] != "code" or flag["severity"] not in self.severities:
            return None
        return self.allowed(str(url))

    def allowed(self, url: str) -> str | None:
        """``url`` as the HTTP client that posts it reads it, when it goes to an allowed host on the
        scheme's own port (another port only where ``hosts`` lists it as ``host:port``); None otherwise. Parsed by that client (httpx), not by a second parser that
        could read another host or drop a character the client refuses: what is stored is what is sent."""
        import httpx  # here: a collector without users' webhooks never loads it

        if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
            return None
        try:
            parsed = httpx.URL(url)
        except (httpx.InvalidURL, ValueError):
            return None
        where = parsed.host.lower() if parsed.port is None else f"{parsed.host.lower()}:{parsed.port}"
        if (parsed.scheme not in (("https", "http") if self.allow_http else ("https",))
                or where not in self.hosts or parsed.userinfo):
            return None
        return str(parsed)


@dataclass(frozen=True)
class DigestMail:
    """Who gets the periodic digest by mail (`jobpulse digest --mail`): users who opted in, and any
    user who wasted at least ``min_wasted_gpu_hours`` in the period; the admins get the hardware part."""

    smtp: str = "localhost:25"
    sender: str = "jobpulse@localhost"
    domain: str = ""  # user@domain; empty: no user mail
    opted_in: tuple[str, ...] = ()
    min_wasted_gpu_hours: float = 10.0
    admins: tuple[str, ...] = ()

    def wants(self, user: str, wasted: float) -> bool:
        return bool(self.domain) and user != "?" and (user in self.opted_in or wasted >= self.min_wasted_gpu_hours)


@dataclass(frozen=True)
class Channels:
    webhooks: tuple[Webhook, ...] = ()
    users: Users = field(default_factory=Users)
    timeout_s: float = 5.0
    give_up_hours: float = 24.0  # a receiver down this long: the notification is given up (counted, logged)
    digest: DigestMail = field(default_factory=DigestMail)

    @property
    def any(self) -> bool:
        return bool(self.webhooks or self.users.hosts)


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _choices(where: str, values: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: a non-empty list of {', '.join(allowed)}")
    return tuple(_choice(where, v, allowed) for v in values)


def load(path: Path) -> Channels:
    """The site's channels, or ValueError naming the bad setting."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"notify file {path}: {exc}") from None
    hooks = []
    for i, h in enumerate(data.get("webhook", [])):
        where = f"notify file {path}: webhook {h.get('name', i)!r}"
        url = str(h.get("url", ""))
        if urlsplit(url).scheme not in ("https", "http") or not urlsplit(url).hostname:
            raise ValueError(f"{where}: url must be an http(s) URL")
        hooks.append(Webhook(str(h.get("name") or f"webhook{i}"), url, _choice(where, h.get("format", "slack"), FORMATS),
                             _choices(where, h.get("categories", list(CATEGORIES)), CATEGORIES),
                             _choices(where, h.get("severities", ["warning", "critical"]), SEVERITIES)))
    if len({h.name for h in hooks}) != len(hooks) or "user" in {h.name for h in hooks}:
        raise ValueError(f"notify file {path}: webhook names must be unique and not 'user'")
    u = data.get("users", {})
    users = Users(tuple(str(x).lower() for x in u.get("hosts", [])),
                  _choice(f"notify file {path}: users", u.get("format", "slack"), FORMATS),
                  _choices(f"notify file {path}: users", u.get("severities", ["warning", "critical"]), SEVERITIES),
                  int(u.get("per_hour", 10)), bool(u.get("allow_http", False)))
    d = data.get("digest", {})
    digest = DigestMail(str(d.get("smtp", "localhost:25")), str(d.get("from", "jobpulse@localhost")),
                        str(d.get("mail_domain", "")), tuple(map(str, d.get("opted_in", []))),
                        float(d.get("min_wasted_gpu_hours", 10.0)), tuple(map(str, d.get("admins", []))))
    return Channels(tuple(hooks), users, float(data.get("timeout_s", 5.0)), float(data.get("give_up_hours", 24.0)),
                    digest)


def enqueue(conn: psycopg.Connection[Any], channels: Channels) -> int:
    """Outbox rows for the flags opened lately, one per flag and channel that wants it, and again when
    the flag rises to a higher severity (a `stalled` note become `hung`); a flag that falls, or
    reopens, was told already. Returns how many are new."""
    pending: list[notifications.Pending] = []
    for f in notifications.recent_flags(conn):
        pending += [(f["id"], h.name, h.url, h.format, f["user_name"], f["severity"])
                    for h in channels.webhooks if h.wants(f)]
        if (url := channels.users.url_for(f)) is not None:
            pending.append((f["id"], "user", url, channels.users.format, f["user_name"], f["severity"]))
    return notifications.enqueue(conn, pending)
