"""Store: fold the ingest ledger's old days into runs of consecutive seqs (`jobpulse.ingest_ranges`).

The ledger keeps a row per node batch so that a replayed batch is found and stored once. At a batch
a second per node those rows weighed about 45 bytes a GPU sample (more than the compact tier's
samples themselves), while what a replay check needs is only which seqs of an instance arrived.
The leader folds every ledger day before yesterday: in one transaction it deletes the day's rows and
merges them, with the runs their instances already have, into runs of consecutive seqs, their counts
summed. Dedup stays exact: a seq inside a run arrived; a seq that never arrived splits a run, so
its late replay is still stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time

import psycopg
from psycopg import sql

from jobpulse.collector.store.tiers import partitions


def _summed(column: str) -> str:
    """Per-table counts of a run: the sum of its batches' ``column`` documents (braces doubled for
    `sql.SQL`)."""
    return ("(SELECT coalesce(jsonb_object_agg(k, s), '{{}}') FROM (SELECT e.key AS k, sum(e.value::bigint) AS s"
            f" FROM unnest(m.{column}) AS j(v), jsonb_each_text(j.v) AS e GROUP BY e.key) AS z)")


_FOLD = """
WITH gone AS (DELETE FROM jobpulse.{day}
              RETURNING agent_instance, seq, created_at, cluster, node, agent_version, received_at, rows, dropped),
old AS (DELETE FROM jobpulse.ingest_ranges r WHERE r.agent_instance IN (SELECT agent_instance FROM gone)
        RETURNING r.agent_instance, r.first_seq, r.last_seq, r.cluster, r.node, r.agent_version, r.first_created,
                  r.last_created, r.last_received, r.batches, r.rows, r.dropped),
units AS (SELECT agent_instance, seq AS first_seq, seq AS last_seq, cluster, node, agent_version,
                 created_at AS first_created, created_at AS last_created, received_at AS last_received,
                 1::bigint AS batches, rows, dropped FROM gone
          UNION ALL SELECT * FROM old),
-- consecutive units share first_seq minus the seqs of the instance's units before them
runs AS (SELECT u.*, first_seq - coalesce(sum(last_seq - first_seq + 1) OVER (PARTITION BY agent_instance
                ORDER BY first_seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS run FROM units u),
m AS (SELECT agent_instance, min(first_seq) AS f, max(last_seq) AS l, min(cluster) AS cl, min(node) AS n,
             max(agent_version) AS v, min(first_created) AS fc, max(last_created) AS lc, max(last_received) AS lr,
             sum(batches) AS b, array_agg(rows) AS r, array_agg(dropped) AS d
        FROM runs GROUP BY agent_instance, run),
ins AS (INSERT INTO jobpulse.ingest_ranges (agent_instance, first_seq, last_seq, cluster, node, agent_version,
                                             first_created, last_created, last_received, batches, rows, dropped)
        SELECT agent_instance, f, l, cl, n, v, fc, lc, lr, b, """ + _summed("r") + ", " + _summed("d") + """ FROM m)
SELECT count(*) FROM gone"""


@dataclass(frozen=True)
class Folded:
    batches: int
    """Ledger rows folded."""
    dropped: list[date]
    """Ledger days dropped, empty once folded."""
    expired: int
    """Runs dropped past retention."""


def fold(conn: psycopg.Connection, before: date, retention_days: int) -> Folded:
    """Fold every ledger day before ``before`` (each day its own transaction) and drop it, then drop
    runs whose newest batch is past ``retention_days`` (such replays are refused anyway). Emptied
    days go because every batch's replay check probes every ledger day; a replay that later lands in
    one finds it missing and the collector makes it again (`partitions.ensure`), until the next fold.
    ``conn`` must be in autocommit."""
    folded, dropped = 0, []
    for day in sorted(d for d in partitions.existing(conn).get("ingest_batches", ()) if d < before):
        with conn.transaction():
            # This day's rows and their instances' runs are rewritten: a second fold of the same
            # instances (a leader taking over mid-fold) waits instead of duplicating runs.
            conn.execute("LOCK TABLE jobpulse.ingest_ranges IN SHARE ROW EXCLUSIVE MODE")
            row = conn.execute(sql.SQL(_FOLD).format(day=sql.Identifier(f"ingest_batches_p{day:%Y%m%d}"))).fetchone()
            folded += row[0] if row else 0
        if partitions.drop_if_empty(conn, "ingest_batches", day):
            dropped.append(day)
    cur = conn.execute("DELETE FROM jobpulse.ingest_ranges WHERE last_created < %s",
                       (datetime.combine(partitions.horizon(retention_days), time.min, UTC),))
    return Folded(folded, dropped, cur.rowcount)
