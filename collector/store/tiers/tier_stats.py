"""Store: what each storage tier holds — rows, bytes on disk (table, indexes and TOAST of every
partition) and bytes per sample — for `jobpulse db stats` and the storage benchmark.

Rows and samples are counted exactly (a scan of each table: the compact tier and the roll-ups are
small; the raw tier holds the hot window only). A compact row or a roll-up bucket holds many samples:
``samples`` is what they stand for (a roll-up's samples are those of its finest width).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from jobpulse.collector.store.tiers.rollup import FINE_TABLE, PROCESS_WIDTHS_S, WIDTH_S

# tier -> table -> SQL expression of the samples a row stands for, and the rows it applies to
TABLES: dict[str, dict[str, tuple[str, str]]] = {
    "raw": {"gpu_samples": ("1", "true"), "process_samples": ("1", "true")},
    "compact": {"gpu_samples_compact": ("n", "true"), "process_samples_compact": ("n", "true"),
                "rank_bins_compact": ("n", "true")},
    "rollup": {FINE_TABLE: ("n", "true"), "gpu_rollup": ("n", f"width_s = {WIDTH_S}"),
               "process_rollup": ("n", f"width_s = {min(PROCESS_WIDTHS_S)}"),
               "step_rollup": ("n", f"width_s = {min(PROCESS_WIDTHS_S)}")},
}


@dataclass(frozen=True)
class TierSize:
    tier: str
    table: str
    rows: int
    samples: int
    bytes: int

    @property
    def bytes_per_sample(self) -> float | None:
        return round(self.bytes / self.samples, 2) if self.samples else None


def stats(conn: psycopg.Connection) -> list[TierSize]:
    out = []
    for tier, tables in TABLES.items():
        for table, (samples, where) in tables.items():
            size = conn.execute("SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint"
                                " FROM pg_partition_tree(%s::regclass)", (f"jobpulse.{table}",)).fetchone()
            counts = conn.execute(sql.SQL("SELECT count(*), coalesce(sum({samples}) FILTER (WHERE {where}), 0)::bigint"
                                          " FROM jobpulse.{table}").format(
                samples=sql.SQL(samples), where=sql.SQL(where), table=sql.Identifier(table))).fetchone()
            out.append(TierSize(tier, table, int(counts[0]) if counts else 0, int(counts[1]) if counts else 0,
                                int(size[0]) if size else 0))
    return out


def text(rows: list[TierSize]) -> str:
    lines = [f"{'tier':8} {'table':26} {'rows':>14} {'samples':>14} {'bytes':>16} {'bytes/sample':>13}"]
    for r in rows:
        per = "-" if r.bytes_per_sample is None else f"{r.bytes_per_sample:.1f}"
        lines.append(f"{r.tier:8} {r.table:26} {r.rows:>14,} {r.samples:>14,} {r.bytes:>16,} {per:>13}")
    return "\n".join(lines)
