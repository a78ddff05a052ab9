"""Command-line value types both CLIs share (`jobpulse`, `jobpulse-agent`)."""

from __future__ import annotations

import argparse


def listen_address(value: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 hosts in brackets); an empty host listens on all addresses."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)
