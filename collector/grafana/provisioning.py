"""Report: Grafana provisioning as code — the PostgreSQL datasource (read-only role, 1 s
`timeInterval`), the dashboard provider, and unified-alerting rules that read the flags the rules
engine writes. `jobpulse grafana build` writes them under deploy/grafana/ (drop-in for
/etc/grafana/provisioning); `jobpulse grafana publish` sends the same objects over the HTTP API.
"""

from __future__ import annotations

from typing import Any

import yaml

from jobpulse.collector.grafana.dashboards import DATASOURCE_TYPE, DATASOURCE_UID, FOLDER
from jobpulse.collector.rules.registry import IDLE_GPU, IMBALANCE, INPUT_BOUND, LOW_UTILIZATION, OVER_ALLOCATION, RULES

FOLDER_UID = "jobpulse"
DASHBOARD_DIR = "/var/lib/grafana/dashboards/jobpulse"


def datasource(url: str = "${JOBPULSE_PG_HOST}:5432", database: str = "jobpulse", user: str = "jobpulse_grafana",
               password: str = "${JOBPULSE_PG_PASSWORD}") -> dict[str, Any]:
    """The datasource. The login role should be a member of jobpulse_reader (SELECT only)."""
    return {"name": "jobpulse", "uid": DATASOURCE_UID, "type": DATASOURCE_TYPE, "access": "proxy", "url": url,
            "user": user, "isDefault": False, "editable": False,
            "jsonData": {"database": database, "sslmode": "prefer", "postgresVersion": 1500, "timescaledb": False,
                         "timeInterval": "1s", "maxOpenConns": 10, "connMaxLifetime": 14400},
            "secureJsonData": {"password": password}}


def datasources_yaml() -> dict[str, Any]:
    return {"apiVersion": 1, "datasources": [datasource()]}


def dashboards_yaml() -> dict[str, Any]:
    return {"apiVersion": 1, "providers": [{
        "name": "jobpulse", "orgId": 1, "folder": FOLDER, "folderUid": FOLDER_UID, "type": "file",
        "disableDeletion": False, "allowUiUpdates": False, "updateIntervalSeconds": 60,
        "options": {"path": DASHBOARD_DIR, "foldersFromFilesStructure": False}}]}


# Alert queries: a table with one numeric column; the string columns become labels for routing.
OPEN_FLAGS = """
SELECT f.cluster, f.job_id, coalesce(j.user_name, '?') AS "user", coalesce(j.partition, '?') AS partition,
       f.severity, f.category, {what} AS value
  FROM jobpulse.job_flags f JOIN jobpulse.jobs j USING (cluster, job_id)
 WHERE f.ended_at IS NULL AND j.end_time IS NULL AND {where}
 GROUP BY f.cluster, f.job_id, j.user_name, j.partition, f.severity, f.category
"""


def _rule_ids(*ids: str) -> str:
    """A SQL list of rule ids, each checked against the registry (a renamed rule cannot be missed)."""
    unknown = set(ids) - set(RULES)
    if unknown:
        raise KeyError(f"alerting names rules the registry lacks: {sorted(unknown)}")
    return ", ".join(f"'{i}'" for i in ids)


def _category(name: str) -> str:
    """A rule category as a SQL literal, checked against the registry's categories."""
    if name not in {r.category for r in RULES.values()}:
        raise KeyError(f"alerting names a category no rule has: {name!r}")
    return f"'{name}'"


