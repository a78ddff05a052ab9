"""Store: the compact tier — samples older than the hot window packed into one row per (GPU, job,
chunk) and per (job, PID, chunk), a chunk being six hours (``CHUNK``), read back by every reader as
if they were still raw rows.

How a field is packed (all of it generated from the field table, so a new field needs nothing here):
each sample becomes an integer code (integers as they are, booleans 0/1, timestamps in microseconds
since the chunk's start, reals as whole multiples of the resolution the field table declares — power
in mW, GPM metrics in hundredths of a percent — when every value of the chunk is one, else their
IEEE bits, text as an index into the chunk's dictionary). Within a chunk
the codes are stored as an offset from a base and, for time and counters where it narrows them,
from a line ``base + step * i`` (samples every second, an energy counter), split into byte planes:
a 2-D ``"char"`` array (plane x sample) with only as many planes as the chunk's range needs, and a
mask of the NULLs when a column has some. A highest plane of at most 4 bits (2) goes to its own
array with 2 (4) samples per byte (``_top_bytes``): lz4 cannot shrink bytes of few-bit noise. A constant field costs no plane at all, a noisy
percentage one byte per sample; the high, slowly changing planes of counters are runs that
PostgreSQL's lz4 TOAST compression removes. A reader takes each array of a compact row out of
TOAST once (`_detoasted`) and reads a sample by subscript (`_code_at`).

Reads: ``jobpulse.gpu_samples_between(from, to)`` and ``process_samples_between`` return raw rows
and unpacked compact rows of [from, to] (chunks are pruned by their start), with the raw tables'
row types; the views ``gpu_samples_all`` and ``process_samples_all`` cover all time. `gpu_series`,
`rank_series` and `jobpulse report` read through them.

Compaction (`compact`, `jobpulse db compact`, or the rules leader): one (node, chunk) per
transaction, serialized per chunk by an advisory lock: the chunk's raw rows and any compact rows
it already has (late data) are read through the reader above, packed, inserted, and deleted from
where they were, all in one statement — a crash (kill -9) before COMMIT leaves the chunk as it was.
The process tier's statement also rewrites the chunk's ten-second sums per rank (`_RANK_BINS`),
what `rank_series` reads at 5-20 s steps instead of unpacking every sample.
Between chunks it sleeps so that it works at most ``duty`` of the time. Then it makes the coarse
(1,800 s) roll-up buckets of every hour it compacted (coarse.py), for ranges of days, and
rebuilds those hours of the cluster dashboards' pyramid (pyramid.py), late data included.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec
import psycopg
from psycopg import sql

from jobpulse.collector.store.migrate import objects
from jobpulse.collector.store.tiers import coarse, fold, partitions, pyramid
from jobpulse.schema import fields, wire

# Six hours per compact row (a quarter of a day, so a chunk never crosses a daily partition): each
# packed column is one TOAST value, whose last ~2 kB slice leaves its page partly empty; hour-long
# values left 10 % of the TOAST pages empty (5.5 bytes per Hopper GPU sample); with six-hour ones
# all pages beyond the values cost 1.8 bytes (bench/storage.py).
CHUNK = timedelta(hours=6)
HOT_HOURS = partitions.Tiers.raw_hours
_LOCK_CLASS = 0x636F6D70  # "comp": advisory locks of (table, node, chunk)
_SCALED_MAX = 2_000_000_000  # reals stored as multiples of their resolution: codes within the 4 planes of their bits
# the widest code of each column type in bytes (reals: their 32 IEEE bits; text: a dictionary index)
_PLANES = {"smallint": 2, "integer": 4, "bigint": 8, "real": 4, "boolean": 1, "text": 4, "timestamptz": 8}
_HEAD_TYPES = {"ts": "timestamptz", "gpu_uuid": "text", "gpu_index": "smallint", "job_id": "text", "pid": "integer"}


@dataclass(frozen=True)
class Column:
    name: str
    sql: str
    scale: int = 0  # reals: values are whole multiples of 1/scale (the field's declared resolution)

    @property
    def planes(self) -> int:
        return _PLANES[self.sql]


@dataclass(frozen=True)
class Tier:
    """A raw sample table and its compact table: the key of a compact row, the packed columns."""

    raw: str
    keys: tuple[str, ...]  # with cluster, node and chunk_start: one compact row
    columns: tuple[Column, ...]  # every raw column after cluster and node, in table order
    also: tuple[str, ...] = ()  # other compact-tier tables its packing statement writes (`_RANK_BINS`)
    packed: tuple[Column, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "packed", tuple(c for c in self.columns if c.name not in self.keys))

    @property
    def compact(self) -> str:
        return f"{self.raw}_compact"


def _tier(raw: str, struct: type[msgspec.Struct], table: tuple[fields.Field, ...], keys: tuple[str, ...],
          also: tuple[str, ...] = ()) -> Tier:
    types = {**_HEAD_TYPES, **{f.name: f.sql for f in table}}
    scales = {f.name: f.scale for f in table}
    return Tier(raw, keys, tuple(Column(name, types[name], scales.get(name, 0)) for name in struct.__struct_fields__),
                also)


TIERS = (_tier("gpu_samples", wire.GpuSample, fields.GPU_FIELDS, ("gpu_uuid", "job_id")),
         _tier("process_samples", wire.ProcessSample, fields.PROCESS_FIELDS, ("job_id", "pid"), ("rank_bins_compact",)))
LEDGER_NAME = "compact_tier"  # the codecs, the `*_between` readers and the `*_all` views, as one ledger row


# -- packing ------------------------------------------------------------------------------------

def _code(c: Column) -> str:
    """The integer code of one raw value (``s.`` the raw row, ``d.`` its chunk's choices)."""
    v = f"s.{c.name}"
    return {
        "timestamptz": f"(extract(epoch FROM {v} - %(lo)s) * 1000000)::bigint",  # since the chunk's start
        "boolean": f"{v}::int::bigint",
        "real": f"CASE WHEN d.{c.name}_dec THEN round({v}::float8 * {c.scale})::bigint"
                f" ELSE jobpulse.float4_bits({v}) END" if c.scale else f"jobpulse.float4_bits({v})",
        "text": f"array_position(d.{c.name}_dict, {v}) - 1",
    }.get(c.sql, f"{v}::bigint")


def _trending(tier: Tier) -> list[Column]:
    """Columns that grow along the chunk (time, counters): a line through them narrows their range."""
    counters = {f.name for f in (*fields.GPU_FIELDS, *fields.PROCESS_FIELDS)
                if f.unit == "count" or (f.dcgm is not None and f.dcgm.type == "counter")}
    return [c for c in tier.packed if c.sql == "timestamptz" or c.name in counters]


def _top_bits(c: Column, offset: str) -> str:
    """A sample's bits of the highest plane where that plane needs at most 4 bits (``h.{c}_m`` > 1);
    `_top_bytes` packs them."""
    return f"CASE WHEN h.{c.name}_m > 1 THEN {offset} >> (8 * (h.{c.name}_k - 1)) END"


def _top_bytes(c: Column) -> str:
    """The highest plane packed ``m`` (2 or 4) samples a byte, from the chunk's `_top_bits` in sample
    order (``a.{c}_top``): byte q holds the bits of samples q, q + p, ... (``p`` = ceil(n / m)) side
    by side, so a plane of 2-bit noise costs a quarter byte, not a whole one; NULL where not packed.
    Subscripts into the aggregated array, not a ``lead`` window: a window function is evaluated for
    every sample and column whether the plane is packed or not (a quarter of the compaction CPU)."""
    m, bits, p = f"h.{c.name}_m", f"a.{c.name}_top", f"((a.n + h.{c.name}_m - 1) / h.{c.name}_m)"
    shares = " + ".join(f"(coalesce({bits}[q + {j} * {p}], 0) << {j} * 8 / {m})" for j in (1, 2, 3))
    return (f"CASE WHEN {m} > 1 THEN ARRAY(SELECT ({bits}[q] + {shares} - 128)::int::\"char\""
            f" FROM generate_series(1, {p}) q) END")


def _pack_sql(tier: Tier) -> str:
    """INSERT the compact rows of one (cluster, node, chunk) from its samples in both tiers, and
    delete those samples where they were; returns (samples read, samples packed, raw rows deleted,
    compact rows deleted). Each pass over the chunk is an aggregate per compact row (``grp``)."""
    key = ", ".join(("cluster", "node", *tier.keys))
    # A chunk is one (cluster, node): its rows are told apart by the tier's keys alone, integers
    # first (a PID settles most comparisons of the sort; equal leading text keys cost every one).
    order = ", ".join(sorted(tier.keys, key=lambda k: _HEAD_TYPES[k] == "text"))
    packed, trending = tier.packed, _trending(tier)
    # per compact row: which reals are whole multiples of their resolution, the dictionary of each text column
    choices = ", ".join(
        [f"bool_and({c.name} IS NULL OR abs({c.name}) <= {_SCALED_MAX // c.scale} AND (round({c.name}::float8"
         f" * {c.scale}) / {c.scale})::real = {c.name}) AS {c.name}_dec" for c in packed if c.sql == "real" and c.scale]
        + [f"array_agg(DISTINCT {c.name}) FILTER (WHERE {c.name} IS NOT NULL) AS {c.name}_dict"
           for c in packed if c.sql == "text"]) or "true AS nothing"
    codes = ", ".join(f"{_code(c)} AS {c.name}" for c in packed)
    ranges = ", ".join(f"min({c.name}) AS {c.name}_lo, max({c.name}) AS {c.name}_hi, count({c.name}) AS {c.name}_nn"
                       for c in packed)
    slopes = "".join(f", CASE WHEN max(abs({c.name})) < 2 ^ 50 THEN coalesce(round(regr_slope({c.name}, i)), 0)"
                     f" ELSE 0 END::bigint AS {c.name}_s" for c in trending)
    lined = "".join(f", min(c.{c.name} - t.{c.name}_s * c.i) AS {c.name}_lo1,"
                    f" max(c.{c.name} - t.{c.name}_s * c.i) AS {c.name}_hi1" for c in trending)
    chosen = []
    for c in packed:
        base, step, width = f"t.{c.name}_lo", "0::bigint", f"t.{c.name}_hi - t.{c.name}_lo"
        if c in trending:
            line = f"l.{c.name}_hi1 - l.{c.name}_lo1 < {width}"
            base = f"CASE WHEN {line} THEN l.{c.name}_lo1 ELSE {base} END"
            step = f"CASE WHEN {line} THEN t.{c.name}_s ELSE 0 END"
            width = f"least(l.{c.name}_hi1 - l.{c.name}_lo1, {width})"
        more = "".join(f" + ({width} >= {1 << (8 * b)})::int" for b in range(1, c.planes))
        k = f"CASE WHEN t.{c.name}_nn = 0 OR {width} = 0 THEN 0 ELSE 1{more} END"
        top = f"({width}) >> (8 * greatest({k} - 1, 0))"  # the highest plane's largest value
        chosen.append(f"{base} AS {c.name}_base, {step} AS {c.name}_step, {k} AS {c.name}_k,"
                      f" CASE WHEN {k} = 0 THEN 1 WHEN {top} < 4 THEN 4 WHEN {top} < 16 THEN 2 ELSE 1 END"
                      f" AS {c.name}_m, t.{c.name}_nn BETWEEN 1 AND t.n - 1 AS {c.name}_holes")
    out_cols, out_vals = ["n"], ["a.n"]
    offsets, planes = [], []
    for c in packed:
        offset = f"coalesce(c.{c.name} - h.{c.name}_step * c.i - h.{c.name}_base, 0)"
        offsets.append(f"{offset} AS {c.name}, h.{c.name}_k - (h.{c.name}_m > 1)::int AS {c.name}_k,"
                       f" CASE WHEN h.{c.name}_holes THEN (c.{c.name} IS NULL)::int END AS {c.name}_null,"
                       f" {_top_bits(c, offset)} AS {c.name}_top")
        agg = [f"array_agg(((({c.name} >> {8 * b}) & 255) - 128)::int::\"char\") FILTER (WHERE {c.name}_k > {b})"
               for b in range(c.planes)]
        planes.append(f"CASE min({c.name}_k) " + " ".join(f"WHEN {k} THEN ARRAY[{', '.join(agg[:k])}]"
                                                        for k in range(1, c.planes + 1)) + f" END AS {c.name},"
                      f" array_agg({c.name}_null::\"char\") FILTER (WHERE {c.name}_null IS NOT NULL) AS {c.name}_null,"
                      f" array_agg({c.name}_top) FILTER (WHERE {c.name}_top IS NOT NULL)"
                      f" AS {c.name}_top")
        out_cols += [c.name, f"{c.name}_null", f"{c.name}_top", f"{c.name}_m", f"{c.name}_base", f"{c.name}_step"]
        out_vals += [f"a.{c.name}", f"a.{c.name}_null", _top_bytes(c), f"h.{c.name}_m", f"h.{c.name}_base",
                     f"h.{c.name}_step"]
        if c.sql == "real":
            out_cols.append(f"{c.name}_scale")
            out_vals.append(f"CASE WHEN d.{c.name}_dec THEN {c.scale} ELSE 0 END" if c.scale else "0")
        elif c.sql == "text":
            out_cols.append(f"{c.name}_dict")
            out_vals.append(f"d.{c.name}_dict")
    where = "cluster = %(cluster)s AND node = %(node)s"
    return f"""
WITH src AS MATERIALIZED (
    SELECT * FROM jobpulse.{tier.raw}_between(%(lo)s, %(hi)s) WHERE {where} AND ts >= %(lo)s AND ts < %(hi)s
), raw_gone AS (
    DELETE FROM jobpulse.{tier.raw} WHERE {where} AND ts >= %(lo)s AND ts < %(hi)s RETURNING 1
), compact_gone AS (  -- rows of shorter chunks inside this one too (hour-long chunks before 2026-11-23)
    DELETE FROM jobpulse.{tier.compact} WHERE {where} AND chunk_start >= %(lo)s AND chunk_start < %(hi)s RETURNING 1
), r AS MATERIALIZED (  -- grp: the compact row; i: the position in it (the old compact rows go first)
    SELECT *, dense_rank() OVER (ORDER BY {order}) AS grp, row_number() OVER (PARTITION BY {order} ORDER BY ts) - 1 AS i
      FROM src WHERE (SELECT count(*) FROM compact_gone) >= 0
), d AS (
    SELECT grp, {choices} FROM r GROUP BY grp
), c AS MATERIALIZED (
    SELECT s.grp, s.i, {codes} FROM r s JOIN d USING (grp)
), t AS (
    SELECT grp, count(*) AS n, {ranges}{slopes} FROM c GROUP BY grp
), l AS (
    SELECT c.grp{lined} FROM c JOIN t USING (grp) GROUP BY c.grp
), choice AS (
    SELECT t.grp, t.n, {", ".join(chosen)} FROM t JOIN l USING (grp)
), packed AS (  -- the byte planes, in sample order, then the bases, steps and dictionaries
    INSERT INTO jobpulse.{tier.compact} (cluster, node, {", ".join(tier.keys)}, chunk_start, {", ".join(out_cols)})
    SELECT k.cluster, k.node, {", ".join(f"k.{key}" for key in tier.keys)}, %(lo)s, {", ".join(out_vals)}
      FROM (SELECT grp, count(*)::int AS n, {", ".join(planes)}
              FROM (SELECT c.grp, c.i, {", ".join(offsets)} FROM c JOIN choice h USING (grp)
                     ORDER BY c.grp, c.i) o
             GROUP BY grp) a
      JOIN choice h USING (grp) JOIN d USING (grp)
      JOIN (SELECT DISTINCT ON (grp) grp, {key} FROM r) k USING (grp)
    RETURNING n
){_RANK_BINS if "rank_bins_compact" in tier.also else ""}
SELECT (SELECT count(*) FROM src), (SELECT coalesce(sum(n), 0) FROM packed),
       (SELECT count(*) FROM raw_gone), (SELECT count(*) FROM compact_gone)
"""


# The process tier's statement also (re)writes the chunk's ten-second sums per rank
# (rank_bins_compact, migration 0031), from the same samples: what rank_series reads at steps of
# 5-20 s instead of unpacking every sample. Dense arrays from a rank's first bin to its last.
_RANK_BINS = """, bins_gone AS (
    DELETE FROM jobpulse.rank_bins_compact
     WHERE cluster = %(cluster)s AND node = %(node)s AND chunk_start >= %(lo)s AND chunk_start < %(hi)s RETURNING 1
), per_bin AS MATERIALIZED (
    SELECT job_id, rank, extract(epoch FROM bin - %(lo)s)::int / 10 AS b, n, n_cpu, sum_cpu, n_sm, sum_sm
      FROM (SELECT job_id, rank, date_bin(interval '10 seconds', ts, %(lo)s) AS bin, sum(w) AS n,
                   coalesce(sum(w) FILTER (WHERE cpu_percent IS NOT NULL), 0)::int AS n_cpu,
                   sum(cpu_percent::float8 * w) AS sum_cpu,
                   coalesce(sum(w) FILTER (WHERE sm_util IS NOT NULL), 0)::int AS n_sm, sum(sm_util * w)::bigint AS sum_sm
              FROM (SELECT *, 1 + coalesce(held, 0) AS w FROM src) s  -- a row stands for 1 + held ticks
             WHERE job_id IS NOT NULL AND rank IS NOT NULL AND (SELECT count(*) FROM bins_gone) >= 0
             GROUP BY 1, 2, 3) g
), filled AS (  -- and 0 / NULL for each bin without samples between two with some: positions follow bins
    SELECT job_id, rank, b, n, n_cpu, sum_cpu, n_sm, sum_sm FROM per_bin
    UNION ALL
    SELECT job_id, rank, b - g, 0, 0, NULL, 0, NULL
      FROM (SELECT job_id, rank, b, b - lag(b) OVER (PARTITION BY job_id, rank ORDER BY b) - 1 AS gap FROM per_bin) w
     CROSS JOIN LATERAL generate_series(1, w.gap) g
     WHERE w.gap > 0
), bins AS (
    INSERT INTO jobpulse.rank_bins_compact (cluster, node, job_id, rank, chunk_start, n, first_bin, n_cpu, sum_cpu,
                                            n_sm, sum_sm)
    SELECT %(cluster)s, %(node)s, job_id, rank, %(lo)s, sum(n), min(b), array_agg(n_cpu ORDER BY b),
           array_agg(sum_cpu ORDER BY b), array_agg(n_sm ORDER BY b), array_agg(sum_sm ORDER BY b)
      FROM filled GROUP BY job_id, rank
    RETURNING 1
)"""


# -- reading ------------------------------------------------------------------------------------

# byte planes below this one are added as signed "char" values, their +128 each folded into the
# row's constant (`_row_constants`); higher ones (64-bit codes) as bytes, so the constant stays small
_SIGNED_PLANES = 3


def _code_at(c: Column) -> str:
    """The integer code at position ``o`` of a compact row whose arrays and per-row constants ``x``
    holds (`_row_constants`): the row's constant plus the step times the position, its byte planes
    (a CASE on how many the row has, so that no absent plane is read) plus, where the highest plane
    is packed (`_top_bytes`), its bits from there."""
    def plane(b: int) -> str:
        if b >= _SIGNED_PLANES:
            return f"((x.{c.name}[{b + 1}][o]::int + 128)::bigint << {8 * b})"
        return f"(x.{c.name}[{b + 1}][o]::int << {8 * b})" if b else f"x.{c.name}[1][o]::int"
    planes = " ".join(f"WHEN {k} THEN {' + '.join(plane(b) for b in range(k))}" for k in range(1, c.planes + 1))
    top = (f"CASE WHEN x.{c.name}_p > 0 THEN ((((x.{c.name}_top[(o - 1) % x.{c.name}_p + 1]::int + 128)"
           f" >> (x.{c.name}_bits * ((o - 1) / x.{c.name}_p))) & x.{c.name}_mask)::bigint << x.{c.name}_shift)"
           " ELSE 0 END")
    return f"(x.{c.name}_lo + x.{c.name}_step * o + CASE x.{c.name}_k WHEN 0 THEN 0 {planes} END + {top})"


def _row_constants(c: Column) -> list[str]:
    """What `_code_at` and `_value` need of a compact row besides its arrays, computed once per row:
    the number of byte planes; the code's constant part (the base, less one step as positions count
    from 1, plus 128 for each signed plane); for a packed top plane (none: ``_p`` 0) its samples per
    byte's stride, bits per sample, their mask and the shift above the byte planes; whether the
    column has NULLs; whether its value is the same in every sample (no plane, no top plane, no
    step: a rank, a command, a limit), and that value, which `_value` then reads in place of its
    code."""
    k = f"coalesce(array_length(y.{c.name}, 1), 0)"
    signed = " ".join(f"WHEN {n} THEN {sum(128 << (8 * b) for b in range(n))}" for n in range(1, _SIGNED_PLANES + 1))
    return [f"{k} AS {c.name}_k",
            f"y.{c.name}_base - y.{c.name}_step + CASE least({k}, {_SIGNED_PLANES}) {signed} ELSE 0 END AS {c.name}_lo",
            f"CASE WHEN y.{c.name}_top IS NULL THEN 0 ELSE (y.n + y.{c.name}_m - 1) / y.{c.name}_m END AS {c.name}_p",
            f"8 / y.{c.name}_m AS {c.name}_bits", f"(1 << (8 / y.{c.name}_m)) - 1 AS {c.name}_mask",
            f"8 * {k} AS {c.name}_shift", f"y.{c.name}_null IS NOT NULL AS {c.name}_holes",
            f"{k} = 0 AND y.{c.name}_top IS NULL AND coalesce(y.{c.name}_step, 0) = 0 AS {c.name}_flat",
            f"{_converted(c, f'y.{c.name}_base', 'y')} AS {c.name}_flat_value"]


def _once(c: Column) -> bool:
    """Columns whose code is computed once per sample in a lateral subquery because their value
    reads it several times (a timestamp is also filtered on, a real's bits are taken apart)."""
    return c.sql in ("timestamptz", "real")


def _converted(c: Column, code: str, row: str) -> str:
    """The value of an integer code of column ``c`` in the compact row ``row`` (its chunk's start,
    the column's scale and dictionary)."""
    return {
        "timestamptz": f"{row}.chunk_start + {code} * interval '1 microsecond'",
        "boolean": f"{code}::int::boolean",
        "real": f"CASE WHEN {row}.{c.name}_scale > 0 THEN ({code}::float8 / {row}.{c.name}_scale)::real"
                f" ELSE jobpulse.float4_from_bits({code}) END",
        "text": f"{row}.{c.name}_dict[{code} + 1]",
        "bigint": code,
    }.get(c.sql, f"{code}::{c.sql}")


def _value(c: Column) -> str:
    """One unpacked value of a sample (its code: ``k.`` when computed once, else in place; none where
    the row holds one value)."""
    code = f"k.{c.name}" if _once(c) else _code_at(c)
    return (f"CASE WHEN x.{c.name}_holes AND x.{c.name}_null[o]::int = 1 THEN NULL"
            f" WHEN x.{c.name}_flat THEN x.{c.name}_flat_value ELSE {_converted(c, code, 'x')} END")


# The positions of a compact row whose samples may lie in [p_from, p_to]: a sample's time is
# base + step * (position - 1) plus an offset below 256 ^ planes microseconds, so with samples at a
# regular step only the positions of the range are read (a 15-minute panel reads a quarter hour);
# and the range as time codes of the row, so that a sample is tested on its code, not its timestamp.
_SAMPLES_IN_RANGE = """
    CASE WHEN y.ts_step > 0 AND isfinite(p_from)
         THEN greatest(1, floor((extract(epoch FROM p_from - y.chunk_start) * 1000000 - y.ts_base
                                 - 256 ^ (coalesce(array_length(y.ts, 1), 0) + (y.ts_top IS NOT NULL)::int))
                                / y.ts_step))::int
         ELSE 1 END AS o_first,
    CASE WHEN y.ts_step > 0 AND isfinite(p_to)
         THEN least(y.n, ceil((extract(epoch FROM p_to - y.chunk_start) * 1000000 - y.ts_base) / y.ts_step) + 1)::int
         ELSE y.n END AS o_last,
    CASE WHEN isfinite(p_from) THEN ceil(extract(epoch FROM p_from - y.chunk_start) * 1000000)::bigint
         ELSE -9223372036854775807 END AS ts_from,
    CASE WHEN isfinite(p_to) THEN floor(extract(epoch FROM p_to - y.chunk_start) * 1000000)::bigint
         ELSE 9223372036854775807 END AS ts_to"""


def _detoasted(column: str) -> str:
    """An array column of a compact row out of TOAST, once: concatenating an empty array returns the
    decompressed value itself, where a slice (``[:]``) copies it element by element (0.7 ms for the
    65 kB of a 1 Hz process row's CPU percent, 28 times its decompression); NULL stays NULL."""
    return f"CASE WHEN {column} IS NOT NULL THEN array_cat({column}, '{{}}') END AS {column.split('.')[-1]}"


def _between_sql(tier: Tier, order: list[str]) -> str:
    """Raw rows of [from, to] and the compact rows' samples in it, in the raw table's column order
    ``order`` (a field added by a later migration is the table's last column, wherever the field
    table lists it). The lateral ``y`` takes each array of a compact row out of TOAST once
    (`_detoasted`), so that reading a sample is a subscript, not a decompression; ``x``
    adds what is computed once per row; ``o`` walks the samples, ``k`` holds the codes read more
    than once (the time code is also what the range is tested on: ts is NOT NULL)."""
    arrays, constants = [], []
    for c in tier.packed:
        arrays += [_detoasted(f"c.{c.name}"), _detoasted(f"c.{c.name}_null"), _detoasted(f"c.{c.name}_top"),
                   f"c.{c.name}_m", f"c.{c.name}_base", f"c.{c.name}_step"]
        constants += _row_constants(c)
        if c.sql == "real":
            arrays.append(f"c.{c.name}_scale")
        elif c.sql == "text":
            arrays.append(_detoasted(f"c.{c.name}_dict"))
    by_name = {c.name: c for c in tier.columns}
    values = ", ".join(f"c.{name}" if name in (*tier.keys, "cluster", "node") else f"{_value(by_name[name])} AS {name}"
                       for name in order)
    return f"""
CREATE FUNCTION jobpulse.{tier.raw}_between(p_from timestamptz, p_to timestamptz)
RETURNS SETOF jobpulse.{tier.raw} LANGUAGE sql STABLE AS $$
SELECT * FROM jobpulse.{tier.raw} s WHERE s.ts BETWEEN p_from AND p_to
UNION ALL
SELECT {values}
  FROM jobpulse.{tier.compact} c
 CROSS JOIN LATERAL (
       SELECT y.*, {_SAMPLES_IN_RANGE}, {", ".join(constants)}
         FROM (SELECT c.cluster, c.node, {", ".join(f"c.{k}" for k in tier.keys)}, c.chunk_start, c.n,
                      {", ".join(arrays)} OFFSET 0) y OFFSET 0) x
 CROSS JOIN LATERAL (SELECT o, {", ".join(f"{_code_at(c)} AS {c.name}" for c in tier.packed if _once(c))}
                       FROM generate_series(x.o_first, x.o_last) o OFFSET 0) k
 WHERE c.chunk_start > p_from - interval '{int(CHUNK.total_seconds())} seconds' AND c.chunk_start <= p_to
   AND k.ts BETWEEN x.ts_from AND x.ts_to
$$"""


_CODECS = """
CREATE FUNCTION jobpulse.float4_bits(v real) RETURNS bigint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT (get_byte(float4send(v), 0)::bigint << 24) | (get_byte(float4send(v), 1) << 16)
       | (get_byte(float4send(v), 2) << 8) | get_byte(float4send(v), 3)
$$;
CREATE FUNCTION jobpulse.float4_from_bits(b bigint) RETURNS real LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE WHEN (b >> 23) & 255 = 255 THEN
            CASE WHEN b & 8388607 <> 0 THEN 'NaN'::real WHEN b >> 31 = 1 THEN '-Infinity'::real
                 ELSE 'Infinity'::real END
       WHEN (b >> 23) & 255 = 0 THEN ((1 - 2 * (b >> 31)) * (b & 8388607)::float8 * 2.0::float8 ^ -149)::real
       ELSE ((1 - 2 * (b >> 31)) * ((b & 8388607) | 8388608)::float8 * 2.0::float8 ^ (((b >> 23) & 255) - 150))::real
       END
$$;
"""


def _columns_ddl(conn: psycopg.Connection, tier: Tier) -> list[str]:
    """ALTER TABLE statements adding the packed columns the compact table lacks (lz4 where the
    server has it, else PostgreSQL's default compression)."""
    have = {r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        (f"jobpulse.{tier.compact}",))}
    method = " COMPRESSION lz4" if lz4_supported(conn) else ""
    wanted: list[tuple[str, str]] = []
    for c in tier.packed:
        wanted += [(c.name, f'"char"[]{method}'), (f"{c.name}_null", f'"char"[]{method}'),
                   (f"{c.name}_top", f'"char"[]{method}'), (f"{c.name}_m", "smallint"),
                   (f"{c.name}_base", "bigint"), (f"{c.name}_step", "bigint")]
        if c.sql == "real":
            wanted.append((f"{c.name}_scale", "integer"))
        elif c.sql == "text":
            wanted.append((f"{c.name}_dict", f"text[]{method}"))
    return [f"ALTER TABLE jobpulse.{tier.compact} ADD COLUMN {name} {typ}" for name, typ in wanted if name not in have]


