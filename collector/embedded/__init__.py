"""Embedded: the central half of jobpulse on one machine, for `jobpulse demo`, `jobpulse watch`, the
tests and the benchmarks: a private PostgreSQL server (and a Citus cluster) of this process's own,
migrated, and a collector on a free loopback port. Layer 7: may import the store and the service;
nothing below imports it. Start at `postgres.py`, then `stack.py`."""
