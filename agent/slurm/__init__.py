"""The Slurm side: the prolog and epilog (`hooks.py`, `python -m jobpulse.agent.slurm`), what their
environment and gres.conf say about a job (`env.py`, `gres_conf.py`), the cluster-wide `squeue`
poll (`sync.py`), and the job's summary in Slurm's mail and admin comment (`mail_prog.py`,
`admin_comment.py`, both through `job_summary.py`). Layer: agent; imports `jobpulse.agent.control`,
`jobpulse.agent.shipping` and `jobpulse.schema`, never the collector. Start at `hooks.py`."""
