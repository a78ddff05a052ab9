"""Lay panels out on Grafana's 24-column grid and number them."""

from __future__ import annotations

from typing import Any, cast

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm


def finish(d: db.Dashboard, panels: list[Any], annotations: list[dm.AnnotationQuery] | None = None
            ) -> dm.Dashboard:
    """Add the panels left to right, wrapping when a panel would cross the 24-column grid (the
    SDK's own placement lets a wide panel overflow), number them, and add the SQL annotations
    (which the SDK's builders cannot express)."""
    for p in panels:
        d = d.with_panel(p)
    model = d.build()
    x = y = row_h = 0
    for i, panel in enumerate(model.panels or [], 1):
        pos = cast(dm.GridPos, panel.grid_pos)  # with_panel and with_row give every panel a grid_pos
        if x + pos.w > 24:
            x, y, row_h = 0, y + row_h, 0
        pos.x, pos.y = x, y
        x, row_h = x + pos.w, max(row_h, pos.h)
        panel.id_val = i
    if annotations:
        model.annotations.list_val = [*(model.annotations.list_val or []), *annotations]
    return model
