"""Rules: judging jobs from what the store reads (registry of rules, thresholds from TOML, flag
lifecycle, backtest). Layer 4: imports the store's readers and `jobpulse.schema`, holds no SQL.
Start at `registry.py` (every rule as a row: id, scope, statistics, thresholds, advice), then
`engine.py` (one cycle) and `rules_default.toml` (each threshold with its reason)."""