def _table_order(conn: psycopg.Connection, table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
        " ORDER BY attnum", (f"jobpulse.{table}",))]


def lz4_supported(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
                       ).fetchone()
    return bool(row and row[0])


def drop_readers(conn: psycopg.Connection) -> None:
    """Drop the ``*_all`` views, the ``*_between`` readers and the codecs (`ensure` makes them again):
    before the raw tables change, and before Citus distributes them (it refuses a table whose row
    type a function returns and a view reads back)."""
    for tier in TIERS:
        conn.execute(f"DROP VIEW IF EXISTS jobpulse.{tier.raw}_all")
        conn.execute(f"DROP FUNCTION IF EXISTS jobpulse.{tier.raw}_between(timestamptz, timestamptz)")
    conn.execute("DROP FUNCTION IF EXISTS jobpulse.float4_bits(real), jobpulse.float4_from_bits(bigint)")
    objects.forget(conn, LEDGER_NAME)


def definition(conn: psycopg.Connection) -> str:
    """The codecs, the ``*_between`` readers (over the raw tables' columns in their order) and the
    ``*_all`` views, as `ensure` makes them and the ledger of objects records them."""
    return (_CODECS + ";\n".join(_between_sql(t, _table_order(conn, t.raw)) for t in TIERS) + "".join(
        f";\nCREATE VIEW jobpulse.{t.raw}_all AS SELECT * FROM jobpulse.{t.raw}_between('-infinity', 'infinity')"
        for t in TIERS))


