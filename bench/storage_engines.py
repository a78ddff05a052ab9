"""Storage engines benchmark (not a test): jobpulse's hand-built compact tier against what an existing
engine gives, on the same rows, in one run.

Why: jobpulse keeps months of 1 Hz samples through tiers of its own (docs/storage.md): the compact
tier (`collector/store/tiers/compact.py`: every field packed into byte planes by generated SQL), the
coarse 1,800 s buckets (`coarse.py`), the cluster dashboards' pyramid (`pyramid.py`) and the ranks'
10 s bins. An issue asks whether Citus' columnar table access method or PostgreSQL's own TOAST
compression would do instead; docs/storage-decision.md records the answer and this is its evidence.

One private PostgreSQL (its own free port and data folder under /tmp, stopped at the end) holds one
training job, written the way ingest writes it (bench/storage.py's `generate` and `ingest`: ``--nodes``
nodes x 8 GPUs at 1 Hz, four processes per GPU, Hopper GPM metrics rounded as the agent rounds
them), and then the same rows stored as each variant:

    a   heap: the raw rows in plain tables with the raw tier's indexes (PostgreSQL 15's default TOAST
        compression, pglz);
    b   jobpulse's compact tier after `compact.compact` (with its rank bins; compaction also makes
        the coarse buckets and the pyramid hours, which count in its CPU);
    c   Citus columnar (`USING columnar`), a day partition converted by `convert_due` below: zstd
        (the default) and lz4 without indexes, zstd with the raw tier's indexes (what attaching a
        columnar partition to `jobpulse.gpu_samples` as it is builds), zstd with 1,000-row chunk
        groups; timed with every qual pushed to the chunk groups (`PUSH_ALL`), zstd also without;
    d   heap with lz4 TOAST compression on every variable-length column.

For each: bytes on disk (pg_total_relation_size of its tables, plus Citus' metadata rows for
columnar) per GPU sample, the CPU seconds that produced it (backend + this process, /proc), and
query times (min and median of ``--runs``, the variants taken in a rotating order in every round)
for a job's GPU series over an hour at 10 s steps, one GPU's raw samples over 15 minutes, a day's
per-job average SM utilization, and a 15-minute rank panel at 10 s steps; beside them what jobpulse
itself reads for those panels (10 s roll-ups, pyramid, rank bins). It checks that every variant
returns the same rows, what a columnar partition refuses (UPDATE, DELETE), and counts the lines of
code of each approach.

    .venv/bin/python -m bench.storage_engines [--nodes 4] [--hours 6] [--runs 7]

Writes bench/results/storage_engines.json.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import tokenize
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))  # bench/storage.py imports its sibling `seed` as a script does

from harness import save  # noqa: E402
from seed import database  # noqa: E402
from storage import cpu_of, generate, ingest  # noqa: E402

from jobpulse.collector.embedded.citus_cluster import citus_installed, citus_library  # noqa: E402
from jobpulse.collector.embedded.postgres import find_bindir  # noqa: E402
from jobpulse.collector.store.read.series import _parts  # noqa: E402  (gpu_series' own aggregate of each column)
from jobpulse.collector.store.tiers import coarse, compact, partitions, pyramid  # noqa: E402
from jobpulse.schema.fields import GPU_FIELDS  # noqa: E402

GPUS_PER_NODE = 8
PROCESSES_PER_GPU = 4  # bench/storage.py's `generate`: the rank and three data-loader workers
HOT_HOURS = compact.HOT_HOURS
ORDER = {"gpu_samples": "node, gpu_uuid, ts", "process_samples": "node, job_id, pid, ts"}  # the compact tier's
RAW = ("gpu_samples", "process_samples")
COLUMNAR = {  # variant c: name -> (its columnar storage options, with the raw tier's indexes)
    "c_columnar_zstd": ("columnar.compression = zstd", False),
    "c_columnar_lz4": ("columnar.compression = lz4", False),
    "c_columnar_zstd_indexed": ("columnar.compression = zstd", True),
    "c_columnar_zstd_1k_groups": ("columnar.compression = zstd, columnar.chunk_group_row_limit = 1000", False),
}
# Citus pushes a scan's WHERE down to its chunk groups' min/max only for columns whose correlation
# with the physical order passes columnar.qual_pushdown_correlation_threshold (default 0.9): sorted by
# (node, GPU, time), time and GPU are not, and every chunk group of the node is read. The variants are
# timed with 0 (push every qual), and c_columnar_zstd once more with the default.
PUSH_ALL = "SET columnar.qual_pushdown_correlation_threshold = 0"
DEFAULT_PUSHDOWN = "c_columnar_zstd_default_pushdown"


# --- What variant c needs in production: convert day partitions past the hot window ---------------

def index_statements(conn: psycopg.Connection, parent: str, target: str) -> list[str]:
    """CREATE INDEX statements giving ``target`` the indexes of ``parent`` (those ATTACH PARTITION
    would otherwise build, or attach where they exist)."""
    rows = conn.execute("SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass ORDER BY 1",
                        (parent,)).fetchall()
    return [re.sub(r"^CREATE (UNIQUE )?INDEX \S+ ON (ONLY )?\S+", rf"CREATE \1INDEX ON {target}", r[0]) for r in rows]


def convert_partition(conn: psycopg.Connection, parent: str, partition: str, lo: datetime, hi: datetime,
                      order: str, options: str) -> None:
    """Replace one day's heap partition of ``parent`` by a columnar copy sorted by ``order``, in one
    transaction (a crash leaves the heap partition as it was). Late rows for the day wait on the
    lock and land in the columnar partition afterwards; the CHECK constraint and the indexes made
    beforehand keep ATTACH from scanning or building under the parent's lock."""
    new, name = f"{partition}_columnar", partition.split(".")[-1]
    bounds = {"lo": sql.Literal(lo), "hi": sql.Literal(hi)}
    with conn.transaction():
        conn.execute("SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL work_mem = '64MB'")
        conn.execute(f"LOCK TABLE {partition} IN SHARE MODE")
        conn.execute(f"CREATE TABLE {new} (LIKE {partition}) USING columnar")
        conn.execute(f"ALTER TABLE {new} SET ({options})")
        conn.execute(f"INSERT INTO {new} SELECT * FROM {partition} ORDER BY {order}")
        conn.execute(sql.SQL(f"ALTER TABLE {new} ADD CHECK (ts >= {{lo}} AND ts < {{hi}})").format(**bounds))
        for statement in index_statements(conn, parent, new):
            conn.execute(statement)
        conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {partition}")
        conn.execute(f"DROP TABLE {partition}")
        conn.execute(f"ALTER TABLE {new} RENAME TO {name}")
        conn.execute(sql.SQL(f"ALTER TABLE {parent} ATTACH PARTITION {partition}"
                             " FOR VALUES FROM ({lo}) TO ({hi})").format(**bounds))


