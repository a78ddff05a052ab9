"""Decide when an agent started by a prolog (`--exit-when-idle`) may exit: no job left for a moment,
and nothing left to send, or given up on after a linger time."""

from __future__ import annotations

import structlog

log = structlog.get_logger("jobpulse.agent")


class IdleExit:
    def __init__(self, enabled: bool, flush_s: float, linger_s: float) -> None:
        self.enabled, self.flush_s, self.linger_s = enabled, flush_s, linger_s
        self._since: float | None = None

    def busy(self) -> None:
        """A job arrived: start over."""
        self._since = None

    def done(self, jobs: int, spooled: int, now: float) -> bool:
        if not self.enabled or jobs:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        if now - self._since < 2 * self.flush_s + 1:
            return False  # let the last samples and the unregistration go out first
        if spooled and now - self._since < self.linger_s:
            return False
        log.info("no job left: exiting", spooled=spooled)
        return True
