"""Report: the Grafana dashboards, built with grafana-foundation-sdk (Grafana 11 types).

`jobpulse grafana build` writes them to `dashboards/`; `jobpulse grafana publish` sends the same
JSON to a Grafana. Every query reads the public SQL interface (migrations), long ranges through
the series functions over the roll-ups (`gpu_series`, `rank_series`, `step_series`), so a 24 h job on 64 GPUs
draws from a few thousand rows. Queries follow `notes/grafana.md`: single-value variables are
quoted in the SQL ('$job'), multi-value ones are lists (IN ($node)).
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, stat, table, timeseries
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from jobpulse.schema.fields import PANELS, Field
from jobpulse.schema.semantics import IDLE_PERCENT, activity_bucket_sql, activity_mean_sql

DATASOURCE_UID = "jobpulse-pg"
DATASOURCE_TYPE = "grafana-postgresql-datasource"
DS = dm.DataSourceRef(type_val=DATASOURCE_TYPE, uid=DATASOURCE_UID)
FOLDER = "jobpulse"
REFRESH = "5s"


class SqlQuery(variants.Dataquery):
    """A PostgreSQL datasource query (the SDK has no SQL query type)."""

    def __init__(self, sql: str, fmt: str = "time_series", ref: str = "A") -> None:
        self.sql, self.fmt, self.ref = " ".join(sql.split()), fmt, ref

    def to_json(self) -> dict[str, object]:
        return {"refId": self.ref, "datasource": DS.to_json(), "editorMode": "code", "format": self.fmt,
                "rawQuery": True, "rawSql": self.sql}


class Sql:
    """Builder wrapper so panels take a SqlQuery like any SDK target."""

    def __init__(self, sql: str, fmt: str = "time_series", ref: str = "A") -> None:
        self.query = SqlQuery(sql, fmt, ref)

    def build(self) -> SqlQuery:
        return self.query


def _ts(title: str, sql: str, unit: str, *, w: int = 12, h: int = 8, lo: float | None = None,
        hi: float | None = None, desc: str = "", stack: bool = False) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).datasource(DS).with_target(Sql(sql)).unit(unit).span(w).height(h)
         .line_width(1).fill_opacity(10 if not stack else 60).description(desc))
    if lo is not None:
        p = p.min(lo)
    if hi is not None:
        p = p.max(hi)
    return p


def _table(title: str, sql: str, *, w: int = 24, h: int = 8, desc: str = "") -> table.Panel:
    """A table panel (format table: free-form columns)."""
    return table.Panel().title(title).datasource(DS).with_target(Sql(sql, "table")).span(w).height(h).description(desc)


def _var(name: str, label: str, sql: str, *, multi: bool = False) -> db.QueryVariable:
    v = (db.QueryVariable(name).label(label).datasource(DS).query(" ".join(sql.split()))
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.DISABLED))
    return v.multi(True).include_all(True) if multi else v


def _annotation(name: str, color: str, sql: str) -> dm.AnnotationQuery:
    a = db.AnnotationQuery().name(name).datasource(DS).enable(True).icon_color(color).build()
    a.target = SqlQuery(sql, "table", "Anno")  # type: ignore[assignment]  # SQL annotations take a query target
    return a


# --- job dashboard -------------------------------------------------------------------------
JOB = "cluster = '$cluster' AND job_id = '$job'"


# Points one panel asks for at most: past this, lines overlap on screen anyway, so the step
# grows with the number of series (64 GPUs over 15 min: 3 s; one node's 8 GPUs: 1 s).
POINTS = 20_000


def _range_call(function: str, series: str) -> str:
    """FROM one of the series functions (migrations 0005, 0006), which read the finest source
    that is fast for the range; the step is Grafana's interval, raised to keep `series` x steps
    within POINTS."""
    step = (f"greatest($__interval_ms / 1000, ceil(extract(epoch FROM $__timeTo()::timestamptz"
            f" - $__timeFrom()::timestamptz) * {series} / {POINTS}))::int")
    return f"FROM jobpulse.{function}('$cluster', '$job', $__timeFrom(), $__timeTo(), {step})"


GPUS = "cardinality(ARRAY[$gpu])"  # series in a panel: the GPUs or ranks chosen
RANKS = "cardinality(ARRAY[$rank])"
NAME = "node || '/GPU' || gpu_index"
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
    d = (d.with_variable(_var("cluster", "cluster", "SELECT DISTINCT cluster FROM jobpulse.jobs ORDER BY 1"))
         .with_variable(_var("job", "job (id · user · name)", """
            SELECT job_id || ' · ' || coalesce(user_name, '?') || ' · ' || coalesce(job_name, '') AS __text,
                   job_id AS __value
              FROM jobpulse.jobs WHERE cluster = '$cluster'
             ORDER BY end_time IS NULL DESC, start_time DESC NULLS LAST LIMIT 1000"""))
         .with_variable(_var("node", "node", f"SELECT DISTINCT node FROM jobpulse.job_gpus WHERE {JOB} ORDER BY 1",
                             multi=True))
         .with_variable(_var("gpu", "GPU", f"""
            SELECT node || '/GPU' || gpu_index AS __text, gpu_uuid AS __value FROM jobpulse.job_gpus
             WHERE {JOB} AND node IN ($node) ORDER BY node, gpu_index""", multi=True))
         .with_variable(_var("rank", "rank", f"""
            SELECT DISTINCT rank FROM jobpulse.process_rollup
             WHERE width_s = 300 AND {JOB} AND rank IS NOT NULL AND node IN ($node) ORDER BY 1""", multi=True)))
    d = d.annotation(db.AnnotationQuery().name("Annotations & Alerts").datasource(
        dm.DataSourceRef(type_val="grafana", uid="-- Grafana --")).enable(True).hide(True).icon_color(
        "rgba(0, 211, 255, 1)").type("dashboard").built_in(1))
    sql_annotations = [
        _annotation("events", "#8ab8ff", f"""
            SELECT ts AS time, level || ' · rank ' || coalesce(rank::text, '-') || ' · ' || kind
                   || coalesce(' ' || name, '') || ': ' || message AS text, kind AS tags
              FROM jobpulse.events
             WHERE {JOB} AND $__timeFilter(ts) AND kind NOT IN ('step', 'phase_start', 'phase_end')
             ORDER BY ts LIMIT 2000"""),
        _annotation("phases", "#b877d9", f"""
            SELECT started_at AS time, coalesce(ended_at, now()) AS timeend,
                   phase || ' (rank ' || coalesce(rank::text, '-') || ', ' || status || ')' AS text, 'phase' AS tags
              FROM jobpulse.job_phases
             WHERE {JOB} AND started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()
             ORDER BY started_at LIMIT 2000"""),
        _annotation("flags", "#f2495c", f"""
            SELECT started_at AS time, coalesce(ended_at, now()) AS timeend,
                   rule_id || ' [' || severity || '/' || category || '] ' || scope_key || ': ' || advice AS text,
                   rule_id AS tags
              FROM jobpulse.job_flags
             WHERE {JOB} AND started_at <= $__timeTo() AND coalesce(ended_at, now()) >= $__timeFrom()
             ORDER BY started_at"""),
    ]
    panels = [
        _table("Job", f"""
            SELECT job_id, user_name, account, partition, job_name, array_to_string(nodes, ',') AS nodes,
                   gpus_total, start_time, end_time, coalesce(state, 'RUNNING') AS state, exit_code
              FROM jobpulse.jobs WHERE {JOB}""", w=16, h=4),
        stat.Panel().title("GPU-hours busy / allocated").datasource(DS).span(8).height(4).unit("none").decimals(2)
        .with_target(Sql(f"""
            SELECT (SELECT sum({activity_bucket_sql()} / 100
                               * (extract(epoch FROM last_ts - first_ts) + 1)) / 3600
                      FROM jobpulse.gpu_rollup WHERE width_s = 300 AND {JOB}) AS busy_gpu_hours,
                   greatest(j.gpus_total, (SELECT count(*) FROM jobpulse.job_gpus g WHERE g.cluster = j.cluster
                                            AND g.job_id = j.job_id))
                   * extract(epoch FROM coalesce(j.end_time, now()) - j.start_time) / 3600 AS allocated_gpu_hours
              FROM jobpulse.jobs j WHERE j.{JOB.replace(" AND job_id", " AND j.job_id")}""", "table"))
        .description("Busy: each GPU's mean SM activity (GPM) or utilization x the time it ran, from 300 s "
                     "roll-ups; allocated: GPUs x wall time."),
        _ts("GPU utilization (duty cycle) per GPU", _gpu_metric("sm_util"), "percent", lo=0, hi=100),
        _ts("SM activity (GPM) per GPU", _gpu_metric("sm_active"), "percent", lo=0, hi=100,
            desc="The share of SMs busy: the truth about use. Empty on GPUs without GPM (pre-Hopper)."),
        _ts("Tensor-core activity (GPM) per GPU", _gpu_metric("tensor_active"), "percent", lo=0, hi=100),
        _ts("Memory used per GPU", _gpu_metric("fb_used_mib * 1048576"), "bytes", lo=0),
        _ts("Power vs limit", f"""
            WITH s AS (SELECT time, {NAME} AS gpu, power_w, power_limit_w {_range_call('gpu_series', GPUS)} {WHERE_GPU})
            SELECT time, gpu AS metric, power_w AS value FROM s
            UNION ALL
            SELECT time, 'limit ' || power_limit_w || ' W', max(power_limit_w) FROM s GROUP BY 1, 2
            ORDER BY 1, 2""", "watt", lo=0, desc="One limit line per distinct power limit: a second line is a "
                                                  "GPU capped lower than the others."),
        _ts("GPU temperature", _gpu_metric("gpu_temp_c"), "celsius"),
        _ts("SM clock", _gpu_metric("sm_clock_mhz"), "rotmhz", lo=0),
        _ts("PCIe traffic", _gpu_rx_tx("pcie"), "Bps", lo=0,
            desc="rx: host to GPU (input data); low while the GPU idles points at the data pipeline."),
        _ts("NVLink traffic", _gpu_rx_tx("nvlink"), "Bps", lo=0, desc="Collective communication between GPUs."),
        _ts("CPU of each rank", _rank_metric("cpu_percent"),
            "percent", lo=0, desc="100 % = one core. A rank at 100 % while its GPU idles is input-bound."),
        _ts("GPU share (SM) of each rank", _rank_metric("sm_util"),
            "percent", lo=0, hi=100),
        _ts("Throughput (samples/s) per rank", f"""
            SELECT time, 'rank ' || coalesce(rank::text, '-') AS metric, samples_per_s AS value
              {_range_call('step_series', RANKS)}
             WHERE samples_per_s IS NOT NULL AND (rank IN ($rank) OR rank IS NULL) ORDER BY 1, 2""", "none", lo=0,
            desc="From the job's step() events."),
        _table("Flags: what is wasted and what to change", f"""
            SELECT CASE WHEN ended_at IS NULL THEN 'open' ELSE 'closed' END AS status, severity, category,
                   rule_id, scope, scope_key AS "where", started_at, ended_at, evidence::text AS evidence, advice
              FROM jobpulse.job_flags WHERE {JOB}
             ORDER BY ended_at IS NOT NULL, CASE severity WHEN 'critical' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END,
                      started_at""", h=9),
        _table("Topology (nvidia-smi topo -m)", """
            SELECT 'GPU' || t.gpu_index AS gpu, 'GPU' || p.gpu_index AS peer,
                   CASE WHEN t.gpu_uuid = p.gpu_uuid THEN 'X' ELSE t.links ->> p.gpu_uuid END AS link,
                   t.node, t.numa_node, t.cpu_affinity
              FROM jobpulse.topology_current t
              JOIN jobpulse.topology_current p ON p.cluster = t.cluster AND p.node = t.node
             WHERE t.cluster = '$cluster' AND t.node IN ($node)
             ORDER BY t.node, t.gpu_index, p.gpu_index""", w=12, h=8)
        .with_transformation(dm.DataTransformerConfig(id_val="groupingToMatrix", options={
            "columnField": "peer", "rowField": "gpu", "valueField": "link", "emptyValue": "null"})),
        _table("Ranks", f"""
            SELECT rank, node, string_agg(DISTINCT pid::text, ',') AS pids, max(command) AS command,
                   round((sum(sum_cpu_percent) / nullif(sum(n_cpu), 0))::numeric, 1) AS cpu_percent,
                   max(max_gpu_mem_mib) AS gpu_mem_mib, max(max_rss_mib) AS rss_mib
              FROM jobpulse.process_rollup WHERE width_s = 300 AND {JOB} AND rank IS NOT NULL
             GROUP BY rank, node ORDER BY rank""", w=12, h=8),
    ]
    return _finish(d, panels, sql_annotations)


# --- cluster dashboard ---------------------------------------------------------------------
def cluster_dashboard() -> dm.Dashboard:
    d = (db.Dashboard("jobpulse · cluster").uid("jobpulse-cluster").tags(["jobpulse", "slurm", "gpu"])
         .refresh("30s").time("now-6h", "now").timezone("browser").editable()
         .description("Running jobs, GPUs at a glance, and where GPU-hours are wasted."))
    d = (d.with_variable(_var("cluster", "cluster", "SELECT DISTINCT cluster FROM jobpulse.jobs ORDER BY 1"))
         .with_variable(db.CustomVariable("group_by").label("waste by").values(
             "user : user_name, account : account, partition : partition")))
    panels = [
        _table("Running jobs", f"""
            SELECT j.job_id, j.user_name, j.partition, j.job_name, array_to_string(j.nodes, ',') AS nodes,
                   j.gpus_total, j.start_time,
                   round(({activity_mean_sql("r.")})::numeric, 1)
                       AS util_10min,
                   (SELECT count(*) FROM jobpulse.job_flags f WHERE f.cluster = j.cluster AND f.job_id = j.job_id
                       AND f.ended_at IS NULL) AS open_flags
              FROM jobpulse.jobs j
              LEFT JOIN jobpulse.gpu_rollup r ON r.width_s = 10 AND r.cluster = j.cluster AND r.job_id = j.job_id
                   AND r.bucket > now() - interval '10 minutes'
             WHERE j.cluster = '$cluster' AND j.end_time IS NULL
             GROUP BY j.cluster, j.job_id ORDER BY open_flags DESC, util_10min NULLS FIRST""", h=9),
        heatmap.Panel().title("Node x GPU activity").datasource(DS).span(24).height(10).calculate(False)
        .description("Each row a GPU (node/GPU index), colour = mean activity (SM activity where measured).")
        .with_target(Sql(f"""
            SELECT $__timeGroupAlias(bucket, $__interval), node || '/GPU' || gpu_index AS metric,
                   {activity_mean_sql()} AS value
              FROM jobpulse.gpu_rollup
             WHERE width_s = CASE WHEN $__timeTo()::timestamptz - $__timeFrom()::timestamptz > interval '12 hours'
                                  THEN 300 ELSE 10 END
               AND cluster = '$cluster' AND $__timeFilter(bucket)
             GROUP BY 1, 2 ORDER BY 1, 2""")),
        _ts("Wasted GPU-hours by $group_by", f"""
            SELECT $__timeGroupAlias(r.bucket, $__interval), coalesce(j.${{group_by:raw}}, '?') AS metric,
                   sum(r.n * (1 - {activity_bucket_sql("r.")} / 100)) / 3600 AS value
              FROM jobpulse.gpu_rollup r JOIN jobpulse.jobs j USING (cluster, job_id)
             WHERE r.width_s = 300 AND r.cluster = '$cluster' AND $__timeFilter(r.bucket)
             GROUP BY 1, 2 ORDER BY 1, 2""", "h", stack=True, w=24,
            desc="Per bucket: GPU-seconds not busy (1 - activity) of allocated GPUs, in hours."),
        _table("Top idle GPUs now", """
            SELECT r.job_id, max(j.user_name) AS user_name, r.node || '/GPU' || max(r.gpu_index) AS gpu,
                   round(extract(epoch FROM max(r.last_ts) - coalesce(max(r.last_busy_ts), min(r.first_ts))) / 60)
                       AS idle_minutes, max(r.max_fb_used_mib) AS memory_mib
              FROM jobpulse.gpu_rollup r JOIN jobpulse.jobs j USING (cluster, job_id)
             WHERE r.width_s = 10 AND r.cluster = '$cluster' AND j.end_time IS NULL
               AND r.bucket > now() - interval '30 minutes'
             GROUP BY r.job_id, r.node, r.gpu_uuid
            HAVING coalesce(max(r.last_busy_ts), min(r.first_ts)) < max(r.last_ts) - interval '1 minute'
             ORDER BY idle_minutes DESC LIMIT 20""", w=12, h=9,
               desc=f"GPUs of running jobs idle (<= {IDLE_PERCENT} %) for more than a minute, longest first "
                    "(last 30 min)."),
        _table("Open flags by rule", """
            SELECT f.rule_id, f.category, count(*) AS open_flags, count(DISTINCT f.job_id) AS jobs
              FROM jobpulse.job_flags f WHERE f.cluster = '$cluster' AND f.ended_at IS NULL
             GROUP BY 1, 2 ORDER BY 3 DESC""", w=12, h=9),
    ]
    return _finish(d, panels)


def _bucket_value(f: Field) -> str:
    """One field over a time group of 300 s roll-ups: a counter's increase (max - min), else the
    mean, else the largest value."""
    cols = {agg: c for c, agg in f.rollup.items()}
    if "min" in cols and "max" in cols:
        return f"max({cols['max']}) - min({cols['min']})"
    if "sum" in cols:
        return f"sum({cols['sum']}) / nullif(sum({'n_gpm' if f.gpm else 'n'}), 0)"
    return f"max({cols['max']})"


def _field_panel(title: str, fields: list[Field]) -> timeseries.Panel:
    """A panel the field table asks for: one series per GPU and field (unpivoted after aggregation)."""
    values = ", ".join(f"({_bucket_value(f)})::float8 AS v{i}" for i, f in enumerate(fields))
    pairs = ", ".join(f"(' {f.label or f.name}', v{i})" for i, f in enumerate(fields))
    unit = {"percent": "percent", "degrees Celsius": "celsius", "watts": "watt", "MiB": "mbytes"}.get(fields[0].unit, "short")
    return _ts(title, f"""
        SELECT g.time, g.gpu || x.k AS metric, x.v AS value
          FROM (SELECT $__timeGroupAlias(bucket, $__interval), node || '/GPU' || max(gpu_index) AS gpu, {values}
                  FROM jobpulse.gpu_rollup
                 WHERE width_s = 300 AND cluster = '$cluster' AND node IN ($node) AND $__timeFilter(bucket)
                 GROUP BY 1, node, gpu_uuid) g,
               LATERAL (VALUES {pairs}) AS x(k, v)
         WHERE x.v IS NOT NULL ORDER BY 1, 2""", unit, lo=0,
               desc="; ".join(f"{f.label or f.name}: {f.description} ({f.nvml})" for f in fields))


# --- node health dashboard -----------------------------------------------------------------
def node_health_dashboard() -> dm.Dashboard:
    d = (db.Dashboard("jobpulse · node health").uid("jobpulse-node-health").tags(["jobpulse", "admin", "gpu"])
         .refresh("1m").time("now-24h", "now").timezone("browser").editable()
         .description("For admins: XID and ECC events, throttling, degraded links, missing GPUs."))
    d = (d.with_variable(_var("cluster", "cluster", "SELECT DISTINCT cluster FROM jobpulse.topology ORDER BY 1"))
         .with_variable(_var("node", "node", """
            SELECT DISTINCT node FROM jobpulse.topology_current WHERE cluster = '$cluster' ORDER BY 1""", multi=True)))
    panels = [
        _table("XID, ECC, NVLink and other hardware events", """
            SELECT ts AS time, node, gpu_uuid, kind, code, job_id, message
              FROM jobpulse.gpu_health_events
             WHERE cluster = '$cluster' AND node IN ($node) AND $__timeFilter(ts)
             ORDER BY ts DESC LIMIT 1000""", h=9),
        _ts("Hardware slowdown (thermal, power brake): share of samples", """
            SELECT $__timeGroupAlias(bucket, $__interval), node || '/GPU' || gpu_index AS metric,
                   sum(n_hw_throttle)::float8 / sum(n) * 100 AS value
              FROM jobpulse.gpu_rollup
             WHERE width_s = 300 AND cluster = '$cluster' AND node IN ($node) AND $__timeFilter(bucket)
             GROUP BY 1, 2 ORDER BY 1, 2""", "percent", lo=0, hi=100),
        _ts("PCIe link below max under load: share of busy samples", """
            SELECT $__timeGroupAlias(bucket, $__interval), node || '/GPU' || gpu_index AS metric,
                   sum(n_pcie_low)::float8 / nullif(sum(n_loaded), 0) * 100 AS value
              FROM jobpulse.gpu_rollup
             WHERE width_s = 300 AND cluster = '$cluster' AND node IN ($node) AND $__timeFilter(bucket)
             GROUP BY 1, 2 ORDER BY 1, 2""", "percent", lo=0, hi=100),
        *(_field_panel(title, fields) for title, fields in PANELS.items()),
        _table("GPUs missing (in the topology, silent for 5 minutes)", """
            SELECT t.node, 'GPU' || t.gpu_index AS gpu, t.gpu_uuid, t.model, max(r.last_ts) AS last_sample
              FROM jobpulse.topology_current t
              LEFT JOIN jobpulse.gpu_rollup r ON r.width_s = 300 AND r.cluster = t.cluster AND r.node = t.node
                   AND r.gpu_uuid = t.gpu_uuid AND r.bucket > now() - interval '1 day'
             WHERE t.cluster = '$cluster' AND t.node IN ($node)
             GROUP BY t.node, t.gpu_index, t.gpu_uuid, t.model
            HAVING max(r.last_ts) IS NULL OR max(r.last_ts) < now() - interval '5 minutes'
             ORDER BY 1, 2""", w=12),
        _table("Open hardware flags", """
            SELECT f.job_id, f.rule_id, f.severity, f.scope_key AS "where", f.started_at, f.advice
              FROM jobpulse.job_flags f
             WHERE f.cluster = '$cluster' AND f.category = 'hardware' AND f.ended_at IS NULL
             ORDER BY f.started_at DESC""", w=12),
        _table("Node validation: failed checks", """
            SELECT node, "check", status, expected, observed, message, ts AS checked_at
              FROM jobpulse.node_validations_latest
             WHERE cluster = '$cluster' AND node IN ($node) AND status <> 'pass'
             ORDER BY node, "check\"""", h=8),
    ]
    return _finish(d, panels)


