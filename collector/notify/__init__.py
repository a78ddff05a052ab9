"""Notify: telling people (webhooks from an outbox, Slurm mail, the site policy that warns, then
cancels or requeues). Layer 5: reads flags through the store, never writes samples; never imports
ingest, reports or dashboards. Start at `channels.py` (who hears what) and `delivery.py`."""
