"""The two ways a request fails without being our bug: the sender's fault, or the database's."""

from __future__ import annotations


class Rejected(Exception):
    """Bad input: answered with a 4xx naming the reason (and the field, when there is one)."""

    def __init__(self, status: int, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.field = field


class Unavailable(Exception):
    """The database cannot take the batch now: answered 503 with Retry-After; the agent spools."""
