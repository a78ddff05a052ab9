"""Demo: the whole system on one machine for a first look (`jobpulse demo`): an embedded PostgreSQL
and collector (`collector/embedded/`), three simulated nodes of real agents on the fake NVML library
(`fake_nvml.c`, also what the tests build), real rank processes. Layer 7: may import every collector
layer below it and runs the agent's CLI as processes. Start at `runner.py`."""
