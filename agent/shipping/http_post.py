"""One kept-alive HTTP/1.1 connection that POSTs a batch and reads the answer.

The agent sends one small request a second for as long as it runs; ``http.client`` builds each
request from header calls and parses each answer's headers through ``email.parser``, which cost
more CPU than the batch's gzip. This writes the request as one prepared byte string and reads only
what the shipper needs: the status, the headers (lower-cased names) and the body.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import SplitResult

MAX_HEADER_LINE = 8192
MAX_HEADERS = 100
MAX_BODY = 1 << 20  # an answer is a short JSON document: a longer one is not the collector's


class ProtocolError(Exception):
    """The peer's answer is not HTTP/1.x as the collector sends it."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class Connection:
    """POSTs to one endpoint over one connection, opened on first use and after any failure or a
    ``Connection: close``; a kept connection the server closed while idle is reopened and the
    request sent once more (the collector acknowledges a batch it already stored)."""

    def __init__(self, endpoint: SplitResult, path: str, headers: dict[str, str], timeout_s: float) -> None:
        if endpoint.hostname is None:
            raise ValueError(f"no host in {endpoint.geturl()!r}")
        self.host = endpoint.hostname
        self.tls = endpoint.scheme == "https"
        self.port = endpoint.port or (443 if self.tls else 80)
        self.timeout_s = timeout_s
        default_port = self.port == (443 if self.tls else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        lines = [f"POST {path} HTTP/1.1", f"Host: {host}" + ("" if default_port else f":{self.port}"),
                 *(f"{k}: {v}" for k, v in headers.items())]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self._sock: socket.socket | None = None
        self._reader: BinaryIO | None = None  # buffered reads over the socket, kept with it

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._reader = None

    def _open(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        self._sock, self._reader = sock, sock.makefile("rb")

    def post(self, body: bytes) -> Response:
        """Send ``body``, return the answer; OSError (timeouts included) or ProtocolError when
        there is none, with the connection closed."""
        request = self._head + b"%d\r\n\r\n" % len(body) + body
        reused = self._sock is not None
        try:
            try:
                return self._exchange(request)
            except (ConnectionError, _Closed):
                if not reused:
                    raise
                self.close()  # closed by the server while idle: once more on a new connection
                return self._exchange(request)
        except _Closed:
            self.close()
            raise ProtocolError("connection closed before an answer") from None
        except BaseException:
            self.close()
            raise

    def _exchange(self, request: bytes) -> Response:
        if self._sock is None:
            self._open()
        assert self._sock is not None and self._reader is not None
        self._sock.settimeout(self.timeout_s)
        self._sock.sendall(request)
        status_line = self._reader.readline(MAX_HEADER_LINE + 1)
        if not status_line:
            raise _Closed
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"not an HTTP status line: {status_line[:80]!r}")
        headers = self._headers()
        body = self._body(headers)
        if headers.get("connection", "").lower() == "close" or parts[0] == b"HTTP/1.0":
            self.close()
        return Response(int(parts[1]), headers, body)

    def _headers(self) -> dict[str, str]:
        assert self._reader is not None
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS):
            line = self._reader.readline(MAX_HEADER_LINE + 1)
            if line in (b"\r\n", b"\n"):
                return headers
            if not line.endswith(b"\n"):
                raise ProtocolError("header line too long or cut off")
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise ProtocolError(f"not a header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        raise ProtocolError(f"more than {MAX_HEADERS} header lines")

    def _body(self, headers: dict[str, str]) -> bytes:
        assert self._reader is not None
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks, size = [], 0
            while (n := self._chunk_size()) > 0:
                size += n
                if size > MAX_BODY:
                    raise ProtocolError("answer too long")
                chunks.append(self._exactly(n))
                self._exactly(2)  # the CRLF after each chunk
            while self._reader.readline(MAX_HEADER_LINE + 1) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        length = headers.get("content-length")
        if length is None:
            body = self._reader.read(MAX_BODY + 1)  # to the end of the connection
            headers["connection"] = "close"
        elif not length.isdigit() or int(length) > MAX_BODY:
            raise ProtocolError(f"Content-Length {length[:20]!r}")
        else:
            body = self._exactly(int(length))
        if len(body) > MAX_BODY:
            raise ProtocolError("answer too long")
        return body

    def _chunk_size(self) -> int:
        assert self._reader is not None
        line = self._reader.readline(MAX_HEADER_LINE + 1).split(b";", 1)[0].strip()
        try:
            return int(line, 16)
        except ValueError:
            raise ProtocolError(f"chunk size {line[:20]!r}") from None

    def _exactly(self, n: int) -> bytes:
        assert self._reader is not None
        data = self._reader.read(n)
        if len(data) < n:
            raise ProtocolError("connection closed inside an answer")
        return data


class _Closed(Exception):
    """The connection ended before the status line."""
