"""The fabric a job's rules read: its RDMA ports minute by minute over the look-back (`fabric_samples`).

Only rows the agent attributed to the job count: a node the job holds alone reports its traffic as
the job's; on a shared node the traffic is the node's (job_id NULL) and is not the job's evidence.
One row per port and minute: mean throughput, the link as it trained (its narrowest and slowest in
the minute against the port's best), how many samples found it ACTIVE, and the span of its link
error counters (their sum: a rise is a fault whichever counter rose).
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from jobpulse.schema.fields import FABRIC_LINK_ERRORS

MINUTE_S = 60

_ERRORS = " + ".join(f"coalesce(f.{name}, 0)" for name in FABRIC_LINK_ERRORS)

QUERY = f"""
SELECT x.c, x.j, f.node, f.device, f.port,
       date_bin(interval '{MINUTE_S} seconds', f.ts, timestamptz 'epoch') AS minute, count(*)::int AS n,
       avg(f.rx_kbs)::float8 AS rx_kbs, avg(f.tx_kbs)::float8 AS tx_kbs,
       min(f.rate_gbps)::float8 AS rate_gbps, min(f.width)::int AS width,
       max(f.rate_max_gbps)::float8 AS rate_max_gbps, max(f.width_max)::int AS width_max,
       (count(*) FILTER (WHERE f.port_state = 4))::int AS active, min(f.link_layer) AS link_layer,
       min({_ERRORS})::bigint AS errors_lo, max({_ERRORS})::bigint AS errors_hi
  FROM unnest(%(c)s::text[], %(j)s::text[]) AS x(c, j)
  JOIN jobpulse.fabric_samples f ON f.cluster = x.c AND f.job_id = x.j
 WHERE f.ts > %(now)s - %(lookback)s AND f.ts <= %(now)s
 GROUP BY 1, 2, 3, 4, 5, 6
"""
"""The per-job read ``fabric`` (`rule_reads.JOB_READS`): `PortMinute` rows of the jobs asked."""


class PortMinute(NamedTuple):
    """One RDMA port of a job's node over one minute."""

    cluster: str
    job_id: str
    node: str
    device: str
    port: int
    minute: datetime
    n: int  # samples
    rx_kbs: float | None  # mean receive throughput, KB/s (None: no rate yet)
    tx_kbs: float | None
    rate_gbps: float | None  # the slowest the link ran in the minute
    width: int | None  # the narrowest, lanes
    rate_max_gbps: float | None  # the port's best (its own, or a like port's on the node)
    width_max: int | None
    active: int  # samples with the port ACTIVE
    link_layer: str | None
    errors_lo: int  # the link error counters' sum, lowest and highest in the minute
    errors_hi: int

    @property
    def key(self) -> str:
        return f"{self.node}/{self.device}/{self.port}"

    @property
    def traffic_kbs(self) -> float:
        return (self.rx_kbs or 0.0) + (self.tx_kbs or 0.0)

    @property
    def link_kbs(self) -> float | None:
        """What the link carries at its current rate each way, KB/s (1 KB = 1024 bytes)."""
        return self.rate_gbps * 1e9 / 8 / 1024 if self.rate_gbps else None