def convert_due(conn: psycopg.Connection, parent: str, before: datetime, order: str,
                options: str = "columnar.compression = zstd") -> list[str]:
    """Convert every heap partition of ``parent`` whose day ended before ``before`` (the hot window's
    start), with the columnar storage ``options``; returns their names. Run again, it finds nothing
    left to do."""
    rows = conn.execute(
        "SELECT c.oid::regclass::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_am a ON a.oid = c.relam"
        " WHERE i.inhparent = %s::regclass AND a.amname = 'heap' ORDER BY 1", (parent,)).fetchall()
    done = []
    for partition, bound in rows:
        lo, hi = (datetime.fromisoformat(v) for v in re.findall(r"'([^']+)'", bound))
        if hi <= before:
            convert_partition(conn, parent, partition, lo, hi, order, options)
            done.append(partition)
    return done


# --- Building the variants from the same raw rows ---------------------------------------------------

def relation_bytes(conn: psycopg.Connection, table: str) -> int:
    """Table, indexes and TOAST of a table and all its partitions; for columnar partitions also the
    rows Citus keeps about their stripes and chunks in its own catalog (pg_column_size of each)."""
    size = conn.execute("SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint FROM"
                        " (SELECT relid FROM pg_partition_tree(%s::regclass) UNION SELECT %s::regclass) t",
                        (table, table)).fetchone()
    total = int(size[0]) if size else 0
    if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus_columnar'").fetchone() is None:
        return total
    for catalog in ("stripe", "chunk_group", "chunk"):
        meta = conn.execute(
            f"SELECT coalesce(sum(pg_column_size(m.*)), 0)::bigint"
            f" FROM (SELECT relid FROM pg_partition_tree(%s::regclass) UNION SELECT %s::regclass) t"
            f" JOIN pg_class c ON c.oid = t.relid JOIN pg_am a ON a.oid = c.relam AND a.amname = 'columnar'"
            f" JOIN columnar_internal.{catalog} m ON m.storage_id = columnar.get_storage_id(t.relid)",
            (table, table)).fetchone()
        total += int(meta[0]) if meta else 0
    return total


