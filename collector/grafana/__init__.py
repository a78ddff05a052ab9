"""Grafana: the dashboards as code (panels, queries on the public SQL, alert rules) and their
provisioning and publishing. Layer 5: imports `jobpulse.schema` and the store's names; no database
connection of its own at build time. Start at `dashboards.py`, then `panels.py`."""
