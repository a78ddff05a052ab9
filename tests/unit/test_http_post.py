"""The agent's HTTP POST connection against a real TCP server that answers as scripted: keep-alive,
a connection the server closed while idle, chunked and close-delimited answers, garbage, TLS."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from jobpulse.agent.shipping.http_post import Connection, ProtocolError

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nRetry-After: 7\r\n\r\nok"


class Scripted:
    """Accepts connections; on each request answers the next scripted reply, then closes the
    connection when the reply is followed by None. Records every request body it read."""

    def __init__(self, replies: list[bytes | None], tls: ssl.SSLContext | None = None) -> None:
        self.replies = replies
        self.tls = tls
        self.bodies: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        scheme, host = ("https", "localhost") if self.tls else ("http", "127.0.0.1")
        return f"{scheme}://{host}:{self.sock.getsockname()[1]}/base"

    def _serve(self) -> None:
        while self.replies:
            conn, _ = self.sock.accept()
            self.connections += 1
            if self.tls:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError):  # the client refused our certificate
                    conn.close()
                    continue
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


@pytest.fixture
def certificate(tmp_path: Path) -> Path:
    """A self-signed certificate for localhost (its own CA), key in the same PEM file."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificate (Debian: apt install openssl)")
    pem = tmp_path / "localhost.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", pem, "-out", pem],
                   check=True, capture_output=True)
    return pem


def test_https_verifies_the_collector_against_the_trusted_certificates(
        connect: Callable[[Scripted], Connection], certificate: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(certificate)
    untrusted = Scripted([OK], tls=served)
    with pytest.raises(ssl.SSLCertVerificationError):
        connect(untrusted).post(b"x")  # the system's CAs do not know this certificate
    assert untrusted.bodies == []
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # how a site trusts its own CA
    server = Scripted([OK, OK], tls=served)
    c = connect(server)
    assert c.post(b"one").status == 200 and c.post(b"two").status == 200
    assert server.bodies == [b"one", b"two"] and server.connections == 1
