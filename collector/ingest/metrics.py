"""The collector's own Prometheus metrics (served at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class CollectorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.batches = Counter("jobpulse_collector_batches", "Agent batches by outcome",
                               ["outcome"], registry=r)
        self.rows = Counter("jobpulse_collector_rows", "Rows stored, by table", ["table"], registry=r)
        self.rejects = Counter("jobpulse_collector_rejects", "Requests rejected with a 4xx",
                               ["status"], registry=r)
        self.db_errors = Counter("jobpulse_collector_db_errors", "Requests answered 503 because of the database",
                                 registry=r)
        self.db_up = Gauge("jobpulse_collector_db_up", "1 when the last database access succeeded", registry=r)
        self.batch_seconds = Histogram(
            "jobpulse_collector_batch_seconds", "Time from request to commit for stored batches",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=r)
        self.agent_dropped = Counter("jobpulse_collector_agent_dropped",
                                     "Records agents reported dropping (spool full, rate limits)",
                                     ["kind"], registry=r)
        self.rule_seconds = Histogram("jobpulse_collector_rule_cycle_seconds", "Time of one rule evaluation cycle",
                                      buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.rule_errors = Counter("jobpulse_collector_rule_errors", "Failed rule evaluation cycles", registry=r)
        self.group_batches = Histogram("jobpulse_collector_group_batches",
                                       "Batches stored together in one transaction (group commit)",
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        self.leader = Gauge("jobpulse_collector_leader", "1 while this collector runs rules and maintenance",
                            registry=r)
        self.notifications = Counter("jobpulse_collector_notifications",
                                     "Flag notifications by outcome: delivered, failed (retried), given_up, held",
                                     ["outcome"], registry=r)
        self.maintenance_errors = Counter("jobpulse_collector_maintenance_errors",
                                          "Failed partition maintenance runs", registry=r)
