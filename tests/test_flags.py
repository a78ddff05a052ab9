"""The flag lifecycle in PostgreSQL: a hit opens a flag, later hits refresh the same row, and a
flag of a running job closes only once it has not been hit for the hold time (hysteresis)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg

from jobpulse.collector.rules.model import Hit
from jobpulse.collector.store import flags


def test_a_flickering_condition_stays_one_flag(dsn: str) -> None:
    hit = Hit("input_bound", "warning", "code", "gpu", "n1/GPU-x", datetime.now(timezone.utc), {"pattern": "stalls"},
              "use more workers")
    key = ("c", "1")
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO jobpulse.jobs (cluster, job_id, start_time) VALUES ('c', '1', now())")
        conn.commit()
        hold = timedelta(minutes=2)
        for found in ([hit], [], [hit], []):  # the condition flickers from cycle to cycle
            flags.write(conn, {key: found}, datetime.now(timezone.utc), hold)
        rows = conn.execute("SELECT ended_at IS NULL, last_seen FROM jobpulse.job_flags").fetchall()
        assert len(rows) == 1 and rows[0][0], "one flag, still open within the hold time"
        kept, closed = flags.write(conn, {key: []}, datetime.now(timezone.utc), timedelta(0))
        ended, last_seen = conn.execute("SELECT ended_at, last_seen FROM jobpulse.job_flags").fetchone()
    assert (kept, closed) == (0, 1) and ended == last_seen, "closed at its last hit, not at the cycle"
