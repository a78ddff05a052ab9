"""Rule thresholds: the shipped defaults (`rules_default.toml`, each with its reason), a site's
file on top, and per-partition and per-GPU-model overrides."""

from __future__ import annotations

import tomllib
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any


def _default_text() -> str:
    return resources.files("jobpulse.collector.rules").joinpath("rules_default.toml").read_text()


class Thresholds:
    """Settings by name; ``for_gpu`` merges the overrides that apply to one GPU."""

    def __init__(self, path: Path | None = None) -> None:
        text = path.read_text() if path else _default_text()
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"rules file {path}: {exc}") from None
        base = dict(tomllib.loads(_default_text())["defaults"])
        unknown = set(data.get("defaults", {})) - set(base)
        if unknown:
            raise ValueError(f"rules file {path}: unknown settings {', '.join(sorted(unknown))}")
        self.defaults = {**base, **data.get("defaults", {})}
        self.partitions: dict[str, dict[str, Any]] = data.get("partition", {})
        self.models: dict[str, dict[str, Any]] = data.get("model", {})
        self._merged: dict[tuple[str, str], dict[str, Any]] = {}

    def for_gpu(self, partition: str | None, model: str | None) -> dict[str, Any]:
        """The merged settings, one dict per (partition, model): rules memoize per GPU and settings."""
        key = (partition or "", model or "")
        if key not in self._merged:
            self._merged[key] = {**self.defaults, **self.partitions.get(key[0], {}), **self.models.get(key[1], {})}
        return self._merged[key]

    @property
    def flag_hold(self) -> timedelta:
        """How long a flag stays open after its last hit (hysteresis)."""
        return timedelta(minutes=self.defaults["flag_hold_minutes"])

    @property
    def lookback(self) -> timedelta:
        minutes = [self.defaults["window_minutes"], self.defaults["idle_minutes"]]
        for table in (*self.partitions.values(), *self.models.values()):
            minutes += [table.get("window_minutes", 0), table.get("idle_minutes", 0)]
        # + one minute: the evidence is whole minutes, and the oldest one may be partial.
        return timedelta(minutes=max(minutes) + 1)
