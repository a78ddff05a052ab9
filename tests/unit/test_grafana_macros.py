"""Grafana's macro and variable expansion, as the dashboard tests use it to run panel SQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.grafana_macros import Var, expand, interval_text

END = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
START = END - timedelta(hours=1)


def test_single_values_are_bare_and_multi_values_are_quoted_lists() -> None:
    variables = {"job": Var(("12'3",)), "node": Var(("n1", "n2"), multi=True)}
    sql = expand("job_id = '$job' AND node IN ($node) AND x IN (${node:csv})", variables, START, END, 1000)
    assert sql == "job_id = '12''3' AND node IN ('n1','n2') AND x IN (n1,n2)"


def test_raw_format_and_unknown_variables() -> None:
    variables = {"group_by": Var(("user_name",))}
    assert expand("j.${group_by:raw}, $unknown", variables, START, END, 1000) == "j.user_name, $unknown"


def test_time_macros_use_the_range_and_the_interval() -> None:
    sql = expand("$__timeGroupAlias(bucket, $__interval) WHERE $__timeFilter(ts) LIMIT $__interval_ms",
                 {}, START, END, 300_000)
    assert sql == ('floor(extract(epoch from bucket)/300)*300 AS "time" WHERE ts BETWEEN '
                   "'2026-01-02T02:04:05Z' AND '2026-01-02T03:04:05Z' LIMIT 300000")
    assert expand("$__timeFrom(), $__timeTo()", {}, START, END, 1) == "'2026-01-02T02:04:05Z', '2026-01-02T03:04:05Z'"


@pytest.mark.parametrize(("ms", "text"), [(1000, "1s"), (60_000, "1m"), (7_200_000, "2h"), (86_400_000, "1d"),
                                          (1500, "1500ms")])
def test_interval_text_uses_the_largest_unit(ms: int, text: str) -> None:
    assert interval_text(ms) == text


def test_an_unknown_macro_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown macro"):
        expand("$__nope(x)", {}, START, END, 1000)
