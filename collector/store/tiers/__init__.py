"""Store room `tiers`: where samples go after ingest wrote them: roll-ups and their fold, the
compact and coarse tiers, the cluster pyramid, daily partitions and retention, the ledger's runs."""
