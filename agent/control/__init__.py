"""The control socket: the Slurm hooks register and unregister jobs through it (`listen.py`), the
agent answers (`answer.py`) from the jobs this node serves (`jobs.py`), and a request it could not
take in time waits beside the socket (`backlog.py`). Layer: agent; imports `jobpulse.agent.nvml`,
`jobpulse.agent.attribution`, `jobpulse.agent.shipping` and `jobpulse.schema`. Start at `listen.py`."""