def ensure(conn: psycopg.Connection) -> bool:
    """Add the packed columns of fields new to the field table and (re)create the codec functions,
    the ``*_between`` readers and the ``*_all`` views when they changed; True if anything did."""
    statements = [s for tier in TIERS for s in _columns_ddl(conn, tier)]
    body = definition(conn)
    if not statements and objects.current(conn, LEDGER_NAME, body):
        return False
    drop_readers(conn)
    for statement in statements:
        conn.execute(statement.encode())
    conn.execute(body.encode())
    for tier in TIERS:
        conn.execute(f"GRANT EXECUTE ON FUNCTION jobpulse.{tier.raw}_between TO PUBLIC".encode())
    conn.execute("""DO $$ BEGIN
        GRANT SELECT ON jobpulse.gpu_samples_all, jobpulse.process_samples_all TO jobpulse_reader;
    EXCEPTION WHEN undefined_object THEN NULL; END $$""")
    objects.record(conn, LEDGER_NAME, body)
    return True


# -- compaction ---------------------------------------------------------------------------------

@dataclass
class Compacted:
    """What one compaction run did."""

    chunks: int = 0
    hours: int = 0  # hours whose coarse roll-up buckets were (re)made
    samples: dict[str, int] = field(default_factory=dict)
    truncated: list[str] = field(default_factory=list)
    seconds: float = 0.0
    finished: bool = True  # False: stopped at its time limit, the rest waits for the next run


