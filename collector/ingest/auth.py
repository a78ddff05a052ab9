"""Authenticate agents by bearer token and say which nodes and cluster each token may write as.

The token file holds one token per line (blank lines and ``#`` comments ignored), optionally
bound to a cluster and to node name globs::

    3f9c...e1                                   # any node, any cluster (one shared token)
    8a41...07  cluster=alpha  nodes=gpu[0-9]*   # only alpha's nodes gpu0..., as the prolog hands out
    c0de...42  cluster=alpha  nodes=ctl1  role=controller   # slurm-sync on ctl1: any job of alpha

A token that is not bound to nodes may write as any node, and anything of any job: give each node
(or rack) its own bound token so a stolen one cannot write another node's data. A node-bound token
writes only for jobs Slurm placed on its node, and a job's job-wide facts only as the job's first
node (`authority`); ``role=controller`` marks the token of `jobpulse-agent slurm-sync`, whose
records speak for slurmctld about every job of its cluster. Tokens rotate by adding the new line before removing
the old; the file is re-read when it changes. A file being rewritten never locks agents out, but a
deleted or emptied file revokes every token, loudly. Every token is compared in constant time.
"""

from __future__ import annotations

import fnmatch
import hmac
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("jobpulse.collector.auth")


@dataclass(frozen=True)
class Grant:
    """What one token may write."""

    token: bytes
    cluster: str | None = None  # None: any cluster
    nodes: tuple[str, ...] = ()  # fnmatch globs; empty: any node
    controller: bool = False  # role=controller: slurm-sync, which speaks for slurmctld

    @property
    def node_bound(self) -> bool:
        """Whether what it writes is held to its node's jobs (`authority`): bound to nodes, no controller."""
        return bool(self.nodes) and not self.controller

    def covers(self, cluster: str, node: str) -> bool:
        return (self.cluster is None or self.cluster == cluster) and (
            not self.nodes or any(fnmatch.fnmatchcase(node, glob) for glob in self.nodes))


def parse(text: str, source: str) -> tuple[Grant, ...]:
    """The grants of a token file's text; ValueError naming the line of a malformed one."""
    grants = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].split()
        if not line:
            continue
        token, options = line[0], {}
        for item in line[1:]:
            key, sep, value = item.partition("=")
            if not sep or key not in ("cluster", "nodes", "role") or not value or (
                    key == "role" and value != "controller"):
                raise ValueError(f"{source}:{number}: expected TOKEN [cluster=NAME] [nodes=GLOB,...] [role=controller],"
                                 f" got {item!r}")
            options[key] = value
        nodes = tuple(filter(None, options.get("nodes", "").split(",")))
        grants.append(Grant(token.encode(), options.get("cluster"), nodes, options.get("role") == "controller"))
    return tuple(grants)


def warn_if_readable(path: Path, what: str) -> None:
    """Log a warning when a secret file can be read by group or others."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file readable by others", file=str(path), mode=oct(stat.S_IMODE(mode)),
                    fix=f"chmod 600 {path}", what=what)


class TokenFile:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._mtime: float | None = None
        self._grants: tuple[Grant, ...] = ()
        self._load()
        if not self._grants:
            raise ValueError(f"token file {self.path} holds no token")

    def _load(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime
        except FileNotFoundError:
            if self._grants:
                log.error("token file deleted: every token revoked, agents are refused", file=str(self.path))
            self._grants, self._mtime = (), None
            return
        if mtime == self._mtime:
            return
        grants = parse(self.path.read_text(encoding="utf-8"), str(self.path))
        if not grants:
            log.error("token file holds no token: every agent is refused", file=str(self.path))
        elif self._mtime is not None:
            log.info("token file reloaded", file=str(self.path), tokens=len(grants))
        warn_if_readable(self.path, "collector tokens")
        self._grants, self._mtime = grants, mtime

    def grant(self, authorization: str | None) -> Grant | None:
        """The grant of the bearer token in an ``Authorization`` header, or None."""
        if not authorization:
            return None
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return None
        try:
            self._load()
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            log.error("token file unreadable, keeping the tokens loaded before", file=str(self.path), error=str(exc))
        given = presented.strip().encode("utf-8", "replace")
        found = None
        for g in self._grants:  # every token compared: the time taken does not tell which matched
            if hmac.compare_digest(g.token, given):
                found = g
        return found
