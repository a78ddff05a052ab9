"""The shipping path: records become one wire batch per flush (`batch.py`), are written to the spool
before anything is sent (`spool.py`), and are POSTed in order over one kept-alive connection
(`send.py`, `http_post.py`) until the collector acknowledges them. Layer: agent; imports only
`jobpulse.schema`. Start at `send.py`."""