def heap_copy(conn: psycopg.Connection, name: str, lz4: bool) -> float:
    """``engines.<name>_{gpu,process}``: plain tables with the raw tier's indexes, filled in time
    order (as ingest fills them); with ``lz4``, every variable-length column compressed with lz4.
    Returns the CPU seconds of filling them."""
    backend = conn.info.backend_pid
    c = cpu_of(backend)
    for raw in RAW:
        table = f"engines.{name}_{raw.split('_')[0]}"
        conn.execute(f"CREATE TABLE {table} (LIKE jobpulse.{raw} INCLUDING DEFAULTS INCLUDING STORAGE)")
        if lz4:
            for (col,) in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                                       " AND attnum > 0 AND attlen = -1", (table,)).fetchall():
                conn.execute(f"ALTER TABLE {table} ALTER COLUMN {col} SET COMPRESSION lz4")
        for statement in index_statements(conn, f"jobpulse.{raw}", table):
            conn.execute(statement)
        with conn.transaction():
            conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
            conn.execute(f"INSERT INTO {table} SELECT * FROM jobpulse.{raw} ORDER BY ts, node")
    return cpu_of(backend) - c


def columnar_copy(conn: psycopg.Connection, name: str, day: datetime, options: str, indexed: bool) -> float:
    """``engines.<name>_{gpu,process}``: tables partitioned like the raw ones (with their indexes
    where ``indexed``) whose day partition is filled as a heap (not timed) and then converted by
    `convert_due`, as production would run it. Returns the CPU seconds of the conversion."""
    backend = conn.info.backend_pid
    parents = []
    for raw in RAW:
        parent = f"engines.{name}_{raw.split('_')[0]}"
        conn.execute(f"CREATE TABLE {parent} (LIKE jobpulse.{raw} INCLUDING DEFAULTS) PARTITION BY RANGE (ts)")
        if indexed:
            for statement in index_statements(conn, f"jobpulse.{raw}", parent):
                conn.execute(statement)
        conn.execute(sql.SQL(f"CREATE TABLE {parent}_p PARTITION OF {parent} FOR VALUES FROM ({{lo}}) TO ({{hi}})")
                     .format(lo=sql.Literal(day), hi=sql.Literal(day + timedelta(days=1))))
        conn.execute(f"INSERT INTO {parent} SELECT * FROM jobpulse.{raw}")
        parents.append((parent, raw))
    conn.execute("CHECKPOINT")
    c = cpu_of(backend)
    for parent, raw in parents:
        convert_due(conn, parent, datetime.now(UTC) - timedelta(hours=HOT_HOURS), ORDER[raw], options)
    return cpu_of(backend) - c


def toast_use(conn: psycopg.Connection, table: str) -> dict[str, Any]:
    """How many of a heap table's variable-length values TOAST compressed, and how wide its rows are
    (PostgreSQL compresses a row's values only when the row passes ~2 kB, TOAST_TUPLE_THRESHOLD)."""
    cols = [r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                                       " AND attnum > 0 AND attlen = -1", (table,)).fetchall()]
    counts = " + ".join(f"count(pg_column_compression(t.{c}))" for c in cols) or "0"
    row = conn.execute(f"SELECT {counts}, avg(pg_column_size(t.*))::int, max(pg_column_size(t.*)),"
                       f" pg_total_relation_size(reltoastrelid) FROM {table} t, pg_class"
                       f" WHERE pg_class.oid = %s::regclass GROUP BY reltoastrelid", (table,)).fetchone()
    return {"compressed_values": row[0], "row_bytes_avg": row[1], "row_bytes_max": row[2], "toast_table_bytes": row[3]}


def columnar_layout(conn: psycopg.Connection, table: str) -> dict[str, Any]:
    """Stripes, chunk groups and the options Citus recorded for a columnar table's partitions."""
    row = conn.execute(
        "SELECT count(DISTINCT (s.storage_id, s.stripe_num)), sum(s.chunk_group_count), min(o.compression::text),"
        " min(o.chunk_group_row_limit)"
        "  FROM pg_partition_tree(%s::regclass) t JOIN columnar.stripe s ON s.storage_id = columnar.get_storage_id(t.relid)"
        "  JOIN columnar.options o ON o.relation = t.relid", (table,)).fetchone()
    return {"stripes": row[0], "chunk_groups": row[1], "compression": row[2], "chunk_group_row_limit": row[3]} \
        if row else {}


# --- Queries ------------------------------------------------------------------------------------------

SERIES_AGGREGATES = ", ".join(_parts(f)[1] for f in GPU_FIELDS if f.series)