def _pending(conn: psycopg.Connection, tier: Tier, cutoff: datetime) -> list[tuple[str, str, datetime]]:
    """(cluster, node, chunk) of raw rows older than ``cutoff``, oldest first (a scan of the raw
    partitions before the cutoff: those compacted already are empty)."""
    rows = conn.execute(
        sql.SQL("SELECT DISTINCT cluster, node, date_bin({chunk}, ts, timestamptz 'epoch') AS chunk"
                " FROM jobpulse.{raw} WHERE ts < date_bin({chunk}, %s, timestamptz 'epoch') ORDER BY chunk, 1, 2")
        .format(chunk=sql.Literal(CHUNK), raw=sql.Identifier(tier.raw)), (cutoff,)).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def compact_chunk(conn: psycopg.Connection, tier: Tier, cluster: str, node: str, start: datetime) -> int:
    """Move one (node, six-hour) chunk of ``tier`` into the compact tier in one transaction (merging
    what it holds already); returns the samples it holds."""
    partitions.ensure(conn, [start.astimezone(UTC).date()], tables=[tier.compact, *tier.also])
    with conn.transaction():
        # the planes keep the sorted order (no parallel workers); one chunk is sorted in memory; a
        # JIT compilation of this wide statement costs more than running it
        conn.execute("SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL work_mem = '64MB'; SET LOCAL jit = off")
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                     (_LOCK_CLASS, f"{tier.raw}/{cluster}/{node}/{start}"))
        row = conn.execute(_PACK[tier.raw], {"cluster": cluster, "node": node, "lo": start, "hi": start + CHUNK}
                           ).fetchone()
        read, packed, raw_gone, compact_gone = row if row else (0, 0, 0, 0)
        if packed != read:
            raise RuntimeError(f"compaction of {tier.raw} {node} {start} packed {packed} of {read} samples")
    return int(packed)