def _finish(d: db.Dashboard, panels: list[Any], annotations: list[dm.AnnotationQuery] | None = None
            ) -> dm.Dashboard:
    """Add the panels left to right, wrapping when a panel would cross the 24-column grid (the
    SDK's own placement lets a wide panel overflow), number them, and add the SQL annotations
    (which the SDK's builders cannot express)."""
    for p in panels:
        d = d.with_panel(p)
    model = d.build()
    x = y = row_h = 0
    for i, panel in enumerate(model.panels or [], 1):
        pos = panel.grid_pos  # type: ignore[union-attr]
        if x + pos.w > 24:
            x, y, row_h = 0, y + row_h, 0
        pos.x, pos.y = x, y
        x, row_h = x + pos.w, max(row_h, pos.h)
        panel.id_val = i  # type: ignore[union-attr]
    if annotations:
        model.annotations.list_val = [*(model.annotations.list_val or []), *annotations]  # type: ignore[union-attr]
    return model


DASHBOARDS = {"job": job_dashboard, "cluster": cluster_dashboard, "node-health": node_health_dashboard}


def as_json(model: dm.Dashboard) -> dict[str, Any]:
    return json.loads(json.dumps(model, cls=JSONEncoder))


def render_all() -> dict[str, str]:
    """File name -> JSON text, exactly what is committed under dashboards/."""
    return {f"jobpulse-{name}.json": json.dumps(as_json(fn()), indent=2, sort_keys=True) + "\n"
            for name, fn in DASHBOARDS.items()}
