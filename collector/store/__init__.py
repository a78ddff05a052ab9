"""Store: ALL database access (writers, typed readers, roll-ups, tiers, partitions, migrations,
the SQL functions in `sql/`). Layer 3: imports `jobpulse.schema` and `jobpulse.collector.errors`
only; everything above speaks to PostgreSQL through it. Start at `database.py` (a batch's
write) and `migrations.py` (how the schema and its functions are applied)."""
