"""The contract between agent and collector: the wire format and the SQL migrations."""
