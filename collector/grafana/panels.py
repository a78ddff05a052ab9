"""Panels for Grafana 11 as code: the PostgreSQL datasource reference, a SQL query target (the SDK
has none), and the time-series, table, variable and annotation builders every dashboard uses."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.models import dashboard as dm

DATASOURCE_UID = "jobpulse-pg"
DATASOURCE_TYPE = "grafana-postgresql-datasource"
DS = dm.DataSourceRef(type_val=DATASOURCE_TYPE, uid=DATASOURCE_UID)
FOLDER = "jobpulse"
REFRESH = "5s"


class SqlQuery(variants.Dataquery):
    """A PostgreSQL datasource query (the SDK has no SQL query type)."""

    def __init__(self, sql: str, fmt: str = "time_series", ref: str = "A") -> None:
        self.sql, self.fmt, self.ref = " ".join(sql.split()), fmt, ref

    def to_json(self) -> dict[str, object]:
        return {"refId": self.ref, "datasource": DS.to_json(), "editorMode": "code", "format": self.fmt,
                "rawQuery": True, "rawSql": self.sql}


class Sql(cogbuilder.Builder[SqlQuery]):
    """Builder wrapper so panels take a SqlQuery like any SDK target."""

    def __init__(self, sql: str, fmt: str = "time_series", ref: str = "A") -> None:
        self.query = SqlQuery(sql, fmt, ref)

    def build(self) -> SqlQuery:
        return self.query


def gpu_name(index: str = "gpu_index") -> str:
    """SQL naming a GPU as people read it (node/GPU index; a MIG slice with its profile and GPU
    instance, or two slices of one GPU would draw as one series)."""
    return f"jobpulse.gpu_name('$cluster', node, gpu_uuid, {index})"


CELLS = 20_000
"""Points a per-node panel over a whole cluster asks for at most (series x time groups): hashing,
sorting and sending the cells is most of such a query's time (1,250 nodes in 72 groups of 300 s
over 6 h would be 90,000), and a panel a few hundred pixels high shows no more than this anyway."""


PYRAMID_WIDTH = "jobpulse.pyramid_width($__timeFrom()::timestamptz, $__timeTo()::timestamptz)"
"""SQL: the level of the per-node and per-job sums a panel over the whole range reads (300 s rows up
to 6 hours, hour rows beyond; a constant the planner folds)."""


def capped_time(column: str, series: str, width_s: int | str = 300) -> str:
    """SQL for the time group of ``column`` (Grafana's epoch-seconds "time"), no finer than
    $__interval and coarse enough that ``series`` (SQL: how many series the panel draws) times the
    groups in the range stay within `CELLS`; a whole number of the ``width_s`` buckets read (a number,
    or SQL such as `PYRAMID_WIDTH`)."""
    step = (f"ceil(greatest($__interval_ms / 1000.0, extract(epoch FROM $__timeTo()::timestamptz"
            f" - $__timeFrom()::timestamptz) * ({series}) / {CELLS}) / {width_s}) * {width_s}")
    # The step as a subquery: worked out once, not for every row read (as an expression over another
    # subquery's result it would be, in numeric arithmetic).
    return f"date_bin((SELECT make_interval(secs => ({step})::float8)), {column}, timestamptz 'epoch')"


def ts(title: str, sql: str, unit: str, *, w: int = 12, h: int = 8, lo: float | None = None,
        hi: float | None = None, desc: str = "", stack: bool = False) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).datasource(DS).with_target(Sql(sql)).unit(unit).span(w).height(h)
         .line_width(1).fill_opacity(10 if not stack else 60).description(desc))
    if lo is not None:
        p = p.min(lo)
    if hi is not None:
        p = p.max(hi)
    return p


def table_panel(title: str, sql: str, *, w: int = 24, h: int = 8, desc: str = "") -> table.Panel:
    """A table panel (format table: free-form columns)."""
    return table.Panel().title(title).datasource(DS).with_target(Sql(sql, "table")).span(w).height(h).description(desc)


def variable(name: str, label: str, sql: str, *, multi: bool = False) -> db.QueryVariable:
    v = (db.QueryVariable(name).label(label).datasource(DS).query(" ".join(sql.split()))
         .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.DISABLED))
    return v.multi(True).include_all(True) if multi else v


def annotation(name: str, color: str, sql: str) -> dm.AnnotationQuery:
    a = db.AnnotationQuery().name(name).datasource(DS).enable(True).icon_color(color).build()
    a.target = SqlQuery(sql, "table", "Anno")  # type: ignore[assignment]  # SQL annotations take a query target
    return a