def compact(conn: psycopg.Connection, *, hot_hours: float = HOT_HOURS, duty: float = 0.5,
            max_seconds: float | None = None, now: datetime | None = None,
            tiers: tuple[Tier, ...] = TIERS) -> Compacted:
    """Compact every chunk older than the hot window, chunk by chunk; the entry point for
    `jobpulse db compact` and the rules leader. Safe to stop at any point (kill -9 included) and to
    run again: the next run goes on where this one stopped and merges late data into its chunks.
    ``duty`` is the share of wall time spent working (it sleeps in between); ``max_seconds`` ends
    the run after the chunk that passes it; ``tiers``: fewer than all (the benchmark's cost per tier).
    ``conn`` must be in autocommit mode."""
    if not 0 < duty <= 1:
        raise ValueError(f"duty must be in (0, 1], got {duty}")
    cutoff = (now or datetime.now(UTC)) - timedelta(hours=hot_hours)
    began = time.monotonic()
    fold.run(conn, timedelta(0), begin=False)  # no sample is packed before it is in its roll-ups
    done = Compacted()
    hours: set[datetime] = set()
    for tier in tiers:
        done.samples[tier.raw] = 0
        for cluster, node, start in _pending(conn, tier, cutoff):
            if max_seconds is not None and time.monotonic() - began > max_seconds:
                done.finished = False
                break
            t = time.monotonic()
            n = compact_chunk(conn, tier, cluster, node, start)
            done.chunks += 1
            done.samples[tier.raw] += n
            hours.update(start + k * coarse.HOUR for k in range(CHUNK // coarse.HOUR))
            time.sleep((time.monotonic() - t) * (1 - duty) / duty)
        done.truncated += partitions.truncate_empty(conn, tier.raw, cutoff)
    for hour in sorted(hours):  # whole hours, every node: their 300 s buckets are complete
        coarse.build(conn, hour)
        with conn.transaction():  # late data merged into the pyramid the dashboards read
            pyramid.rebuild(conn, hour, hour + coarse.HOUR)
        done.hours += 1
    done.seconds = time.monotonic() - began
    return done


_PACK = {tier.raw: _pack_sql(tier) for tier in TIERS}