QUERIES: dict[str, tuple[str, str]] = {  # name -> (what, SQL over {gpu} / {process})
    "job_gpu_series_1h_10s": (
        "one job's GPU series (every gpu_series column) over one hour at 10 s steps",
        f"SELECT s.node, s.gpu_uuid, date_bin('10 seconds', s.ts, timestamptz 'epoch') AS t, {SERIES_AGGREGATES}"
        " FROM {gpu} s WHERE s.cluster = 'big' AND s.job_id = '1' AND s.ts >= %(lo)s AND s.ts < %(hi)s"
        " GROUP BY 1, 2, 3"),
    "gpu_raw_15min": (
        "one GPU's raw samples (every column) over 15 minutes",
        "SELECT s.* FROM {gpu} s WHERE s.cluster = 'big' AND s.node = 'node0' AND s.gpu_uuid = 'GPU-3'"
        " AND s.ts >= %(lo)s AND s.ts < %(hi)s ORDER BY s.ts"),
    "day_job_avg_sm": (
        "a whole day's average SM utilization per job",
        "SELECT s.job_id, avg(s.sm_util::float8), count(*) FROM {gpu} s"
        " WHERE s.cluster = 'big' AND s.ts >= %(lo)s AND s.ts < %(hi)s GROUP BY 1"),
    "rank_panel_15min_10s": (
        "a 15-minute rank panel at 10 s steps: each rank's mean CPU percent and SM utilization",
        "SELECT s.rank, date_bin('10 seconds', s.ts, timestamptz 'epoch') AS t, avg(s.cpu_percent::float8),"
        " avg(s.sm_util::float8) FROM {process} s WHERE s.cluster = 'big' AND s.job_id = '1' AND s.rank IS NOT NULL"
        " AND s.ts >= %(lo)s AND s.ts < %(hi)s GROUP BY 1, 2"),
}

# What jobpulse reads for the same panels (in every variant: ingest keeps the roll-ups, compaction the
# pyramid hours and the bins); the raw 15 minutes of one GPU it reads from the samples (b). The series
# functions take a closed range: ending it a microsecond early leaves out the bin that starts at its end.
JOBPULSE_READS: dict[str, str] = {
    "job_gpu_series_1h_10s": "SELECT * FROM jobpulse.gpu_series('big', '1', %(lo)s,"
                             " %(hi)s - interval '1 microsecond', 10)",
    "day_job_avg_sm": "SELECT job_id, sum(sum_sm_util) / sum(n), sum(n) FROM jobpulse.node_job_rollup"
                      " WHERE cluster = 'big' AND width_s = jobpulse.pyramid_width(%(lo)s, %(hi)s)"
                      " AND bucket >= %(lo)s AND bucket < %(hi)s GROUP BY 1",
    "rank_panel_15min_10s": "SELECT * FROM jobpulse.rank_series('big', '1', %(lo)s,"
                            " %(hi)s - interval '1 microsecond', 10)",
}


def sources(variant: str, lo: str, hi: str) -> dict[str, str]:
    """The tables a variant's queries read ({gpu}, {process})."""
    if variant == "b_compact":
        return {"gpu": f"jobpulse.gpu_samples_between({lo}, {hi})",
                "process": f"jobpulse.process_samples_between({lo}, {hi})"}
    if variant == DEFAULT_PUSHDOWN:
        variant = "c_columnar_zstd"
    return {"gpu": f"engines.{variant}_gpu", "process": f"engines.{variant}_process"}


def digest(rows: Sequence[tuple[Any, ...]]) -> str:
    """Order-free fingerprint of a result, floats to 9 significant digits (averages summed in another
    order differ in their last bits)."""
    norm = sorted(repr(tuple(f"{v:.9g}" if isinstance(v, float) else v for v in r)) for r in rows)
    return hashlib.sha256("\n".join(norm).encode()).hexdigest()[:16]


def time_queries(conns: dict[str, psycopg.Connection], variants: list[str],
                 ranges: dict[str, dict[str, datetime]], runs: int) -> dict[str, Any]:
    """Every query on every variant (and jobpulse's own read), the variants in a rotating order in
    each of ``runs`` rounds after one warm-up: min and median ms, rows, fingerprint. ``conns``: the
    session each variant runs in (key "" for all the others)."""
    plans: dict[tuple[str, str], str] = {}
    for q, (_, template) in QUERIES.items():
        for v in variants:
            plans[q, v] = template.format(**sources(v, "%(lo)s", "%(hi)s"))
        if q in JOBPULSE_READS:
            plans[q, "jobpulse_reads"] = JOBPULSE_READS[q]
    out: dict[str, Any] = {q: {"what": what, "range": {k: v.isoformat() for k, v in ranges[q].items()}, "variants": {}}
                           for q, (what, _) in QUERIES.items()}
    times: dict[tuple[str, str], list[float]] = {k: [] for k in plans}
    for (q, v), query in plans.items():  # warm-up: caches, plans; and what each returns
        rows = conns.get(v, conns[""]).execute(query, ranges[q]).fetchall()
        out[q]["variants"][v] = {"rows": len(rows), "digest": digest(rows)}
    keys = list(plans)
    for r in range(runs):
        for q in QUERIES:
            here = [k for k in keys if k[0] == q]
            for k in here[r % len(here):] + here[:r % len(here)]:
                conn = conns.get(k[1], conns[""])
                t = time.perf_counter()
                conn.execute(plans[k], ranges[q]).fetchall()
                times[k].append((time.perf_counter() - t) * 1000)
    for (q, v), ts in times.items():
        out[q]["variants"][v].update(ms_min=round(min(ts), 1), ms_median=round(statistics.median(ts), 1),
                                     ms_all=[round(t, 1) for t in ts])
    for q in QUERIES:
        ref = out[q]["variants"]["a_heap"]["digest"]
        out[q]["same_rows_as_a"] = {v: d["digest"] == ref for v, d in out[q]["variants"].items()
                                    if v != "jobpulse_reads"}
    return out


