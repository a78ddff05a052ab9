"""The collector's HTTP contract: response bodies and the OpenAPI document (``/openapi.json``).

Request and response schemas are generated from the msgspec structs, so the document cannot
disagree with what the service validates.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from jobpulse.schema import wire


class Ack(msgspec.Struct):
    """A batch is committed (or was already): the agent may delete it from its spool."""

    status: Literal["stored", "duplicate"]
    seq: int
    rows: dict[str, int]
    captures: list[wire.Capture] = []  # evidence the collector asks this node's agent for


class ErrorBody(msgspec.Struct):
    """Why a request was refused; ``field`` is a JSON path (``$.gpu_samples[0].ts``) or a header."""

    error: str
    field: str | None = None


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref("ErrorBody")}}}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document(version: str) -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [wire.Batch, Ack, ErrorBody], ref_template="#/components/schemas/{name}")
    unavailable = _error("database unavailable; retry after the Retry-After seconds")
    unavailable["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
    bearer: list[dict[str, list[str]]] = [{"bearer": []}]
    job_filters = [
        {"name": "cluster", "in": "query", "schema": {"type": "string"}},
        {"name": "user", "in": "query", "schema": {"type": "string"}},
        {"name": "state", "in": "query", "schema": {"type": "string", "enum": ["running", "ended"]}},
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 10000}},
    ]
    return {
        "openapi": "3.1.0",
        "info": {"title": "jobpulse collector", "version": version,
                 "description": f"Ingest of agent batches (wire format v{wire.WIRE_VERSION}) and job queries."},
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/v1/batches": {"post": {
                "summary": "Store one agent batch (gzip body accepted); acknowledged after commit",
                "security": bearer,
                "parameters": [{"name": "Content-Encoding", "in": "header",
                                "schema": {"type": "string", "enum": ["gzip", "identity"]}}],
                "requestBody": {"required": True,
                                "content": {"application/json": {"schema": _ref("Batch")}}},
                "responses": {
                    "200": _json("stored, or a duplicate of a stored batch", _ref("Ack")),
                    "400": _error("malformed JSON or gzip"), "401": _error("missing or wrong token"),
                    "403": _error("the token may not write as this node or cluster"),
                    "409": _error("the agent instance already wrote as another node or cluster"),
                    "408": _error("the body did not arrive in time"), "413": _error("body too large"), "415": _error("unsupported content type or encoding"),
                    "422": _error("invalid field (named in `field`)"), "503": unavailable,
                },
            }},
            "/v1/jobs": {"get": {
                "summary": "Jobs, newest first", "security": bearer, "parameters": job_filters,
                "responses": {"200": _json("jobs", {"type": "array", "items": {"type": "object"}}),
                              "401": _error("missing or wrong token"), "422": _error("bad parameter"),
                              "403": _error("a token bound to a cluster reads only that cluster"),
                              "503": unavailable},
            }},
            "/v1/jobs/{job_id}": {"get": {
                "summary": "One job with its GPUs and flags", "security": bearer,
                "parameters": [{"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}},
                               job_filters[0]],
                "responses": {"200": _json("the job", {"type": "object"}),
                              "401": _error("missing or wrong token"), "404": _error("no such job"),
                              "403": _error("a token bound to a cluster reads only that cluster"),
                              "422": _error("bad job id or parameter"),
                              "409": _error("the id exists in several clusters; pass cluster"),
                              "503": unavailable},
            }},
            "/v1/captures/{capture_id}/trace": {"get": {
                "summary": "A flag's profiler trace (gzip Chrome trace JSON)",
                "description": "For the admins (a bearer token for the job's cluster) and the job's owner: "
                               "`Authorization: MUNGE:...`, a credential from `munge -n -s \"jobpulse trace ID\"`.",
                "security": bearer,
                "parameters": [{"name": "capture_id", "in": "path", "required": True,
                                "schema": {"type": "integer", "minimum": 1}}],
                "responses": {"200": {"description": "the trace",
                                      "content": {"application/gzip": {"schema": {"type": "string",
                                                                                  "format": "binary"}}}},
                              "401": _error("missing or wrong token or MUNGE credential"),
                              "403": _error("not the job's owner, or a token bound to another cluster"),
                              "404": _error("no such trace capture, or its trace is no longer kept"),
                              "422": _error("bad capture id"), "503": unavailable},
            }},
            "/healthz": {"get": {"summary": "Service and database health",
                                 "responses": {"200": {"description": "healthy"},
                                               "503": {"description": "database unreachable"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics of the collector",
                                 "responses": {"200": {"description": "text exposition format"}}}},
        },
    }
