"""Sources: what the agent reads on the node, one module each (NVML devices, processes, health
events, topology, the job's own events). Layer: agent; imports `jobpulse.agent.nvml`,
`jobpulse.agent.procfs`, `jobpulse.agent.attribution` and `jobpulse.schema`, never the collector.
Start at `gpu.py` (one tick of every GPU's fields from `schema/fields.py`)."""
