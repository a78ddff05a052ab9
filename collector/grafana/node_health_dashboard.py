"""The node-health dashboard for admins: XID and ECC events, throttling, degraded links, missing
GPUs, failed node checks, and a panel per group of fields the field table sends here."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.models import dashboard as dm

from jobpulse.collector.grafana.layout import finish
from jobpulse.collector.grafana.panels import CELLS, PYRAMID_WIDTH, capped_time, gpu_name, table_panel, ts, variable
from jobpulse.collector.store.tiers import pyramid
from jobpulse.schema.fields import PANELS, Field


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
    """A panel the field table asks for: one series per GPU and field (unpivoted after aggregation);
    for counters with more than `FEW_NODES` nodes chosen, one per node and field, from the increases
    the pyramid keeps (a series per GPU would be thousands, and reading them seconds)."""
    values = ", ".join(f"({_bucket_value(f)})::float8 AS v{i}" for i, f in enumerate(fields))
    pairs = ", ".join(f"(' {f.label or f.name}', v{i})" for i, f in enumerate(fields))
    unit = {"percent": "percent", "degrees Celsius": "celsius", "watts": "watt", "MiB": "mbytes"}.get(fields[0].unit, "short")
    few = f"(cardinality(ARRAY[$node]::text[]) <= {FEW_NODES})"
    per_node = all(f.name in pyramid.COUNTERS for f in fields)
    desc = "; ".join(f"{f.label or f.name}: {f.description} ({f.nvml})" for f in fields)
    if not per_node:
        return ts(title, f"""
            SELECT g.time, g.gpu || x.k AS metric, x.v AS value
              FROM (SELECT $__timeGroupAlias(bucket, $__interval), {gpu_name("max(gpu_index)")} AS gpu, {values}
                      FROM jobpulse.gpu_rollup
                     WHERE width_s = 300 AND cluster = '$cluster' AND node IN ($node) AND $__timeFilter(bucket)
                     GROUP BY 1, node, gpu_uuid) g,
                   LATERAL (VALUES {pairs}) AS x(k, v)
             WHERE x.v IS NOT NULL ORDER BY 1, 2""", unit, lo=0, desc=desc)
    increases = ", ".join(f"sum(inc_{f.name})::float8 AS v{i}" for i, f in enumerate(fields))
    return ts(title, f"""
        SELECT g.time, g.gpu || x.k AS metric, x.v AS value
          FROM (SELECT $__timeGroupAlias(bucket, $__interval), {gpu_name("max(gpu_index)")} AS gpu, {values}
                  FROM jobpulse.gpu_rollup
                 WHERE width_s = 300 AND cluster = '$cluster' AND node IN ($node) AND $__timeFilter(bucket) AND {few}
                 GROUP BY 1, node, gpu_uuid
                UNION ALL
                SELECT extract(epoch FROM t), node, {", ".join(f"v{i}" for i in range(len(fields)))} FROM (
                    SELECT {capped_time("bucket", f"cardinality(ARRAY[$node]::text[]) * {len(fields)}", PYRAMID_WIDTH)}
                               AS t, node, {increases}
                      FROM jobpulse.node_rollup
                     WHERE cluster = '$cluster' AND width_s = {PYRAMID_WIDTH} AND node IN ($node)
                       AND $__timeFilter(bucket) AND NOT {few}
                     GROUP BY 1, node) per_node) g,
               LATERAL (VALUES {pairs}) AS x(k, v)
         WHERE x.v IS NOT NULL ORDER BY 1, 2""", unit, lo=0,
              desc=f"{desc}. One series per GPU with up to {FEW_NODES} nodes chosen, one per node (a minute "
                   f"behind) with more: what its counters rose by in each time step.")


FEW_NODES = 16  # nodes chosen up to which the share panels draw a series per GPU, beyond it one per node
MISSING_LISTED = 500
"""Silent GPUs listed at most: a whole cluster gone silent is one outage, not 10,000 rows to read,
and looking up each one's last sample takes seconds at 10,000 GPUs (`bench/grafana.py`, cluster case)."""


def _share_panel(title: str, part: str, whole: str) -> timeseries.Panel:
    """A share of samples, per GPU for a few nodes; per node (its GPUs' samples together, from the
    per-node sums the collector keeps) for more, where a series per GPU would be thousands."""
    share = f"sum({part})::float8 / nullif(sum({whole}), 0) * 100"
    few = f"(cardinality(ARRAY[$node]::text[]) <= {FEW_NODES})"
    return ts(title, f"""
        SELECT $__timeGroupAlias(bucket, $__interval), {gpu_name("max(gpu_index)")} AS metric, {share} AS value
          FROM jobpulse.gpu_rollup
         WHERE width_s = 300 AND cluster = '$cluster' AND node IN ($node) AND $__timeFilter(bucket) AND {few}
         GROUP BY 1, node, gpu_uuid
        UNION ALL
        SELECT extract(epoch FROM t), node, value FROM (
            SELECT {capped_time("bucket", "cardinality(ARRAY[$node]::text[])", PYRAMID_WIDTH)} AS t, node,
                   {share} AS value
              FROM jobpulse.node_rollup
             WHERE cluster = '$cluster' AND width_s = {PYRAMID_WIDTH} AND node IN ($node) AND $__timeFilter(bucket)
               AND NOT {few}
             GROUP BY 1, node) per_node
         ORDER BY 1, 2""", "percent", lo=0, hi=100,
              desc=f"One series per GPU with up to {FEW_NODES} nodes chosen, one per node (a minute behind) "
                   f"with more, in time steps coarse enough for at most {CELLS:,} points in all.")


