"""Rules on the network between a job's nodes (`links`: communication-bound jobs, degraded links)."""
