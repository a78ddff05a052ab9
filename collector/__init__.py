"""Central collector: receive -> validate -> store (PostgreSQL) -> evaluate -> report."""
