"""Serve the ingest app over HTTP with deadlines a slow or silent client cannot outlast.

uvicorn closes idle keep-alive connections, but not one that trickles its request headers a byte at
a time: each such connection would hold a socket and a file descriptor for as long as the client
likes. Here a request's headers must be complete within ``request_timeout_s`` of its first byte (or
of the connection's start); the body has the same deadline inside the app (`receive.read_body`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_open = 0  # HTTP connections open now in this process


def open_connections() -> int:
    """HTTP connections open now: every client that could still send a batch (group commit stops
    gathering once each of them has one waiting)."""
    return _open


def _protocol(timeout_s: float) -> type[HttpToolsProtocol]:
    class DeadlineProtocol(HttpToolsProtocol):
        """uvicorn's HTTP protocol, closing a connection whose request headers come too slowly."""

        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            global _open
            _open += 1
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self.cycle is None or self.cycle.response_complete:  # between requests: a new one starts
                self._arm()
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            global _open
            _open -= 1
            self._disarm()
            super().connection_lost(exc)

    return DeadlineProtocol


def serve(app: ASGIApp, host: str, port: int, request_timeout_s: float, **options: Any) -> None:
    """Run the app until SIGTERM/SIGINT, refusing to wait on slow clients."""
    uvicorn.run(app, host=host, port=port, http=_protocol(request_timeout_s), log_config=None, access_log=False,
                lifespan="on", timeout_graceful_shutdown=10, **options)
