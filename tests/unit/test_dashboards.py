"""Grafana as code without a server: the committed dashboards and provisioning are what the code
generates, the provisioning names only datasources and folders it defines, and `grafana publish`
says what is wrong with a URL or a token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard

from jobpulse.collector.grafana import dashboards
from jobpulse.collector.grafana import provisioning as grafana_provisioning

ROOT = Path(__file__).resolve().parents[2]


def test_dashboards_and_provisioning_are_generated_and_consistent() -> None:
    for name, text in dashboards.render_all().items():
        committed = ROOT / "dashboards" / name
        assert committed.read_text() == text, f"dashboards/{name} differs from the code: run `jobpulse grafana build`"
        model = json.loads(text)
        # Grafana 11 dashboard JSON: the typed model reads panels, variables and settings back
        # unchanged (its annotation target type knows only Grafana's built-in annotations).
        again = dashboards.as_json(Dashboard.from_json(model))
        assert {k: v for k, v in again.items() if k != "annotations"} == \
            {k: v for k, v in model.items() if k != "annotations"}
        assert model["schemaVersion"] >= 39 and model["uid"].startswith("jobpulse-")
        ids = [p["id"] for p in model["panels"]]
        assert len(ids) == len(set(ids))
        for p in model["panels"]:
            assert p["type"] in {"timeseries", "table", "stat", "heatmap"}
            assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
            for t in p["targets"]:
                assert t["datasource"]["uid"] == dashboards.DATASOURCE_UID
    docs = {}
    for path, text in grafana_provisioning.render_all().items():
        committed = ROOT / "deploy" / "grafana" / "provisioning" / path
        assert committed.read_text() == text, f"deploy/grafana/provisioning/{path} differs: run `jobpulse grafana build`"
        docs[path] = yaml.safe_load(text)
    datasource_uids = {d["uid"] for d in docs["datasources/jobpulse.yaml"]["datasources"]}
    folders = {p["folder"] for p in docs["dashboards/jobpulse.yaml"]["providers"]}
    assert docs["datasources/jobpulse.yaml"]["datasources"][0]["jsonData"]["timeInterval"] == "1s"
    for group in docs["alerting/jobpulse.yaml"]["groups"]:
        assert group["folder"] in folders
        for rule in group["rules"]:
            refs = {d["datasourceUid"] for d in rule["data"]}
            assert refs <= datasource_uids | {"__expr__"}, rule["uid"]
            assert rule["condition"] in {d["refId"] for d in rule["data"]}
            assert "f.severity" in rule["data"][0]["model"]["rawSql"] and "f.category" in rule["data"][0]["model"]["rawSql"]
    for model in (json.loads(t) for t in dashboards.render_all().values()):
        for p in model["panels"]:
            for t in p["targets"]:
                assert t["datasource"]["uid"] in datasource_uids


def test_publish_says_what_is_wrong_with_url_or_token(tmp_path: Path) -> None:
    """No Grafana can be installed here: the success path is not exercised; the two mistakes a user
    makes are — nothing listening at the URL, and a token Grafana refuses (a server answering 401
    with Grafana's JSON body, as Grafana does for a bad service-account token)."""
    import http.server
    import socket
    import threading

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "grafana", "publish", *args],
                              capture_output=True, text=True, timeout=60)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = cli("--url", f"http://127.0.0.1:{port}", "--token", "x")
    assert out.returncode == 1 and "cannot reach Grafana" in out.stderr and "Traceback" not in out.stderr

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"message":"invalid API key"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = cli("--url", f"http://127.0.0.1:{server.server_address[1]}", "--token", "wrong")
    finally:
        server.shutdown()
    assert out.returncode == 1 and "rejected the token (401)" in out.stderr and "Traceback" not in out.stderr
    missing = cli("--url", "http://127.0.0.1:1")
    assert missing.returncode == 2 and "--token is required" in missing.stderr