def columnar_plans(conns: dict[str, psycopg.Connection], variants: list[str],
                   ranges: dict[str, dict[str, datetime]]) -> dict[str, list[str]]:
    """The lines of EXPLAIN ANALYZE that say what a columnar scan skipped or which index it used."""
    out = {}
    for v in (v for v in variants if v.startswith("c_")):
        for q, (_, template) in QUERIES.items():
            plan = conns.get(v, conns[""]).execute("EXPLAIN (ANALYZE, TIMING off) " + template.format(**sources(v, "%(lo)s", "%(hi)s")),
                                ranges[q]).fetchall()
            out[f"{q} {v}"] = [r[0].strip() for r in plan if re.search(r"Chunk Groups|Index|Custom Scan|Seq Scan", r[0])]
    return out


# --- What a columnar partition refuses, checked -------------------------------------------------------

def columnar_behaviour(conn: psycopg.Connection, parent: str, t0: datetime) -> dict[str, str]:
    """Late rows, UPDATE, DELETE, retention on a parent whose day partition is columnar (each in a
    transaction rolled back, so the measured table stays as it was)."""
    checks = {
        "late INSERT (a spool replayed days later)":
            f"INSERT INTO {parent} SELECT * FROM {parent} WHERE ts < %(t)s + interval '1 minute'",
        "UPDATE of samples": f"UPDATE {parent} SET sm_util = 0 WHERE ts < %(t)s + interval '1 minute'",
        "DELETE of samples (what compaction does to raw rows)": f"DELETE FROM {parent} WHERE ts < %(t)s + interval '1 minute'",
        "retention: DROP the day's partition": f"DROP TABLE {parent}_p",
    }
    out = {}
    for what, statement in checks.items():
        try:
            with conn.transaction(force_rollback=True):
                cur = conn.execute(statement, {"t": t0} if "%(t)s" in statement else None)
                out[what] = f"ok ({cur.rowcount} rows)" if cur.rowcount >= 0 else "ok"
        except psycopg.Error as e:
            out[what] = f"refused: {e.diag.message_primary}"
    return out


# --- Lines of code --------------------------------------------------------------------------------------

def python_lines(path: Path, names: Sequence[str] | None = None) -> int:
    """Non-blank lines holding code, not comments or docstrings; of the functions ``names`` only
    where given."""
    src = path.read_text()
    tree = ast.parse(src)
    docs: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                docs.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    lines = src.splitlines()
    keep = {n for n in code - docs if lines[n - 1].strip()}
    if names is not None:
        spans = [range(n.lineno, (n.end_lineno or n.lineno) + 1) for n in tree.body
                 if isinstance(n, ast.FunctionDef) and n.name in names]
        keep = {n for n in keep if any(n in s for s in spans)}
    return len(keep)


def sql_lines(path: Path) -> int:
    """Non-blank lines of an SQL file that are not only a `--` comment."""
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("--"))


HAND_BUILT = {
    "compact tier": ["collector/store/tiers/compact.py", "schema/migrations/0012_compact_tier.sql"],
    "coarse buckets": ["collector/store/tiers/coarse.py", "schema/migrations/0019_coarse_buckets.sql"],
    "pyramid": ["collector/store/tiers/pyramid.py", "schema/migrations/0027_node_job_rollup.sql",
                "schema/migrations/0028_pyramid_counter_increases.sql", "schema/migrations/0029_pyramid_hours.sql",
                "schema/migrations/0030_node_rollup.sql"],
    "rank bins": ["schema/migrations/0031_rank_bins.sql"],  # their packing SQL is in compact.py (_RANK_BINS)
}
COLUMNAR_NEEDS = ("index_statements", "convert_partition", "convert_due")


