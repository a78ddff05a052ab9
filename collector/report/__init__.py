"""Report: what a person reads about a job or a period (text, JSON, HTML, the job summary, the
digest, goodput). Layer 5: imports the store's readers, the rules and `jobpulse.schema`; never
ingest, dashboards or notify. Start at `text.py` (`jobpulse report JOBID`) and `summary.py`."""
