"""The agent's HTTP POST connection against a real TCP server that answers as scripted: keep-alive,
a connection the server closed while idle, chunked and close-delimited answers, garbage."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from jobpulse.agent.http_post import Connection, ProtocolError

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nRetry-After: 7\r\n\r\nok"


class Scripted:
    """Accepts connections; on each request answers the next scripted reply, then closes the
    connection when the reply is followed by None. Records every request body it read."""

    def __init__(self, replies: list[bytes | None]) -> None:
        self.replies = replies
        self.bodies: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/base"

    def _serve(self) -> None:
        while self.replies:
            conn, _ = self.sock.accept()
            self.connections += 1
            with conn, conn.makefile("rb") as f:
                while self.replies:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        line = f.readline()
                        if not line:
                            break
                        head += line
                    if not head:
                        break
                    length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
                                 .split(b":")[1])
                    self.bodies.append(f.read(length))
                    conn.sendall(self.replies.pop(0) or b"")
                    if self.replies and self.replies[0] is None:
                        self.replies.pop(0)
                        break


@pytest.fixture
def connect() -> Iterator[Callable[[Scripted], Connection]]:
    made: list[Connection] = []

    def make(server: Scripted) -> Connection:
        c = Connection(urlsplit(server.url), "/base/v1/batches", {"Authorization": "Bearer t"}, 5.0)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()


def test_keep_alive_and_a_connection_closed_while_idle_is_reopened(connect: Callable[[Scripted], Connection]) -> None:
    server = Scripted([OK, OK, None, OK])
    c = connect(server)
    first = c.post(b"one")
    assert (first.status, first.headers["retry-after"], first.body) == (200, "7", b"ok")
    assert c.post(b"two").status == 200
    assert c.post(b"three").status == 200  # the server closed after "two": sent again on a new connection
    assert server.bodies == [b"one", b"two", b"three"] and server.connections == 2


def test_chunked_and_close_delimited_answers(connect: Callable[[Scripted], Connection]) -> None:
    chunked = b"HTTP/1.1 422 Unprocessable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n"
    server = Scripted([chunked, b"HTTP/1.0 503 Busy\r\n\r\nlater", None])
    c = connect(server)
    r = c.post(b"x")
    assert (r.status, r.body) == (422, b"abcde")
    r = c.post(b"y")
    assert (r.status, r.body) == (503, b"later")


def test_garbage_is_a_protocol_error_and_the_next_post_reconnects(connect: Callable[[Scripted], Connection]) -> None:
    server = Scripted([b"SSH-2.0-OpenSSH\r\n", None, OK])
    c = connect(server)
    with pytest.raises(ProtocolError, match="not an HTTP status line"):
        c.post(b"x")
    assert c.post(b"y").status == 200
    assert server.connections == 2