def lines_of_code() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part, paths in HAND_BUILT.items():
        files = {p: python_lines(ROOT / p) if p.endswith(".py") else sql_lines(ROOT / p) for p in paths}
        out[part] = {"files": files, "total": sum(files.values())}
    out["hand-built total"] = sum(v["total"] for v in out.values())
    out["columnar (variant c)"] = {
        "files": {f"bench/storage_engines.py: {', '.join(COLUMNAR_NEEDS)}": python_lines(Path(__file__), COLUMNAR_NEEDS),
                  "a migration: CREATE EXTENSION citus_columnar": 1},
    }
    out["columnar (variant c)"]["total"] = sum(out["columnar (variant c)"]["files"].values())
    return out


# --- The run ----------------------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    pg = subprocess.run([str(find_bindir() / "postgres"), "--version"], capture_output=True, text=True).stdout.strip()
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return {"cpu": re.sub(r"\s+", " ", cpu), "nproc": int(nproc), "memory_gib": round(mem / 2**20, 1),
            "os": platform.platform(), "python": platform.python_version(), "postgresql": pg,
            "citus": str(citus_library()) if citus_installed() else "not installed"}


def code_state() -> dict[str, Any]:
    """The commit of the checkout and which of the files measured differ from it (others may be
    editing the checkout while this runs)."""
    paths = ["bench/storage.py", "bench/seed.py", *(p for ps in HAND_BUILT.values() for p in ps)]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=ROOT, capture_output=True,
                           text=True).stdout.splitlines()
    return {"head": head.strip(), "uncommitted_changes_in_measured_files": [d[3:] for d in dirty]}


def load() -> dict[str, Any]:
    """Load average and the busiest processes now (what else ran: shared machines' figures are contended)."""
    one, five, fifteen = os.getloadavg()
    top = [t for t in subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"], capture_output=True,
                                     text=True).stdout.splitlines() if t.split()[-1] != "ps"][:6]
    return {"at": datetime.now(UTC).isoformat(timespec="seconds"), "loadavg_1_5_15": [one, five, fifteen],
            "busiest_processes_pcpu_comm": [t.strip() for t in top]}


