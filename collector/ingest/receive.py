"""Receive: read a request body within a size limit and a deadline, gunzip it within the same limit."""

from __future__ import annotations

import asyncio
import zlib

from starlette.requests import Request

from jobpulse.collector.errors import Rejected


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, decompressed when ``Content-Encoding: gzip``; 413 past ``limit`` bytes, 408
    when it takes longer than ``timeout_s`` to arrive."""
    try:
        async with asyncio.timeout(timeout_s):
            body = await _read(request, limit)
    except TimeoutError:
        raise Rejected(408, f"the body did not arrive within {timeout_s:g} s") from None
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        raise Rejected(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none", "Content-Encoding")
    return gunzip(body, limit)


async def _read(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise Rejected(400, "Content-Length is not a number", "Content-Length")
        if int(declared) > limit:
            raise Rejected(413, f"body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Rejected(413, f"body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def gunzip(data: bytes, limit: int) -> bytes:
    """Decompress gzip data, refusing more than ``limit`` bytes of output (no zip bombs)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
        if len(out) > limit or inflater.unconsumed_tail:
            raise Rejected(413, f"decompressed body exceeds the limit of {limit} bytes")
        out += inflater.flush()
    except zlib.error as exc:
        raise Rejected(400, f"body is not valid gzip: {exc}", "Content-Encoding") from None
    if not inflater.eof:
        raise Rejected(400, "gzip body is truncated", "Content-Encoding")
    if inflater.unused_data:  # a second gzip member or trailing bytes: never silently ignored
        raise Rejected(400, f"{len(inflater.unused_data)} bytes follow the gzip stream (one member expected)",
                       "Content-Encoding")
    return out