def node_health_dashboard() -> dm.Dashboard:
    d = (db.Dashboard("jobpulse · node health").uid("jobpulse-node-health").tags(["jobpulse", "admin", "gpu"])
         .refresh("1m").time("now-24h", "now").timezone("browser").editable()
         .description("For admins: XID and ECC events, throttling, degraded links, missing GPUs."))
    d = (d.with_variable(variable("cluster", "cluster", "SELECT DISTINCT cluster FROM jobpulse.topology ORDER BY 1"))
         .with_variable(variable("node", "node", """
            SELECT DISTINCT node FROM jobpulse.topology_current WHERE cluster = '$cluster' ORDER BY 1""", multi=True)))
    panels = [
        table_panel("XID, ECC, NVLink and other hardware events", """
            SELECT ts AS time, node, gpu_uuid, kind, code, job_id, message
              FROM jobpulse.gpu_health_events
             WHERE cluster = '$cluster' AND node IN ($node) AND $__timeFilter(ts)
             ORDER BY ts DESC LIMIT 1000""", h=9),
        _share_panel("Hardware slowdown (thermal, power brake): share of samples", "n_hw_throttle", "n"),
        _share_panel("PCIe link below max under load: share of busy samples", "n_pcie_low", "n_loaded"),
        *(_field_panel(title, fields) for title, fields in PANELS.items()),
        # The GPUs heard from in the last 5 minutes come from the newest 300 s buckets (a sample at
        # most 5 minutes old lies in a bucket begun at most 10 minutes ago); only the silent ones
        # look up their last sample, through the roll-ups' per-node index (migration 0023). No
        # correlated subquery: Citus plans none beside the (reference) topology table.
        table_panel("GPUs missing (in the topology, silent for 5 minutes)", f"""
            WITH heard AS (
                SELECT DISTINCT node, gpu_uuid FROM jobpulse.gpu_rollup
                 WHERE width_s = 300 AND cluster = '$cluster' AND bucket > now() - interval '10 minutes'
                   AND last_ts >= now() - interval '5 minutes'),
            silent AS (
                SELECT t.node, t.gpu_index, t.gpu_uuid, t.model FROM jobpulse.topology_current t
                 WHERE t.cluster = '$cluster' AND t.node IN ($node)
                   AND NOT EXISTS (SELECT FROM heard h WHERE h.node = t.node AND h.gpu_uuid = t.gpu_uuid)
                 ORDER BY 1, 2 LIMIT {MISSING_LISTED}),
            last AS (
                SELECT r.node, r.gpu_uuid, max(r.last_ts) AS last_sample
                  FROM jobpulse.gpu_rollup r JOIN silent s USING (node, gpu_uuid)
                 WHERE r.width_s = 300 AND r.cluster = '$cluster' AND r.bucket > now() - interval '1 day'
                 GROUP BY 1, 2)
            SELECT s.node, 'GPU' || s.gpu_index AS gpu, s.gpu_uuid, s.model, l.last_sample
              FROM silent s LEFT JOIN last l USING (node, gpu_uuid)
             ORDER BY 1, 2""", w=12,
                    desc=f"The first {MISSING_LISTED} by node and GPU index, each with its last sample in the "
                         "last day."),
        table_panel("Network ports (InfiniBand/RoCE): link and errors in the range", """
            SELECT node, device || '/' || port AS port, max(link_layer) AS link_layer,
                   min(width) AS width_min, max(width_max) AS width_best, min(rate_gbps) AS rate_min_gbps,
                   max(rate_max_gbps) AS rate_best_gbps, count(*) FILTER (WHERE port_state <> 4) AS samples_not_active,
                   max(symbol_error) - min(symbol_error) AS symbol_errors, max(link_downed) - min(link_downed) AS downed,
                   max(port_rcv_errors) - min(port_rcv_errors) AS rcv_errors, max(ts) AS last_sample
              FROM jobpulse.fabric_samples
             WHERE cluster = '$cluster' AND node IN ($node) AND $__timeFilter(ts)
             GROUP BY 1, 2 ORDER BY (min(width) < max(width_max) OR min(rate_gbps) < max(rate_max_gbps)) DESC, 1, 2
             LIMIT 500""", w=12,
                    desc="A port below its best width or rate, or whose error counters rose, is a cable or port to "
                         "look at (ibstat, perfquery)."),
        table_panel("Open hardware flags", """
            SELECT f.job_id, f.rule_id, f.severity, f.scope_key AS "where", f.started_at, f.advice
              FROM jobpulse.job_flags f
             WHERE f.cluster = '$cluster' AND f.category = 'hardware' AND f.ended_at IS NULL
             ORDER BY f.started_at DESC""", w=12),
        table_panel("Node validation: failed checks", """
            SELECT node, "check", status, expected, observed, message, ts AS checked_at
              FROM jobpulse.node_validations_latest
             WHERE cluster = '$cluster' AND node IN ($node) AND status <> 'pass'
             ORDER BY node, "check\"""", h=8),
    ]
    return finish(d, panels)
