"""Captures: the evidence a flag asks of its job, taken on the node for a few seconds: the rank's
Python stacks (`stacks.py`, py-spy) and a profiler trace its in-job client hands over (`trace.py`),
summarized in a bounded child process (`bounded.py` runs `trace_summary.py`). Layer: agent; imports
`jobpulse.agent.procfs` and `jobpulse.schema`, never the collector. Start at `stacks.py`."""
