"""Store room `read`: typed reads for the layers above: what the rules judge, what reports and
goodput show, and the series functions Grafana panels read through."""
