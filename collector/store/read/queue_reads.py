"""Store: what waits in each partition (slurm-sync's readings, `partition_queue`) beside the GPUs held
idle there: the reading the idle and hang policies gate on, and the digest's "GPUs idle while jobs
waited"."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from jobpulse.schema.semantics import IDLE_PERCENT, activity_mean_sql

BUCKET_S = 300
"""The idle GPUs are judged per 300 s roll-up bucket (a GPU idle in a bucket: its mean activity at
most IDLE_PERCENT), and the queue's readings of the same bucket beside them."""


def waiting(conn: psycopg.Connection[Any], cluster: str, partition: str | None) -> dict[str, Any] | None:
    """The partition's latest reading of the last 10 minutes (`partition_queue_now`), or None."""
    if not partition:
        return None
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute("SELECT partition, ts, jobs_pending, gpu_jobs_pending, gpus_pending, source"
                       " FROM jobpulse.partition_queue_now WHERE cluster = %s AND partition = %s",
                       (cluster, partition)).fetchone()


def idle_while_waiting(conn: psycopg.Connection[Any], start: datetime, end: datetime,
                       cluster: str | None) -> list[dict[str, Any]]:
    """Per partition, over the 300 s buckets of [start, end) in which jobs waited there for GPUs and GPUs
    of its running jobs were idle: the GPU-hours idle so, and the bucket with the most idle GPUs (when,
    how many, how many jobs waited for how many GPUs then; the bucket's largest reading)."""
    cur = conn.cursor(row_factory=dict_row)
    return cur.execute(f"""
WITH q AS (SELECT cluster, partition, to_timestamp(floor(extract(epoch FROM ts) / {BUCKET_S}) * {BUCKET_S}) AS bucket,
                  max(gpu_jobs_pending) AS jobs, max(gpus_pending) AS gpus
             FROM jobpulse.partition_queue
            WHERE ts >= %(start)s AND ts < %(end)s AND gpu_jobs_pending > 0
              AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s)
            GROUP BY 1, 2, 3),
idle AS (SELECT g.cluster, j.partition, g.bucket, count(*) AS gpus
           FROM (SELECT cluster, job_id, node, gpu_uuid, bucket FROM jobpulse.gpu_rollup
                  WHERE width_s = {BUCKET_S} AND bucket >= %(start)s AND bucket < %(end)s AND job_id IS NOT NULL
                    AND (%(cluster)s::text IS NULL OR cluster = %(cluster)s)
                  GROUP BY 1, 2, 3, 4, 5 HAVING {activity_mean_sql()} <= {IDLE_PERCENT}) g
           JOIN jobpulse.jobs j USING (cluster, job_id)
          GROUP BY 1, 2, 3)
SELECT q.cluster, q.partition, round(sum(i.gpus) * {BUCKET_S} / 3600.0, 2)::float8 AS idle_gpu_hours,
       (array_agg(q.bucket ORDER BY i.gpus DESC, q.bucket))[1] AS peak_at,
       (array_agg(i.gpus ORDER BY i.gpus DESC, q.bucket))[1] AS idle_gpus,
       (array_agg(q.jobs ORDER BY i.gpus DESC, q.bucket))[1] AS jobs_waiting,
       (array_agg(q.gpus ORDER BY i.gpus DESC, q.bucket))[1] AS gpus_asked
  FROM q JOIN idle i USING (cluster, partition, bucket)
 GROUP BY 1, 2 ORDER BY idle_gpu_hours DESC, 1, 2""", {"start": start, "end": end, "cluster": cluster}).fetchall()
