"""The job dashboard: one Slurm job, every GPU and rank second by second, with its events and flags.

Long ranges read the series functions over the roll-ups (`gpu_series`, `rank_series`,
`step_series`), so a 24 h job on 64 GPUs draws from a few thousand rows. Single-value variables are
quoted in the SQL ('$job'), multi-value ones are lists (IN ($node)): see docs/grafana.md.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import stat
from grafana_foundation_sdk.models import dashboard as dm

from jobpulse.collector.grafana.layout import finish
from jobpulse.collector.grafana.panels import DS, REFRESH, Sql, annotation, gpu_name, table_panel, ts, variable
from jobpulse.collector.store.read.mig_shares import slice_shares_sql
from jobpulse.schema.semantics import activity_bucket_sql

JOB = "cluster = '$cluster' AND job_id = '$job'"


# Points one panel asks for at most: past this, lines overlap on screen anyway, so the step
# grows with the number of series (one node's 8 GPUs over 15 min: every second; 64 GPUs: 7 s, drawn
# from 10 s roll-ups; 64 GPUs over 6 h: 5 min). A panel stays within a few thousand rows read.
POINTS = 8_000


def _range_call(function: str, series: str) -> str:
    """FROM one of the series functions (`gpu_series` from `store/read/series.py`, `rank_series` and
    `step_series` from `store/migrate/sql/`), which read the finest source that is fast for the range; the
    step is Grafana's interval, raised to keep `series` x steps within POINTS."""
    step = (f"greatest($__interval_ms / 1000, ceil(extract(epoch FROM $__timeTo()::timestamptz"
            f" - $__timeFrom()::timestamptz) * {series} / {POINTS}))::int")
    return f"FROM jobpulse.{function}('$cluster', '$job', $__timeFrom(), $__timeTo(), {step})"


GPUS = "cardinality(ARRAY[$gpu])"  # series in a panel: the GPUs or ranks chosen
RANKS = "cardinality(ARRAY[$rank])"
NAME = gpu_name()
WHERE_GPU = "WHERE node IN ($node) AND gpu_uuid IN ($gpu)"


def _gpu_metric(column: str) -> str:
    return (f"SELECT time, {NAME} AS metric, {column} AS value {_range_call('gpu_series', GPUS)} {WHERE_GPU}"
            " ORDER BY 1, 2")


def _gpu_rx_tx(link: str) -> str:
    """Receive and transmit of one link type per GPU, in bytes/s (one series call, unpivoted)."""
    return f"""
            SELECT time, {NAME} || x.k AS metric, x.v * 1000 AS value
              {_range_call('gpu_series', '2 * ' + GPUS)},
                   LATERAL (VALUES (' rx', {link}_rx_kbs), (' tx', {link}_tx_kbs)) AS x(k, v)
             {WHERE_GPU} ORDER BY 1, 2"""


def _rank_metric(column: str) -> str:
    return (f"SELECT time, 'rank ' || rank AS metric, {column} AS value"
            f" {_range_call('rank_series', RANKS)} WHERE rank IN ($rank) ORDER BY 1, 2")


