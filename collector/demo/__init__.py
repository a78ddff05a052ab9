"""Demo and watch: the whole system on one machine (an embedded PostgreSQL, a collector, agents on
the fake NVML library), and `jobpulse watch` for one job without an admin. Layer 7: may import every
collector layer below it and the agent's CLI as a process. Start at `runner.py` (`jobpulse demo`)
and `watch.py`."""