def run(nodes: int, hours: float, runs: int) -> dict[str, Any]:
    gpus, seconds = nodes * GPUS_PER_NODE, int(hours * 3600)
    chunk_s = int(compact.CHUNK.total_seconds())  # start on a chunk, past the hot window (as bench/storage.py)
    t0 = datetime.fromtimestamp(int((datetime.now(UTC) - timedelta(days=4)).timestamp()) // chunk_s * chunk_s, UTC)
    day = datetime(t0.year, t0.month, t0.day, tzinfo=UTC)
    gpu_samples, gpu_days = gpus * seconds, gpus * seconds / 86400
    ranges = {"job_gpu_series_1h_10s": {"lo": t0 + timedelta(hours=1), "hi": t0 + timedelta(hours=2)},
              "gpu_raw_15min": {"lo": t0 + timedelta(minutes=150), "hi": t0 + timedelta(minutes=165)},
              "day_job_avg_sm": {"lo": day, "hi": day + timedelta(days=1)},
              "rank_panel_15min_10s": {"lo": t0 + timedelta(minutes=200), "hi": t0 + timedelta(minutes=215)}}
    assert all(r["hi"] <= t0 + timedelta(seconds=seconds) for q, r in ranges.items() if q != "day_job_avg_sm")
    result: dict[str, Any] = {"variants": {}}
    with database("engines") as pg, psycopg.connect(pg.dsn, autocommit=True) as conn:
        result["server"] = {"port": pg.port, "datadir": str(pg.datadir)}
        partitions.ensure(conn, [t0.date() + timedelta(days=d) for d in range(-1, 3)])
        backend = conn.info.backend_pid
        print(f"generating {gpus} GPUs x {hours:g} h ...", flush=True)
        minutes = generate(conn, gpus, seconds, t0, gpm=True)
        c = cpu_of(backend)
        ingest(conn, minutes)
        ingest_cpu = cpu_of(backend) - c
        del minutes
        conn.execute("VACUUM ANALYZE")
        raw_bytes = sum(relation_bytes(conn, f"jobpulse.{t}") for t in RAW)
        process_samples = conn.execute("SELECT count(*) FROM jobpulse.process_samples").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM jobpulse.gpu_samples").fetchone()[0] == gpu_samples
        result["ingest"] = {"cpu_s": round(ingest_cpu, 2), "cpu_s_per_gpu_day": round(ingest_cpu / gpu_days, 2),
                            "raw_tier_bytes_per_gpu_sample_as_ingested": round(raw_bytes / gpu_samples, 2)}
        conn.execute("CREATE SCHEMA engines")
        lz4 = compact.lz4_supported(conn)
        cpu: dict[str, float] = {}
        notes: dict[str, str] = {}
        print("a: heap copy ...", flush=True)
        cpu["a_heap"] = heap_copy(conn, "a_heap", lz4=False)
        if lz4:
            print("d: heap copy, lz4 TOAST ...", flush=True)
            cpu["d_heap_lz4_toast"] = heap_copy(conn, "d_heap_lz4_toast", lz4=True)
        else:
            notes["d_heap_lz4_toast"] = "not run: this PostgreSQL has no lz4"
        columnar = citus_installed()
        if columnar:
            conn.execute("CREATE EXTENSION citus_columnar")
            for name, (options, indexed) in COLUMNAR.items():
                print(f"c: {name} ...", flush=True)
                try:
                    cpu[name] = columnar_copy(conn, name, day, options, indexed)
                except psycopg.Error as e:
                    notes[name] = f"not run: {e.diag.message_primary}"
                    conn.execute(f"DROP TABLE IF EXISTS engines.{name}_gpu, engines.{name}_process CASCADE")
        else:
            notes["c_columnar"] = f"not run: {citus_library()} is missing"
        print("b: compaction ...", flush=True)
        conn.execute("CHECKPOINT")
        c = cpu_of(backend)
        done = compact.compact(conn, duty=1.0)
        cpu["b_compact"] = cpu_of(backend) - c
        # how much of that was the coarse buckets and pyramid hours: the same rebuild again (idempotent)
        c = cpu_of(backend)
        hour = t0
        while hour < t0 + timedelta(seconds=seconds):
            coarse.build(conn, hour)
            with conn.transaction():
                pyramid.rebuild(conn, hour, hour + coarse.HOUR)
            hour += coarse.HOUR
        rebuild_cpu = cpu_of(backend) - c
        result["compaction"] = {"chunks": done.chunks, "hours": done.hours, "samples": done.samples,
                                "wall_s": round(done.seconds, 1),
                                "coarse_and_pyramid_rebuild_cpu_s_measured_again": round(rebuild_cpu, 2)}
        conn.execute("VACUUM ANALYZE")
        variants = [v for v in ("a_heap", "b_compact", *COLUMNAR, "d_heap_lz4_toast") if v in cpu]
        for v in variants:
            if v == "b_compact":
                tables = {"gpu": ["jobpulse.gpu_samples_compact"],
                          "process": ["jobpulse.process_samples_compact", "jobpulse.rank_bins_compact"]}
            else:
                tables = {k: [t] for k, t in sources(v, "", "").items()}
            gpu_b = sum(relation_bytes(conn, t) for t in tables["gpu"])
            proc_b = sum(relation_bytes(conn, t) for t in tables["process"])
            result["variants"][v] = {
                "bytes": gpu_b + proc_b, "bytes_per_gpu_sample": round((gpu_b + proc_b) / gpu_samples, 2),
                "gpu_table_bytes_per_gpu_sample": round(gpu_b / gpu_samples, 2),
                "process_tables_bytes_per_process_sample": round(proc_b / process_samples, 2),
                "cpu_s": round(cpu[v], 2), "cpu_s_per_gpu_day": round(cpu[v] / gpu_days, 2),
                "cpu_share_of_ingest": round(cpu[v] / ingest_cpu, 3), "tables": tables,
                **({"layout": {k: columnar_layout(conn, t[0]) for k, t in tables.items()}} if v.startswith("c_") else {}),
                **({"toast": {k: toast_use(conn, t[0]) for k, t in tables.items()}} if v[0] in "ad" else {}),
            }
        rollups = {t: relation_bytes(conn, f"jobpulse.{t}") for t in
                   ("gpu_rollup", "process_rollup", "step_rollup", "node_job_rollup", "job_bucket_rollup", "node_rollup")}
        result["rollups_every_variant"] = {
            "bytes_per_gpu_sample": {t: round(b / gpu_samples, 2) for t, b in rollups.items()},
            "rows_by_width": {t: dict(conn.execute(f"SELECT width_s::text, count(*) FROM jobpulse.{t} GROUP BY 1"
                                                   " ORDER BY 1::int").fetchall())
                              for t in ("gpu_rollup", "process_rollup", "node_job_rollup")}}
        print(f"queries: {len(QUERIES)} x {len(variants)} variants x {runs} rounds ...", flush=True)
        conns = {"": conn}
        if columnar:
            conn.execute(PUSH_ALL)
            if "c_columnar_zstd" in variants:
                conns[DEFAULT_PUSHDOWN] = psycopg.connect(pg.dsn, autocommit=True)
                variants.append(DEFAULT_PUSHDOWN)
        try:
            result["queries"] = time_queries(conns, variants, ranges, runs)
            if columnar:
                result["columnar_plans"] = columnar_plans(conns, variants, ranges)
                result["server"]["qual_pushdown_correlation_threshold"] = {
                    v or "the others": c.execute("SHOW columnar.qual_pushdown_correlation_threshold").fetchone()[0]
                    for v, c in conns.items()}
        finally:
            if DEFAULT_PUSHDOWN in conns:
                conns[DEFAULT_PUSHDOWN].close()
        if "c_columnar_zstd_indexed" in variants:
            result["columnar_behaviour"] = columnar_behaviour(conn, "engines.c_columnar_zstd_indexed_gpu", t0)
        result["server"]["lz4"] = lz4
        result["server"]["settings"] = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', 'work_mem', 'jit',"
            " 'max_parallel_workers_per_gather', 'default_toast_compression', 'columnar.compression')").fetchall())
    result["not_run"] = notes
    result["conditions"] = {"nodes": nodes, "gpus": gpus, "hours": hours, "start": t0.isoformat(),
                            "gpu_samples": gpu_samples, "process_samples": process_samples, "gpm": True,
                            "runs": runs, "chunk_s": chunk_s}
    return result


