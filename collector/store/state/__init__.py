"""Store room `state`: what the collector decides and must remember: flags, job summaries, the
notifications outbox, evidence captures, policy actions, and which collector leads."""
