"""What an admin sets: the collector's settings and the capture policy, each default written here
once (the CLI's options and their help take them from these classes). Plain data at the bottom of
the collector's layers: the service, the rules and the CLI all read it; it imports nothing of ours."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CapturePolicy:
    """Evidence asked of flagged ranks (`rules/capture_policy.py`): stacks, and traces where the job
    allowed them, each bounded site-wide per hour."""

    per_hour: int = 20  # site-wide; 0: no captures
    seconds: float = 5.0  # how long the stacks are sampled
    answer_s: float = 120.0  # a capture not answered by then failed
    traces_per_hour: int = 10  # site-wide; 0: no traces
    trace_steps: int = 5  # training steps one trace covers
    trace_wait_s: float = 120.0  # how long the agent waits for them
    trace_max_bytes: int = 8 * 2**20  # the largest compressed trace kept (a larger one keeps its summary only)
    trace_days: float = 14.0  # traces are dropped after this; their summaries stay


@dataclass(frozen=True)
class CollectorSettings:
    """What `jobpulse collector serve` runs with (its options)."""

    """What `jobpulse collector serve` runs with (its options)."""

    dsn: str
    token_file: Path
    max_body_bytes: int = 32 * 1024 * 1024
    retention_days: int = 30
    partitions_ahead_days: int = 3
    max_clock_skew_s: float = 300.0
    maintenance_interval_s: float = 3600.0
    retry_after_s: int = 2
    pool_max: int = 4
    rules_path: Path | None = None  # None: the shipped defaults (rules_default.toml)
    rules_interval_s: float = 30.0
    request_timeout_s: float = 10.0  # a body that takes longer is refused (408)
    group_wait_s: float = 0.005  # a group (one transaction) closes once no batch has come for this long
    group_max_wait_s: float = 0.02  # ... or this long after its first batch
    group_max_batches: int = 512
    fold_interval_s: float = 5.0  # the leader folds the samples ingest left raw into their roll-ups
    compact_interval_s: float = 60.0  # the leader compacts samples older than the hot window ...
    compact_budget_s: float = 5.0  # ... for at most this long per run, so rule cycles stay on time
    pyramid_interval_s: float = 60.0  # the cluster dashboards' per-node and per-job sums, rebuilt ...
    pyramid_budget_s: float = 10.0  # ... for at most this long per run (the first run catches up over several)
    group_writers: int = 2  # groups in flight at once (one fills while another commits)
    rules_processes: int = 0  # processes judging a share of the jobs each (0: the leader's own, rules/workers.py)
    log_level: str | None = None  # the rule processes' (None: as logging is set up by default)
    notify_path: Path | None = None  # where flags are told (TOML; collector/notify/channels.py); None: nowhere
    policy_path: Path | None = None  # the site policy on idle GPUs and hung jobs (TOML; notify/policy.py); None: off
    captures: CapturePolicy = field(default_factory=CapturePolicy)  # evidence asked of flagged ranks
    munge_socket: Path | None = None  # munged's, for users who fetch their own traces (None: its default)


def default(cls: type, name: str) -> Any:
    """The default of ``cls``'s field ``name``: what a CLI option shows and falls back to."""
    found = next(f for f in fields(cls) if f.name == name)
    return found.default_factory() if callable(found.default_factory) else found.default