ALERTS: list[dict[str, Any]] = [
    {"uid": "jobpulse-idle-gpu", "title": "Idle GPU in a running job", "for": "5m",
     "sql": OPEN_FLAGS.format(
         what="sum(CASE WHEN jsonb_typeof(f.evidence->'gpus') = 'array' THEN jsonb_array_length(f.evidence->'gpus')"
              " ELSE 1 END)", where=f"f.rule_id IN ({_rule_ids(IDLE_GPU, OVER_ALLOCATION)})"),
     "summary": "Job {{ $labels.job_id }} of {{ $labels.user }} has {{ $values.A }} idle GPU(s)",
     "description": "A GPU of the job has been idle for the configured time, or was never used since the job "
                    "started (see the flag's advice).",
     "labels": {"team": "users"}},
    {"uid": "jobpulse-low-utilization", "title": "Low utilization of a running job", "for": "15m",
     "sql": OPEN_FLAGS.format(
         what="count(*)", where=f"f.rule_id IN ({_rule_ids(LOW_UTILIZATION, INPUT_BOUND, IMBALANCE)})"),
     "summary": "Job {{ $labels.job_id }} of {{ $labels.user }} uses its GPUs poorly ({{ $values.A }} flags)",
     "description": "Low SM activity, input-bound GPUs or an imbalanced rank: see `jobpulse report`.",
     "labels": {"team": "users"}},
    {"uid": "jobpulse-hardware", "title": "Hardware trouble on a node", "for": "0s",
     "sql": """
SELECT f.cluster, f.node, f.rule_id, f.severity, f.category, count(*) AS value
  FROM (SELECT cluster, split_part(scope_key, '/', 1) AS node, rule_id, severity, category, ended_at
          FROM jobpulse.job_flags
        UNION ALL
        SELECT cluster, node, rule_id, severity, category, ended_at FROM jobpulse.node_flags) f
 WHERE f.ended_at IS NULL AND f.category = """ + _category("hardware") + """
 GROUP BY f.cluster, f.node, f.rule_id, f.severity, f.category
""",
     "summary": "{{ $labels.rule_id }} on {{ $labels.node }}",
     "description": "XID, ECC, a lost GPU, throttling or a degraded link, in a job or on a GPU no job holds: the "
                    "node's fault, not the job's. Drain and inspect.",
     "labels": {"team": "admins"}},
]


def alert_rule(a: dict[str, Any]) -> dict[str, Any]:
    """One rule: query A (table) -> reduce B (last) -> threshold C (> 0)."""
    return {
        "uid": a["uid"], "title": a["title"], "condition": "C", "for": a["for"],
        "noDataState": "OK", "execErrState": "Error", "isPaused": False,
        "labels": {"source": "jobpulse", **a["labels"]},
        "annotations": {"summary": a["summary"], "description": a["description"]},
        "data": [
            {"refId": "A", "datasourceUid": DATASOURCE_UID, "relativeTimeRange": {"from": 600, "to": 0},
             "model": {"refId": "A", "editorMode": "code", "format": "table", "rawQuery": True,
                       "rawSql": " ".join(a["sql"].split()), "intervalMs": 1000, "maxDataPoints": 43200}},
            {"refId": "B", "datasourceUid": "__expr__", "relativeTimeRange": {"from": 600, "to": 0},
             "model": {"refId": "B", "type": "reduce", "expression": "A", "reducer": "last",
                       "datasource": {"type": "__expr__", "uid": "__expr__"}}},
            {"refId": "C", "datasourceUid": "__expr__", "relativeTimeRange": {"from": 600, "to": 0},
             "model": {"refId": "C", "type": "threshold", "expression": "B",
                       "datasource": {"type": "__expr__", "uid": "__expr__"},
                       "conditions": [{"evaluator": {"type": "gt", "params": [0]}}]}},
        ],
    }


def alerting_yaml() -> dict[str, Any]:
    return {"apiVersion": 1, "groups": [{"orgId": 1, "name": "jobpulse", "folder": FOLDER, "interval": "1m",
                                         "rules": [alert_rule(a) for a in ALERTS]}]}


def render_all() -> dict[str, str]:
    """Path under deploy/grafana/provisioning -> YAML text, exactly what is committed."""
    header = "# Generated by `jobpulse grafana build` from collector/grafana/provisioning.py: do not edit.\n"
    return {path: header + yaml.safe_dump(doc, sort_keys=False, width=120)
            for path, doc in (("datasources/jobpulse.yaml", datasources_yaml()),
                              ("dashboards/jobpulse.yaml", dashboards_yaml()),
                              ("alerting/jobpulse.yaml", alerting_yaml()))}
