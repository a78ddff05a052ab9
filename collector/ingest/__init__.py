"""Ingest: the HTTP side (receive, authenticate, validate, group commit, OpenAPI). Layer 5: imports
the store, the rules' types and `jobpulse.schema`; never reports, dashboards or notify. Start at
`app.py` (the routes) and `receive.py` (a batch's way from bytes to a commit); `jobpulse import`
lives in `collector/recordings/`."""
