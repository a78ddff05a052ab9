"""MIG profiles per GPU model, as NVIDIA's MIG user guide lists them: the rules advise a slice from
them, the store counts a slice's share of its GPU from them."""

from __future__ import annotations

# (words all in the model name, compute slices of the whole GPU, profiles), first match wins.
MODELS: tuple[tuple[tuple[str, ...], int, tuple[str, ...]], ...] = (
    (("H200",), 7, ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")),
    (("H100", "NVL"), 7, ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")),
    (("H100",), 7, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    (("A100", "80GB"), 7, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    (("A100",), 7, ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")),
    (("A30",), 4, ("1g.6gb", "2g.12gb", "4g.24gb")),
)
