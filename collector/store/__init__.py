"""Store: ALL database access. Layer 3: imports `jobpulse.schema` and `jobpulse.collector.errors`
only; everything above speaks to PostgreSQL through it. At the top, `database.py` writes a batch
(and answers the API's job queries) and `connect.py` opens connections; the rooms below hold the
stages: `migrate/` makes the schema, `tiers/` moves samples through roll-ups, compaction and
retention, `read/` answers rules, reports and dashboards, `state/` keeps what the collector
decides (flags, summaries, outbox, captures, policy actions, leadership)."""
