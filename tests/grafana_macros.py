"""Expand a Grafana PostgreSQL query the way Grafana does (see docs/grafana.md), so the tests can
run every panel, variable, annotation and alert query against real PostgreSQL.

Order: (1) template variables, (2) plain replacement of $__interval_ms, $__interval,
$__unixEpochFrom(), $__unixEpochTo(), (3) macros `$name(args)` (no `)` inside arguments; an
unknown macro is an error, as in Grafana)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Var:
    values: tuple[str, ...]
    multi: bool = False  # multi-value or include-All: always formatted as a list


_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?::([^}]+))?\}")
_MACRO = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")


def _format(var: Var, fmt: str | None) -> str:
    if fmt in ("raw", "csv"):
        return ",".join(var.values)
    if fmt == "sqlstring" or (fmt is None and var.multi):
        return ",".join("'" + v.replace("'", "''") + "'" for v in var.values)
    if fmt is None:
        return var.values[0].replace("'", "''")
    raise ValueError(f"unsupported variable format {fmt!r}")


def interval_text(ms: int) -> str:
    """Grafana's $__interval: the largest unit that divides the interval."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _seconds(text: str) -> float:
    text = text.strip().strip("'\"")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text)
    if not m:
        raise ValueError(f"bad interval {text!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(sql: str, variables: dict[str, Var], start: datetime, end: datetime, interval_ms: int) -> str:
    def variable(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(5)
        if name not in variables:
            return m.group(0)  # not a variable ($__macro, or unknown): left as is, like Grafana
        return _format(variables[name], fmt)

    sql = _VARIABLE.sub(variable, sql)
    sql = (sql.replace("$__interval_ms", str(interval_ms)).replace("$__interval", interval_text(interval_ms))
           .replace("$__unixEpochFrom()", str(int(start.timestamp())))
           .replace("$__unixEpochTo()", str(int(end.timestamp()))))
    frm, to = f"'{_rfc3339(start)}'", f"'{_rfc3339(end)}'"

    def macro(m: re.Match[str]) -> str:
        name, args = m.group(1), [a.strip() for a in m.group(2).split(",")] if m.group(2).strip() else []
        if name == "__time":
            return f'{args[0]} AS "time"'
        if name == "__timeEpoch":
            return f'extract(epoch from {args[0]}) as "time"'
        if name == "__timeFilter":
            return f"{args[0]} BETWEEN {frm} AND {to}"
        if name == "__timeFrom":
            return frm
        if name == "__timeTo":
            return to
        if name in ("__timeGroup", "__timeGroupAlias"):
            step = _seconds(args[1])
            out = f"floor(extract(epoch from {args[0]})/{step:g})*{step:g}"
            return out + (' AS "time"' if name.endswith("Alias") else "")
        if name == "__unixEpochFilter":
            return f"{args[0]} >= {int(start.timestamp())} AND {args[0]} <= {int(end.timestamp())}"
        if name in ("__unixEpochGroup", "__unixEpochGroupAlias"):
            step = _seconds(args[1])
            out = f"floor(({args[0]})/{step:g})*{step:g}"
            return out + (' AS "time"' if name.endswith("Alias") else "")
        raise ValueError(f"unknown macro ${name}(...) in query")

    return _MACRO.sub(macro, sql)