def job_dashboard() -> dm.Dashboard:
    d = (db.Dashboard("jobpulse · job").uid("jobpulse-job").tags(["jobpulse", "slurm", "gpu"]).refresh(REFRESH)
         .time("now-1h", "now").timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR).editable()
         .description("One Slurm job, every GPU and rank, second by second, with its events and flags."))
    d = (d.with_variable(variable("cluster", "cluster", "SELECT DISTINCT cluster FROM jobpulse.jobs ORDER BY 1"))
         .with_variable(variable("job", "job (id · user · name)", """
            SELECT job_id || ' · ' || coalesce(user_name, '?') || ' · ' || coalesce(job_name, '') AS __text,
                   job_id AS __value
              FROM jobpulse.jobs WHERE cluster = '$cluster'
             ORDER BY end_time IS NULL DESC, start_time DESC NULLS LAST LIMIT 1000"""))
         .with_variable(variable("node", "node", f"SELECT DISTINCT node FROM jobpulse.job_gpus WHERE {JOB} ORDER BY 1",
                             multi=True))
         .with_variable(variable("gpu", "GPU", f"""
            SELECT {NAME} AS __text, gpu_uuid AS __value FROM jobpulse.job_gpus
             WHERE {JOB} AND node IN ($node) ORDER BY node, gpu_index, 1""", multi=True))
         .with_variable(variable("rank", "rank", """
            SELECT DISTINCT rank FROM jobpulse.process_rollup_of_job('$cluster', '$job', 300)
             WHERE rank IS NOT NULL AND node IN ($node) ORDER BY 1""", multi=True)))
    d = d.annotation(db.AnnotationQuery().name("Annotations & Alerts").datasource(
        dm.DataSourceRef(type_val="grafana", uid="-- Grafana --")).enable(True).hide(True).icon_color(
        "rgba(0, 211, 255, 1)").type("dashboard").built_in(1))
    sql_annotations = [
        annotation("events", "#8ab8ff", f"""
            SELECT ts AS time, level || ' · rank ' || coalesce(rank::text, '-') || ' · ' || kind
                   || coalesce(' ' || name, '') || ': ' || message AS text, kind AS tags
              FROM jobpulse.events
             WHERE {JOB} AND $__timeFilter(ts) AND kind NOT IN ('step', 'phase_start', 'phase_end')
             ORDER BY ts LIMIT 2000"""),
        annotation("phases", "#b877d9", f"""
            SELECT started_at AS time, coalesce(ended_at, now()) AS timeend,
                   phase || ' (rank ' || coalesce(rank::text, '-') || ', ' || status || ')' AS text, 'phase' AS tags
              FROM jobpulse.job_phases
             WHERE {JOB} AND started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()
             ORDER BY started_at LIMIT 2000"""),
        annotation("flags", "#f2495c", f"""
            SELECT started_at AS time, coalesce(ended_at, now()) AS timeend,
                   rule_id || ' [' || severity || '/' || category || '] '
                   || coalesce(nullif(scope_key, ''), 'the job') || ': ' || advice AS text,
                   rule_id AS tags
              FROM jobpulse.job_flags
             WHERE {JOB} AND started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()
             ORDER BY started_at"""),
    ]
    panels = [
        table_panel("Job", f"""
            SELECT job_id, user_name, account, partition, job_name, array_to_string(nodes, ',') AS nodes,
                   gpus_total, start_time, end_time,
                   coalesce(state, CASE WHEN end_time IS NULL THEN 'RUNNING' ELSE 'ENDED' END) AS state, exit_code
              FROM jobpulse.jobs WHERE {JOB}""", w=16, h=4),
        stat.Panel().title("GPU-hours busy / allocated").datasource(DS).span(8).height(4).unit("none").decimals(2)
        .with_target(Sql(f"""
            WITH share AS ({slice_shares_sql("'$cluster'")})
            SELECT (SELECT sum({activity_bucket_sql("r.")} / 100 * coalesce(s.share, 1)
                               * (extract(epoch FROM r.last_ts - r.first_ts) + 1)) / 3600
                      FROM jobpulse.gpu_rollup_of_job('$cluster', '$job', 300) r
                      LEFT JOIN share s USING (node, gpu_uuid)) AS busy_gpu_hours,
                   (SELECT coalesce(sum(coalesce(g.share, s.share, 1)), 0) + greatest(j.gpus_total - count(*), 0)
                      FROM jobpulse.job_gpus g LEFT JOIN share s USING (node, gpu_uuid)
                     WHERE g.cluster = j.cluster AND g.job_id = j.job_id)
                   * extract(epoch FROM coalesce(j.end_time, now()) - j.start_time) / 3600 AS allocated_gpu_hours
              FROM jobpulse.jobs j WHERE j.{JOB.replace(" AND job_id", " AND j.job_id")}""", "table"))
        .description("Busy: each GPU's mean SM activity (GPM) or utilization x the time it ran, from 300 s "
                     "roll-ups (1,800 s ones where compaction made them); allocated: GPUs x wall time (GPUs "
                     "Slurm gave that no agent registered count whole). A MIG slice counts as its share of the "
                     "GPU (its compute slices of the GPU's), an MPS job as the share Slurm gave it."),
        table_panel("Goodput: where the allocation went (once the job has ended)", f"""
            SELECT 'productive' AS part, round((summary #>> '{{goodput,productive_gpu_hours}}')::numeric, 3) AS gpu_hours,
                   round((summary #>> '{{goodput,ettr}}')::numeric, 3) AS share, summary #>> '{{goodput,basis}}' AS basis
              FROM jobpulse.job_summaries WHERE {JOB} AND summary ? 'goodput'
            UNION ALL
            SELECT b.key, round(b.value::numeric, 3),
                   round((b.value::float8 / nullif((s.summary #>> '{{goodput,allocated_gpu_hours}}')::float8, 0))::numeric, 3),
                   NULL
              FROM jobpulse.job_summaries s, jsonb_each_text(s.summary #> '{{goodput,badput_gpu_hours}}') b
             WHERE s.{JOB.replace(" AND job_id", " AND s.job_id")}
             ORDER BY gpu_hours DESC""", w=24, h=6,
                    desc="The allocated GPU-hours split into productive time and badput by cause (start-up, idle, "
                         "input stalls, checkpoints, evaluation, hung, lost to failure, not measured), from steps "
                         "where the job sends them, else from GPU activity (basis). The parts sum to the "
                         "allocation. Written with the job's summary when it ends."),
        ts("GPU utilization (duty cycle) per GPU", _gpu_metric("sm_util"), "percent", lo=0, hi=100),
        ts("SM activity (GPM) per GPU", _gpu_metric("sm_active"), "percent", lo=0, hi=100,
            desc="The share of SMs busy: the truth about use. Empty on GPUs without GPM (pre-Hopper)."),
        ts("Tensor-core activity (GPM) per GPU", _gpu_metric("tensor_active"), "percent", lo=0, hi=100),
        ts("Memory used per GPU", _gpu_metric("fb_used_mib * 1048576"), "bytes", lo=0),
        ts("Power vs limit", f"""
            WITH s AS (SELECT time, {NAME} AS gpu, power_w, power_limit_w {_range_call('gpu_series', GPUS)} {WHERE_GPU})
            SELECT time, gpu AS metric, power_w AS value FROM s
            UNION ALL
            SELECT time, 'limit ' || power_limit_w || ' W', max(power_limit_w) FROM s GROUP BY 1, 2
            ORDER BY 1, 2""", "watt", lo=0, desc="One limit line per distinct power limit: a second line is a "
                                                  "GPU capped lower than the others."),
        ts("GPU temperature", _gpu_metric("gpu_temp_c"), "celsius"),
        ts("SM clock", _gpu_metric("sm_clock_mhz"), "rotmhz", lo=0),
        ts("PCIe traffic", _gpu_rx_tx("pcie"), "Bps", lo=0,
            desc="rx: host to GPU (input data); low while the GPU idles points at the data pipeline."),
        ts("NVLink traffic", _gpu_rx_tx("nvlink"), "Bps", lo=0, desc="Collective communication between GPUs."),
        ts("Network (InfiniBand/RoCE) traffic per node", f"""
            SELECT $__timeGroupAlias(ts, $__interval), node || ' ' || device || '/' || port || x.k AS metric,
                   avg(x.v) * 1024 AS value
              FROM jobpulse.fabric_samples,
                   LATERAL (VALUES (' rx', rx_kbs), (' tx', tx_kbs)) AS x(k, v)
             WHERE {JOB} AND node IN ($node) AND $__timeFilter(ts)
             GROUP BY 1, 2 ORDER BY 1, 2""", "Bps", lo=0,
            desc="Between the job's nodes, from nodes it holds alone (a shared node's traffic is the node's, "
                 "not shown). Near the link's rate while the GPUs wait: communication-bound."),
        ts("CPU of each rank", _rank_metric("cpu_percent"),
            "percent", lo=0, desc="100 % = one core. A rank at 100 % while its GPU idles is input-bound."),
        ts("GPU share (SM) of each rank", _rank_metric("sm_util"),
            "percent", lo=0, hi=100),
        ts("Throughput (samples/s) per rank", f"""
            SELECT time, 'rank ' || coalesce(rank::text, '-') AS metric, samples_per_s AS value
              {_range_call('step_series', RANKS)}
             WHERE samples_per_s IS NOT NULL AND (rank IN ($rank) OR rank IS NULL) ORDER BY 1, 2""", "none", lo=0,
            desc="From the job's step() events."),
        table_panel("Flags: what is wasted and what to change", f"""
            SELECT CASE WHEN ended_at IS NULL THEN 'open' ELSE 'closed' END AS status, severity, category,
                   rule_id, scope, scope_key AS "where", started_at, ended_at, evidence::text AS evidence, advice
              FROM jobpulse.job_flags WHERE {JOB}
             ORDER BY ended_at IS NOT NULL, CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END,
                      started_at""", h=9),
        table_panel("Stacks sampled for flags: where the waiting rank's time went", f"""
            SELECT c.rule_id, c.node, c.state, p.top ->> 'role' AS role,
                   round((p.top ->> 'share')::numeric * 100) AS percent, p.top ->> 'frames' AS call_path, c.reason
              FROM jobpulse.flag_captures c
              LEFT JOIN LATERAL jsonb_array_elements(c.result -> 'top') AS p(top) ON true
             WHERE c.{JOB.replace(" AND job_id", " AND c.job_id")} AND c.kind = 'stacks'
             ORDER BY c.requested_at, percent DESC NULLS LAST""", h=6)
        .description("py-spy samples of the flagged rank's main process and data-loader workers, a few seconds "
                     "after the flag (docs/captures.md). Share: of the role's samples where Python code ran."),
        table_panel("Profiler traces for flags: where the GPU time went", f"""
            SELECT rule_id, node, state, id AS capture, (result #>> '{{summary,span_s}}')::float8 AS span_s,
                   (result #>> '{{summary,idle_percent}}')::float8 AS idle_percent,
                   (result #>> '{{summary,host_wait_percent}}')::float8 AS idle_waiting_on_host_percent,
                   (result #>> '{{summary,compute_percent}}')::float8 AS compute_percent,
                   (result #>> '{{summary,communication_percent}}')::float8 AS communication_alone_percent,
                   (result #>> '{{summary,overlap_percent}}')::float8 AS overlap_percent,
                   result #>> '{{summary,top_kernels,0,name}}' AS top_kernel, reason
              FROM jobpulse.flag_captures WHERE {JOB} AND kind = 'trace' ORDER BY requested_at""", h=5)
        .description("A few training steps profiled by the job's own client when the job allowed it "
                     "(jobpulse.agent.client.allow_traces), summarized as Holistic Trace Analysis does: idle time "
                     "and its causes, compute, communication not overlapped (docs/captures.md)."),
        table_panel("Topology (nvidia-smi topo -m)", """
            SELECT 'GPU' || t.gpu_index AS gpu, 'GPU' || p.gpu_index AS peer,
                   CASE WHEN t.gpu_uuid = p.gpu_uuid THEN 'X' ELSE t.links ->> p.gpu_uuid END AS link,
                   t.node, t.numa_node, t.cpu_affinity
              FROM jobpulse.topology_current t
              JOIN jobpulse.topology_current p ON p.cluster = t.cluster AND p.node = t.node
             WHERE t.cluster = '$cluster' AND t.node IN ($node)
             ORDER BY t.node, t.gpu_index, p.gpu_index""", w=12, h=8)
        .with_transformation(dm.DataTransformerConfig(id_val="groupingToMatrix", options={
            "columnField": "peer", "rowField": "gpu", "valueField": "link", "emptyValue": "null"})),
        # the whole job (a bucket either side of its run: agents' clocks are not the controller's),
        # from its coarse buckets where compaction made them; per process first, so that the rows
        # are hashed, not sorted, and each list of PIDs is built from a few rows
        table_panel("Ranks", """
            SELECT rank, node, string_agg(pid::text, ',' ORDER BY pid::text) AS pids, max(command) AS command,
                   round((sum(cpu) / nullif(sum(n_cpu), 0))::numeric, 1) AS cpu_percent,
                   max(gpu_mem) AS gpu_mem_mib, max(rss) AS rss_mib
              FROM (SELECT r.rank, r.node, r.pid, max(r.command) AS command, sum(r.sum_cpu_percent) AS cpu,
                           sum(r.n_cpu) AS n_cpu, max(r.max_gpu_mem_mib) AS gpu_mem, max(r.max_rss_mib) AS rss
                      FROM jobpulse.process_rollup_of_job('$cluster', '$job', 300) r
                     WHERE r.rank IS NOT NULL
                     GROUP BY 1, 2, 3) p
             GROUP BY rank, node ORDER BY rank""", w=12, h=8),
    ]
    return finish(d, panels, sql_annotations)
