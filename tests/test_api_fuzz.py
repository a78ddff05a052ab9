"""Schemathesis against the collector's own OpenAPI document: valid and invalid bodies, queries,
paths and headers, with and without a token. No request may get a 5xx."""

from __future__ import annotations

import os
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from jobpulse.collector.ingest import openapi

from .conftest import Shared

# The default keeps CI short (700: 70 examples a shard, derandomized, so each run sends the same);
# JOBPULSE_FUZZ_REQUESTS=10000 (say) searches deeper.
REQUESTS = int(os.environ.get("JOBPULSE_FUZZ_REQUESTS", "700"))
SCHEMA = schemathesis.openapi.from_dict(openapi.document("fuzz"))
# One test per operation and generation mode (valid, invalid) for the operations that take input, one
# per operation for those that take none, so the requests spread over workers.
SHARDS = [(op.ok(), modes) for op in SCHEMA.get_all_operations()
          for modes in ([[m] for m in GenerationMode] if op.ok().path.startswith("/v1/") else [list(GenerationMode)])]


@pytest.mark.parametrize("shard", range(len(SHARDS)),
                         ids=[f"{op.method.upper()} {op.path} {'+'.join(m.value for m in modes)}" for op, modes in SHARDS])
def test_no_request_gets_a_server_error(shared_collector: Shared, shard: int) -> None:
    collector = shared_collector.collector
    operation, modes = SHARDS[shard]
    examples = REQUESTS // len(SHARDS)
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    http = httpx.Client(timeout=30)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(*(operation.as_strategy(generation_mode=mode) for mode in modes)),
           authorized=st.sampled_from([True, True, True, False]))
    def run(case: schemathesis.Case, authorized: bool) -> None:
        headers = {"Authorization": f"Bearer {collector.token}"} if authorized else {}
        # Sent with httpx: schemathesis' own transport (requests) trips over urllib3-future, which
        # grafana-client's HTTP library installs in place of urllib3.
        kw = case.as_transport_kwargs(base_url=collector.url, headers=headers)
        kw.pop("cookies", None)  # the API reads none
        if isinstance(kw.get("data"), bytes):
            kw["content"] = kw.pop("data")
        try:  # HTTP carries header bytes as Latin-1 (obs-text); httpx would encode a str as ASCII only
            kw["headers"] = {(k.encode("latin-1") if isinstance(k, str) else k): (
                v.encode("latin-1") if isinstance(v, str) else v) for k, v in (kw.get("headers") or {}).items()}
        except UnicodeEncodeError:  # beyond Latin-1: no HTTP client can send it
            statuses[0] += 1
            return
        try:
            r = http.request(kw.pop("method"), kw.pop("url"), **kw)
        except httpx.LocalProtocolError:  # a header no HTTP client can send (negative generation)
            statuses[0] += 1
            return
        statuses[r.status_code] += 1
        if r.status_code >= 500 and r.status_code != 503:
            failures.append(f"{case.method} {case.formatted_path} {case.query} -> {r.status_code} {r.text[:200]}")

    run()
    http.close()
    print(f"\nfuzz {operation.method.upper()} {operation.path}: {sum(statuses.values())} requests,"
          f" statuses {dict(sorted(statuses.items()))}")
    assert not failures, failures[:5]
    if operation.path.startswith("/v1/"):  # the others take no input: a few requests say all
        assert sum(n for status, n in statuses.items() if status) >= examples // 2
    assert statuses[503] == 0
