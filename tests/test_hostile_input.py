"""Every hostile input, systematically: NUL and lone surrogates in every text field, far times in
every time field, NaN and infinities in every number, bombs, deep nesting, a replayed seq, a huge
batch. Counted: requests, statuses and rows; 0 5xx, nothing stored that was refused."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg

from .batches import as_dict, full_batch, gpu_batch, replaced, walk
from .conftest import RunningCollector

GOOD = as_dict(full_batch(seq=1))
FAR = ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59", "1900-01-01T00:00:00Z", "2200-01-01T00:00:00Z"]


def is_time(path: tuple[Any, ...], value: Any) -> bool:
    return isinstance(value, str) and (path[-1] in ("ts", "created_at", "started_at") or str(path[-1]).endswith("_time"))


def hostile_bodies() -> Iterator[tuple[str, bytes]]:
    for path, value in ((p, v) for p, v in walk(GOOD) if not isinstance(v, dict | list)):
        where = "$." + ".".join(map(str, path))
        if isinstance(value, str) and not is_time(path, value):
            yield f"NUL in {where}", json.dumps(replaced(GOOD, path, value + "\x00x")).encode()
            yield f"surrogate in {where}", json.dumps(replaced(GOOD, path, "a\ud800b")).encode()
        if is_time(path, value):
            for far in FAR:
                yield f"{far} in {where}", json.dumps(replaced(GOOD, path, far)).encode()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            free_form = "attrs" in path  # any JSON number is a valid attribute: 2**64 included
            for bad in ("NaN", "Infinity", "-Infinity", "1e400", *(() if free_form else (str(2**64),))):
                text = json.dumps(replaced(GOOD, path, "@@")).replace('"@@"', bad)
                yield f"{bad} in {where}", text.encode()
    yield "deep nesting", b'{"version": 1, "agent": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    yield "gzip bomb", gzip.compress(b" " * 200_000_000)
    yield "NUL key", json.dumps({**GOOD, "\x00": 1}).encode()


def test_hostile_inputs_are_refused_whole(collector: RunningCollector, dsn: str) -> None:
    statuses: Counter[int] = Counter()
    wrong: list[str] = []
    with collector.client() as http:
        for what, body in hostile_bodies():
            headers = {"Content-Type": "application/json"}
            if what == "gzip bomb":
                headers["Content-Encoding"] = "gzip"
            r = http.post("/v1/batches", content=body, headers=headers)
            statuses[r.status_code] += 1
            if r.status_code < 400 or r.status_code >= 500:
                wrong.append(f"{what}: {r.status_code} {r.text[:120]}")
        # The same seq again with another created_at is a duplicate; 100,000 GPUs in one batch is
        # refused by size (the fixture's limit is 2 MB), never half-stored.
        first = http.post("/v1/batches", content=json.dumps(GOOD).encode())
        again = http.post("/v1/batches", content=json.dumps({**GOOD, "created_at": GOOD["gpu_samples"][0]["ts"]}))
        huge = as_dict(gpu_batch(2, n_gpus=1))
        huge["gpu_samples"] = [dict(huge["gpu_samples"][0], gpu_uuid=f"GPU-{i}", gpu_index=i % 32000)
                               for i in range(100_000)]
        big = http.post("/v1/batches", content=json.dumps(huge).encode())
        for r in (first, again, big):
            statuses[r.status_code] += 1
        with psycopg.connect(dsn) as conn:
            rows = conn.execute("SELECT (SELECT count(*) FROM jobpulse.ingest_batches),"
                                " (SELECT count(*) FROM jobpulse.gpu_samples)").fetchone()
    total = sum(statuses.values())
    print(f"\nhostile input: {total} requests, statuses {dict(sorted(statuses.items()))}, "
          f"ledger rows {rows[0]}, GPU samples {rows[1]}")
    assert not wrong, wrong[:10]
    assert first.json()["status"] == "stored" and again.json()["status"] == "duplicate"
    assert big.status_code == 413
    assert rows == (1, 2), "only the one good batch is stored, once"
    assert total > 400 and not any(s >= 500 for s in statuses)