def table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table (what docs/storage-decision.md quotes)."""
    qs = list(QUERIES)
    head = ["variant", "B / GPU sample", "GPU table B / GPU sample", "process B / process sample", "CPU s",
            "CPU s / GPU-day", *(f"{q} ms min / median" for q in qs)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in (v for v in result["queries"][qs[0]]["variants"] if v != "jobpulse_reads"):
        r = result["variants"].get(v)
        cells = [v, *((f"{r['bytes_per_gpu_sample']}", f"{r['gpu_table_bytes_per_gpu_sample']}",
                       f"{r['process_tables_bytes_per_process_sample']}", f"{r['cpu_s']}", f"{r['cpu_s_per_gpu_day']}")
                      if r else ("(c_columnar_zstd)",) * 5)]
        for q in qs:
            t = result["queries"][q]["variants"][v]
            cells.append(f"{t['ms_min']} / {t['ms_median']}")
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["jobpulse_reads (roll-ups, pyramid, bins)", "", "", "", "", ""]
    for q in qs:
        t = result["queries"][q]["variants"].get("jobpulse_reads")
        cells.append(f"{t['ms_min']} / {t['ms_median']}" if t else "(b)")
    lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=int, default=4, help="nodes of 8 GPUs, one job over all of them")
    ap.add_argument("--hours", type=float, default=6, help="of 1 Hz samples (6: one whole compact chunk)")
    ap.add_argument("--runs", type=int, default=7, help="timed rounds of every query (at least 5 to quote)")
    args = ap.parse_args(argv)
    if args.hours < 4 or args.hours > 6:
        ap.error("--hours must be 4 to 6: the queries' ranges lie in the first 3 h 35 min, and one day holds the data")
    before = load()
    began = time.monotonic()
    result: dict[str, Any] = {"machine": machine(), "code": code_state(), "load_before": before}
    result.update(run(args.nodes, args.hours, args.runs))
    result["load_after"] = load()
    result["wall_s"] = round(time.monotonic() - began)
    result["lines_of_code"] = lines_of_code()
    result["table_markdown"] = table(result)
    out = save("storage_engines.json", result)
    m = result["machine"]
    print(f"\n{m['cpu']}, nproc {m['nproc']}, {m['postgresql']}; load average {before['loadavg_1_5_15']} before, "
          f"{result['load_after']['loadavg_1_5_15']} after")
    c = result["conditions"]
    print(f"{c['nodes']} nodes x 8 GPUs x {c['hours']:g} h: {c['gpu_samples']:,} GPU samples, "
          f"{c['process_samples']:,} process samples; ingest CPU {result['ingest']['cpu_s']} s\n")
    print(result["table_markdown"])
    for q, r in result["queries"].items():
        differ = [v for v, same in r["same_rows_as_a"].items() if not same]
        print(f"{q}: {'every variant returned the rows of a' if not differ else 'rows differ from a: ' + ', '.join(differ)}")
    for what, answer in result.get("columnar_behaviour", {}).items():
        print(f"columnar partition, {what}: {answer}")
    loc = result["lines_of_code"]
    print("\nlines of code (non-blank, non-comment, no docstrings): " + ", ".join(
        f"{k} {v['total'] if isinstance(v, dict) else v}" for k, v in loc.items()))
    for v, why in result["not_run"].items():
        print(f"{v}: {why}")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
