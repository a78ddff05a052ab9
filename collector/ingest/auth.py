"""Bearer-token check for agents.

The token file holds one token per line (blank lines and ``#`` comments ignored), so tokens
can be rotated by adding the new one before removing the old. The file is re-read when its
modification time changes. Every configured token is compared in constant time.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path


class TokenFile:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._mtime: float | None = None
        self._tokens: tuple[bytes, ...] = ()
        self._load()
        if not self._tokens:
            raise ValueError(f"token file {self.path} holds no token")

    def _load(self) -> None:
        mtime = os.stat(self.path).st_mtime
        if mtime == self._mtime:
            return
        lines = self.path.read_text(encoding="utf-8").splitlines()
        self._tokens = tuple(t.strip().encode() for t in lines if t.strip() and not t.strip().startswith("#"))
        self._mtime = mtime

    def allows(self, authorization: str | None) -> bool:
        """True when the ``Authorization`` header carries a configured bearer token."""
        if not authorization:
            return False
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return False
        try:
            self._load()
        except OSError:
            pass  # keep the tokens we had: a file being rewritten must not lock agents out
        given = presented.strip().encode("utf-8", "replace")
        ok = False
        for token in self._tokens:
            ok |= hmac.compare_digest(token, given)
        return ok
