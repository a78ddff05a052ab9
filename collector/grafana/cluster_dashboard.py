"""The cluster dashboard: running jobs, every GPU at a glance, and where GPU-hours are wasted."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap
from grafana_foundation_sdk.models import dashboard as dm

from jobpulse.collector.grafana.layout import finish
from jobpulse.collector.grafana.panels import (
    CELLS,
    DS,
    PYRAMID_WIDTH,
    Sql,
    capped_time,
    gpu_name,
    table_panel,
    ts,
    variable,
)
from jobpulse.collector.store.tiers import pyramid
from jobpulse.schema.semantics import IDLE_PERCENT, activity_mean_sql

IDLE_NOW = """FROM jobpulse.gpu_rollup r JOIN jobpulse.jobs j USING (cluster, job_id)
             WHERE r.width_s = 300 AND r.cluster = '$cluster' AND j.end_time IS NULL
               AND r.bucket > now() - interval '30 minutes'
             GROUP BY r.job_id, r.node, r.gpu_uuid
            HAVING coalesce(max(r.last_busy_ts), min(r.first_ts)) < max(r.last_ts) - interval '1 minute'"""
"""The GPUs of running jobs idle for more than a minute (last 30 min): one row a GPU, its job's
columns aggregated (``max(j.user_name)``)."""
HEATMAP_GPUS = 256  # GPUs (MIG slices) up to which the heatmap draws a row per GPU, beyond it one per node


def cluster_dashboard() -> dm.Dashboard:
    # The GPUs and nodes of the pyramid's newest two 300 s buckets up to the range's end, however old
    # (a few thousand rows, cheaper than counting topology_current: `bench/grafana.py`, cluster case). Not "the last 10
    # minutes": a cluster whose agents all fell silent would then count as small, and the heatmap
    # read every GPU's roll-ups (seconds at 8,000 GPUs).
    newest = f"""jobpulse.node_rollup WHERE cluster = '$cluster' AND width_s = {pyramid.WIDTH_S}
                   AND bucket >= (SELECT max(bucket) FROM jobpulse.node_rollup WHERE cluster = '$cluster'
                                   AND width_s = {pyramid.WIDTH_S} AND bucket <= $__timeTo()::timestamptz)
                                 - interval '{pyramid.WIDTH_S} seconds'
                   AND bucket <= $__timeTo()::timestamptz"""
    few = f"""(coalesce((SELECT max(gpus) FROM (SELECT sum(gpus) AS gpus FROM {newest} GROUP BY bucket) b), 0)
              <= {HEATMAP_GPUS})"""
    nodes = f"(SELECT count(DISTINCT node) FROM {newest})"
    # 10 s cells up to 30 minutes while the 10 s buckets exist (they are kept while samples are raw)
    fine = ("($__timeTo()::timestamptz - $__timeFrom()::timestamptz <= interval '30 minutes'"
            " AND $__timeFrom()::timestamptz >= jobpulse.gpu_rollup_10s_since())")
    d = (db.Dashboard("jobpulse · cluster").uid("jobpulse-cluster").tags(["jobpulse", "slurm", "gpu"])
         .refresh("30s").time("now-6h", "now").timezone("browser").editable()
         .description("Running jobs, GPUs at a glance, and where GPU-hours are wasted."))
    d = (d.with_variable(variable("cluster", "cluster", "SELECT DISTINCT cluster FROM jobpulse.jobs ORDER BY 1"))
         .with_variable(db.CustomVariable("group_by").label("waste by").values(
             "user : user_name, account : account, partition : partition")))
    panels = [
        table_panel("Running jobs", f"""
            SELECT j.job_id, j.user_name, j.partition, j.job_name, array_to_string(j.nodes, ',') AS nodes,
                   j.gpus_total, j.start_time,
                   round(({activity_mean_sql("r.")})::numeric, 1)
                       AS util_recent,
                   (SELECT count(*) FROM jobpulse.job_flags f WHERE f.cluster = j.cluster AND f.job_id = j.job_id
                       AND f.ended_at IS NULL) AS open_flags
              FROM jobpulse.jobs j
              LEFT JOIN jobpulse.gpu_rollup r ON r.width_s = 300 AND r.cluster = j.cluster AND r.job_id = j.job_id
                   AND r.bucket > now() - interval '15 minutes'
             WHERE j.cluster = '$cluster' AND j.end_time IS NULL
             GROUP BY j.cluster, j.job_id ORDER BY open_flags DESC, util_recent NULLS FIRST""", h=9,
                    desc="util_recent: mean activity of the job's GPUs over the last 10 to 15 minutes (its 300 s "
                         "roll-ups; 10 s ones would read 30 times the rows on a cluster of thousands of GPUs)."),
        heatmap.Panel().title("Node x GPU activity").datasource(DS).span(24).height(10).calculate(False)
        .description(f"Colour = mean activity (SM activity where measured). On a cluster of at most {HEATMAP_GPUS} "
                     "GPUs (in the newest roll-ups up to the range's end) each row is a GPU (node/GPU index), a MIG slice its own row (with its profile and GPU "
                     "instance), 10 s cells up to 30 minutes (5-minute cells for the days before the 10 s "
                     "buckets' two to three days), 5-minute cells beyond. On a larger cluster a row "
                     "per GPU is more rows than the panel has pixels: each row is a node (the mean of its "
                     "GPUs), from the per-node sums the collector keeps (a minute behind), in cells of 5 minutes or "
                     f"more (whole hours beyond a 6-hour range): at most {CELLS:,} cells in all.")
        .with_target(Sql(f"""
            SELECT $__timeGroupAlias(bucket, $__interval), {gpu_name("max(gpu_index)")} AS metric,
                   {activity_mean_sql()} AS value
              FROM jobpulse.gpu_rollup_10s
             WHERE {fine} AND cluster = '$cluster' AND $__timeFilter(bucket) AND {few}
             GROUP BY 1, node, gpu_uuid
            UNION ALL
            SELECT $__timeGroupAlias(bucket, $__interval), {gpu_name("max(gpu_index)")} AS metric,
                   {activity_mean_sql()} AS value
              FROM jobpulse.gpu_rollup
             WHERE width_s = 300 AND NOT {fine} AND cluster = '$cluster' AND $__timeFilter(bucket) AND {few}
             GROUP BY 1, node, gpu_uuid
            UNION ALL
            SELECT extract(epoch FROM t), node, value FROM (
                SELECT {capped_time("bucket", nodes, PYRAMID_WIDTH)} AS t, node, {activity_mean_sql()} AS value
                  FROM jobpulse.node_rollup
                 WHERE cluster = '$cluster' AND width_s = {PYRAMID_WIDTH} AND $__timeFilter(bucket) AND NOT {few}
                 GROUP BY 1, node) per_node
             ORDER BY 1, 2""")),
        # Summed per bucket and group before Grafana's time groups: its macro is numeric arithmetic,
        # which per row of a busy week (270,000 job rows) cost a third of the query.
        ts("Wasted GPU-hours by $group_by", f"""
            SELECT $__timeGroupAlias(bucket, $__interval), metric, sum(wasted_s) / 3600 AS value
              FROM (SELECT p.bucket, coalesce(j.${{group_by:raw}}, '?') AS metric, sum(p.wasted_s) AS wasted_s
                      FROM jobpulse.job_bucket_rollup p JOIN jobpulse.jobs j USING (cluster, job_id)
                     WHERE p.cluster = '$cluster' AND p.width_s = {PYRAMID_WIDTH} AND $__timeFilter(p.bucket)
                     GROUP BY 1, 2) per_bucket
             GROUP BY 1, 2 ORDER BY 1, 2""", "h", stack=True, w=24,
            desc="Per bucket: GPU-seconds allocated but not busy, in hours. A MIG slice counts as its share "
                 "of the GPU (its compute slices of the GPU's), an MPS job as its share (its activity is "
                 "its own processes' part of the whole GPU). From the per-job sums the collector keeps "
                 "(a minute behind): per 5 minutes up to a 6-hour range, per hour beyond."),
        ts("Goodput of ended jobs: productive and badput GPU-hours by cause", """
            SELECT $__timeGroupAlias(end_time, $__interval), 'productive' AS metric,
                   sum((summary #>> '{goodput,productive_gpu_hours}')::float8) AS value
              FROM jobpulse.job_summaries
             WHERE cluster = '$cluster' AND $__timeFilter(end_time) AND summary ? 'goodput'
             GROUP BY 1, 2
            UNION ALL
            SELECT $__timeGroupAlias(s.end_time, $__interval), b.key, sum(b.value::float8)
              FROM jobpulse.job_summaries s, jsonb_each_text(s.summary #> '{goodput,badput_gpu_hours}') b
             WHERE s.cluster = '$cluster' AND $__timeFilter(s.end_time)
             GROUP BY 1, 2
             ORDER BY 1, 2""", "h", stack=True, w=24,
           desc="Each ended job's allocated GPU-hours, at its end, split into productive time and badput by cause "
                "(start-up, idle, input stalls, checkpoints, evaluation, hung, lost to failure): the cluster's "
                "goodput (effective training time ratio) over time. From the job summaries: kept after raw "
                "samples are gone."),
        table_panel("Top idle GPUs now", f"""
            SELECT r.job_id, max(j.user_name) AS user_name, {gpu_name("max(r.gpu_index)")} AS gpu,
                   round(extract(epoch FROM max(r.last_ts) - coalesce(max(r.last_busy_ts), min(r.first_ts))) / 60)
                       AS idle_minutes, max(r.max_fb_used_mib) AS memory_mib
              {IDLE_NOW}
             ORDER BY idle_minutes DESC LIMIT 20""", w=12, h=9,
               desc=f"GPUs of running jobs idle (<= {IDLE_PERCENT} %) for more than a minute, longest first "
                    "(last 30 min)."),
        table_panel("Idle GPUs beside the queue", f"""
            WITH idle AS (SELECT partition, count(*) AS idle_gpus FROM (
                   SELECT max(j.partition) AS partition {IDLE_NOW}) g
                  GROUP BY 1),
                 q AS (SELECT * FROM jobpulse.partition_queue_now WHERE cluster = '$cluster')
            SELECT coalesce(idle.partition, q.partition) AS partition, coalesce(idle.idle_gpus, 0) AS idle_gpus,
                   q.gpu_jobs_pending AS jobs_waiting_for_gpus, q.gpus_pending AS gpus_asked,
                   q.jobs_pending AS jobs_waiting, q.source, q.ts AS read_at
              FROM idle FULL JOIN q ON q.partition = idle.partition
             ORDER BY (coalesce(idle.idle_gpus, 0) > 0 AND q.gpu_jobs_pending > 0) DESC,
                      coalesce(idle.idle_gpus, 0) * coalesce(q.gpus_pending, 0) DESC, 1""", w=12, h=9,
                    desc=f"Per partition: GPUs of running jobs idle (<= {IDLE_PERCENT} %) for more than a minute "
                         "(last 30 min), beside what waits there now (slurm-sync's latest reading of the last 10 "
                         "minutes): jobs waiting for GPUs and the GPUs they ask, all jobs waiting (pending, not "
                         "held), and what counted them (slurmctld's OpenMetrics or squeue). Idle GPUs where others "
                         "wait first. No reading: the sync is not running or saw no job there."),
        table_panel("Open flags by rule", """
            SELECT f.rule_id, f.category, count(*) AS open_flags, count(DISTINCT f.job_id) AS jobs
              FROM jobpulse.job_flags f WHERE f.cluster = '$cluster' AND f.ended_at IS NULL
             GROUP BY 1, 2 ORDER BY 3 DESC""", w=12, h=9),
    ]
    return finish(d, panels)
