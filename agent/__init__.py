"""Node agent: sample (NVML, /proc) -> attribute (job, step, rank, PID) -> batch -> ship (spool).
Layer: the agent; imports `jobpulse.schema`, never the collector. Here: the loop (`run.py`), its
command line (`cli.py`), NVML and /proc (`nvml.py`, `procfs.py`, `attribution.py`) and the job's
own client (`client.py`); by stage: `sources/` (what is read), `control/` (the hooks' socket),
`shipping/` (batch, spool, send), `capture/` (a flag's evidence), `slurm/` (prolog, epilog, sync,
mail). Start at `run.py`."""
