"""Report: `jobpulse grafana publish` — folder, datasource, dashboards and alert rules through
Grafana's HTTP API (grafana-client). Every step is a create-or-update keyed by a fixed uid, so
publishing again changes nothing but what changed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException, GrafanaUnauthorizedError

from jobpulse.collector.grafana import dashboards
from jobpulse.collector.grafana import provisioning as prov


class PublishError(RuntimeError):
    """A message for the user (wrong URL, token, missing datasource): no traceback."""


@dataclass(frozen=True)
class Database:
    host: str  # host:port as Grafana's server reaches PostgreSQL
    name: str
    user: str
    password: str


def publish(url: str, token: str, database: Database | None, timeout: float = 10.0) -> list[str]:
    api = GrafanaApi.from_url(url=url, credential=token, timeout=timeout)
    done: list[str] = []
    try:
        try:
            api.folder.get_all_folders()  # the first call that needs the token
        except GrafanaUnauthorizedError:
            raise PublishError(f"Grafana at {url} rejected the token (401): create a service-account token "
                               "with the Editor or Admin role") from None
        _folder(api, done)
        _datasource(api, database, done)
        for _name, build in dashboards.DASHBOARDS.items():
            model = dashboards.as_json(build())
            api.dashboard.update_dashboard({"dashboard": model, "folderUid": prov.FOLDER_UID, "overwrite": True,
                                            "message": "jobpulse grafana publish"})
            done.append(f"dashboard {model['uid']}")
        group = prov.alerting_yaml()["groups"][0]
        rules = [{**rule, "folderUID": prov.FOLDER_UID, "ruleGroup": group["name"], "orgID": 1}
                 for rule in group["rules"]]
        api.alertingprovisioning.update_rule_group(prov.FOLDER_UID, group["name"], {
            "title": group["name"], "folderUid": prov.FOLDER_UID, "interval": 60, "rules": rules})
        done.append(f"alert rule group {group['name']} ({len(rules)} rules)")
    except GrafanaException as exc:
        raise PublishError(f"Grafana at {url} answered {exc.status_code}: {exc.message}") from None
    except OSError as exc:  # DNS, refused, TLS: niquests' errors derive from OSError
        raise PublishError(f"cannot reach Grafana at {url}: {exc}") from None
    return done


def _folder(api: GrafanaApi, done: list[str]) -> None:
    try:
        api.folder.get_folder(prov.FOLDER_UID)
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        api.folder.create_folder(dashboards.FOLDER, uid=prov.FOLDER_UID)
        done.append(f"folder {dashboards.FOLDER} created")


def _datasource(api: GrafanaApi, database: Database | None, done: list[str]) -> None:
    try:
        api.datasource.get_datasource_by_uid(dashboards.DATASOURCE_UID)
        exists = True
    except GrafanaClientError as exc:
        if exc.status_code != 404:
            raise
        exists = False
    if database is None:
        if not exists:
            raise PublishError(f"Grafana has no datasource {dashboards.DATASOURCE_UID!r}: pass --pg-host, --pg-user "
                               "and --pg-password-file to create it (a role in jobpulse_reader)")
        return
    ds: dict[str, Any] = prov.datasource(url=database.host, database=database.name, user=database.user,
                                         password=database.password)
    if exists:
        api.datasource.update_datasource_by_uid(dashboards.DATASOURCE_UID, ds)
        done.append(f"datasource {dashboards.DATASOURCE_UID} updated")
    else:
        api.datasource.create_datasource(ds)
        done.append(f"datasource {dashboards.DATASOURCE_UID} created")
