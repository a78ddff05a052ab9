"""The Grafana dashboards as JSON: `jobpulse grafana build` writes them to `dashboards/`,
`jobpulse grafana publish` sends the same JSON to a Grafana."""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from jobpulse.collector.grafana.cluster_dashboard import cluster_dashboard
from jobpulse.collector.grafana.job_dashboard import job_dashboard
from jobpulse.collector.grafana.node_health_dashboard import node_health_dashboard
from jobpulse.collector.grafana.panels import DATASOURCE_TYPE, DATASOURCE_UID, FOLDER

__all__ = ["DASHBOARDS", "DATASOURCE_TYPE", "DATASOURCE_UID", "FOLDER", "as_json", "render_all"]

DASHBOARDS = {"job": job_dashboard, "cluster": cluster_dashboard, "node-health": node_health_dashboard}


def as_json(model: dm.Dashboard) -> dict[str, Any]:
    return json.loads(json.dumps(model, cls=JSONEncoder))


def render_all() -> dict[str, str]:
    """File name -> JSON text, exactly what is committed under dashboards/."""
    return {f"jobpulse-{name}.json": json.dumps(as_json(fn()), indent=2, sort_keys=True) + "\n"
            for name, fn in DASHBOARDS.items()}
