"""Store: captures of evidence for flags (`jobpulse.flag_captures`): which flags get their rank's
stacks sampled, handing the requests to the node's agent, and what came back. Reads of flags, jobs
and process samples (distributed on Citus) and of the captures (a coordinator table) are separate
statements, never one join."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from jobpulse.schema import wire

QUEUED = 5  # captures one node's agent may run before a new one: its queue (4) and the one running


def new_flags(conn: psycopg.Connection[Any], rules: tuple[str, ...], kind: str = "stacks",
              hours: float = 1.0) -> list[dict[str, Any]]:
    """Open flags of these rules on running jobs, opened within ``hours``, scoped to a GPU or a rank
    (the scope key names the node) or job-wide naming its GPUs (``per_gpu``), whose job did not opt
    out (tag ``capture=off``) and that have no capture of this kind yet. A trace only for a job that allowed it: its in-job client said so (an
    event ``trace_ready``) or its comment did (``trace=on``)."""
    cur = conn.cursor(row_factory=dict_row)
    flags = cur.execute(
        "SELECT f.id, f.cluster, f.job_id, f.rule_id, f.scope, f.scope_key, f.evidence, j.tags->>'trace' AS trace"
        " FROM jobpulse.job_flags f JOIN jobpulse.jobs j ON j.cluster = f.cluster AND j.job_id = f.job_id"
        " WHERE f.ended_at IS NULL AND j.end_time IS NULL AND f.rule_id = ANY(%s)"
        " AND (f.scope IN ('gpu', 'rank') OR (f.scope = 'job' AND f.evidence ? 'per_gpu'))"
        " AND f.opened_at > now() - make_interval(secs => %s) AND coalesce(j.tags->>'capture', '') <> 'off'"
        " ORDER BY f.id", (list(rules), hours * 3600)).fetchall()
    if not flags:
        return []
    known = {r[0] for r in conn.execute("SELECT flag_id FROM jobpulse.flag_captures WHERE flag_id = ANY(%s)"
                                        " AND kind = %s", ([f["id"] for f in flags], kind)).fetchall()}
    flags = [f for f in flags if f["id"] not in known]
    if kind == "trace" and flags:
        ready = {(r[0], r[1]) for r in conn.execute(
            "SELECT DISTINCT cluster, job_id FROM jobpulse.events WHERE kind = 'trace_ready'"
            " AND job_id = ANY(%s)", (sorted({f["job_id"] for f in flags}),)).fetchall()}
        flags = [f for f in flags if f["trace"] == "on" or (f["cluster"], f["job_id"]) in ready]
    return flags


def rank_pids(conn: psycopg.Connection[Any], cluster: str, job_id: str, node: str, gpu_uuid: str | None,
              pid: int | None) -> list[int]:
    """The rank's processes as last seen (within ten minutes): its main process (the one on
    ``gpu_uuid``, or ``pid``) first, then the processes of the same rank that hold no GPU and were seen
    within a minute of it (its data-loader workers, not the ones an earlier epoch left behind)."""
    rows = conn.execute(
        "SELECT DISTINCT ON (pid, gpu_uuid) pid, rank, gpu_uuid, ts FROM jobpulse.process_samples"
        " WHERE cluster = %s AND node = %s AND job_id = %s AND ts > now() - interval '10 minutes'"
        " ORDER BY pid, gpu_uuid, ts DESC", (cluster, node, job_id)).fetchall()
    main = sorted((r for r in rows if (r[0] == pid if pid is not None else r[2] == gpu_uuid)), key=lambda r: r[3])
    if not main:
        return []
    first, rank, _, seen = main[-1]
    if rank is None:  # no rank to tell this rank's workers from the job's other processes
        return [first]
    on_gpus = {r[0] for r in rows if r[2] is not None}
    workers = sorted(r[0] for r in rows if r[2] is None and r[1] == rank and r[0] not in on_gpus
                     and (seen - r[3]).total_seconds() <= 60)
    return [first, *workers][:16]


def asked_since(conn: psycopg.Connection[Any], hours: float, kind: str = "stacks") -> int:
    """Captures of this kind asked of agents within ``hours``, site-wide (what the rate limit counts; not
    those refused)."""
    row = conn.execute("SELECT count(*) FROM jobpulse.flag_captures WHERE pids <> '{}' AND kind = %s"
                       " AND requested_at > now() - make_interval(secs => %s)",
                       (kind, hours * 3600)).fetchone()
    return int(row[0]) if row else 0


def ask(conn: psycopg.Connection[Any], flag: dict[str, Any], node: str, pids: list[int], seconds: float,
        kind: str = "stacks", steps: int = 0, max_bytes: int = 0) -> bool:
    """A pending capture of this kind for this flag (none if it has one); True when new."""
    cur = conn.execute(
        "INSERT INTO jobpulse.flag_captures (flag_id, cluster, job_id, node, rule_id, pids, seconds, kind, steps,"
        " max_bytes) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (flag_id, kind) DO NOTHING",
        (flag["id"], flag["cluster"], flag["job_id"], node, flag["rule_id"], pids, seconds, kind, steps, max_bytes))
    return cur.rowcount == 1


def refuse(conn: psycopg.Connection[Any], flag: dict[str, Any], node: str, reason: str, kind: str = "stacks") -> None:
    """A capture that cannot be asked for (no process of the rank seen), kept so the flag says why."""
    conn.execute(
        "INSERT INTO jobpulse.flag_captures (flag_id, cluster, job_id, node, rule_id, pids, seconds, state, done_at,"
        " reason, kind) VALUES (%s, %s, %s, %s, %s, '{}', 0, 'failed', now(), %s, %s) ON CONFLICT (flag_id, kind)"
        " DO NOTHING", (flag["id"], flag["cluster"], flag["job_id"], node, flag["rule_id"], reason, kind))


def expire(conn: psycopg.Connection[Any], answer_s: float) -> int:
    """Captures the agent did not answer in time (it stopped, the job ended): failed, with the reason.
    In time: ``answer_s`` beyond what the captures that may wait before it on the node take."""
    cur = conn.execute(
        "UPDATE jobpulse.flag_captures SET state = 'failed', done_at = now(), reason = CASE state"
        " WHEN 'sent' THEN 'the node''s agent did not answer in time' ELSE 'the node''s agent did not ask for it"
        " in time' END WHERE (state = 'sent' AND sent_at < now() - make_interval(secs => %s + (seconds + 20) * %s))"
        " OR (state = 'pending' AND requested_at < now() - make_interval(secs => %s))",
        (answer_s, QUEUED, answer_s * 2))
    return cur.rowcount


WAITING = "SELECT DISTINCT cluster, node FROM jobpulse.flag_captures WHERE state = 'pending'"
"""(cluster, node) of every pending capture: whose next batch gets requests in its answer."""

HAND_OUT = (
    "UPDATE jobpulse.flag_captures SET state = 'sent', sent_at = now() WHERE id IN (SELECT id FROM"
    " jobpulse.flag_captures WHERE state = 'pending' AND cluster = %s AND node = %s ORDER BY id LIMIT 2"
    " FOR UPDATE SKIP LOCKED) RETURNING id, job_id, pids, seconds, kind, steps, max_bytes")
"""The node's pending captures, marked sent (each goes to one collector's answer, whatever their number)."""

RECORD = (
    "UPDATE jobpulse.flag_captures SET state = %(state)s, done_at = now(), result = %(result)s, reason = %(reason)s,"
    " trace = CASE WHEN octet_length(%(trace)s::bytea) <= max_bytes THEN %(trace)s::bytea END,"
    " trace_bytes = CASE WHEN octet_length(%(trace)s::bytea) <= max_bytes THEN octet_length(%(trace)s::bytea) END"
    " WHERE id = %(id)s AND cluster = %(cluster)s AND node = %(node)s AND job_id = %(job_id)s"
    " AND sent_at IS NOT NULL AND result IS NULL AND state IN ('sent', 'failed')")
"""An agent's answer, taken only for a capture sent to its own node and not answered yet (a replayed
batch changes nothing); a trace kept only within the size the capture allowed. An answer later than
the collector waited still replaces its "no answer"."""


def record_params(cluster: str, node: str, result: wire.CaptureResult) -> dict[str, Any]:
    found: dict[str, Any] = {"seconds": result.seconds}
    if result.summary is not None:
        found["summary"] = msgspec.to_builtins(result.summary)
    else:
        found |= {"samples": dict(result.samples),
                  "top": [{"role": s.role, "frames": s.frames, "share": s.share} for s in result.top]}
    return {"state": "done" if result.ok else "failed", "result": Jsonb(found), "reason": result.reason or None,
            "trace": result.trace, "id": result.id, "cluster": cluster, "node": node, "job_id": result.job_id}


def drop_traces(conn: psycopg.Connection[Any], days: float) -> int:
    """Traces kept longer than ``days`` dropped (their summaries stay): a retention of their own."""
    cur = conn.execute("UPDATE jobpulse.flag_captures SET trace = NULL WHERE trace IS NOT NULL"
                       " AND done_at < now() - make_interval(secs => %s)", (days * 86400,))
    return cur.rowcount


TRACE_OF = ("SELECT cluster, job_id, trace, octet_length(trace) FROM jobpulse.flag_captures"
            " WHERE id = %s AND kind = 'trace'")
"""A trace capture's job and bytes (NULL once dropped): for the job's owner and the admins only."""


def of_job(conn: psycopg.Connection[Any], cluster: str, job_id: str) -> dict[int, dict[str, dict[str, Any]]]:
    """The job's captures by flag id, then kind (the trace's size, not its bytes)."""
    cur = conn.cursor(row_factory=dict_row)
    rows = cur.execute("SELECT id, flag_id, kind, node, pids, state, requested_at, done_at, result, reason, steps,"
                       " trace_bytes, trace IS NOT NULL AS trace_kept FROM jobpulse.flag_captures"
                       " WHERE cluster = %s AND job_id = %s", (cluster, job_id)).fetchall()
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r.pop("flag_id"), {})[r["kind"]] = r
    return out


def of_flags(conn: psycopg.Connection[Any], keys: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The captures of stored flags, by the flags' (cluster, job, rule, scope, scope key), then kind."""
    if not keys:
        return {}
    cur = conn.cursor(row_factory=dict_row)
    jobs = sorted({(k[0], k[1]) for k in keys})
    flags = {r["id"]: (r["cluster"], r["job_id"], r["rule_id"], r["scope"], r["scope_key"]) for r in cur.execute(
        "SELECT id, cluster, job_id, rule_id, scope, scope_key FROM jobpulse.job_flags"
        " WHERE (cluster, job_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([c for c, _ in jobs], [j for _, j in jobs])).fetchall()}
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for cluster, job in jobs:
        for flag_id, kinds in of_job(conn, cluster, job).items():
            if flag_id in flags:
                out.setdefault(flags[flag_id], {}).update(kinds)
    return out
