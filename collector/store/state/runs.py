"""Store: a job's runs and the scheduler's states within them, kept as its records arrive.

Slurm requeues a job under its id (a node failure, a preemption, `scontrol requeue`) and counts its
runs (the restart count: ``run``). The job row describes the run under way or last ended; a record
of a later run moves the row's run into ``job_runs`` (its start, end, end state, exit code, nodes)
and starts the row afresh, so the rules judge the new run (`rules_final_at` cleared) and no start
comes after an end. A record of an earlier run (slurm-sync naming how it ended, a node's epilog that
arrives late: its end before the row's start) goes to that run's row in ``job_runs``, never to the
job row. ``job_states`` keeps the controller's state as it changes while a run runs (RUNNING,
SUSPENDED, RUNNING): each interval from when Slurm changed it (`jobs.state_since`) to the next
change or the run's end.

The statements run in the ingest transaction, per record, in the records' arrival order
(`database.Storage._upsert_jobs`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from jobpulse.schema import wire

REQUEUED = "REQUEUED"
"""The end state of a run that Slurm requeued where nothing named why (accounting names NODE_FAIL,
PREEMPTED)."""
FINAL = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE", REQUEUED)
RUN_SCOPED = ("start_time", "end_time", "state", "state_since", "exit_code", "nodes", "gpus_total")
"""A job row's columns that are its run's own: a later run's record replaces them whole."""
NEWER = "EXCLUDED.run > coalesce(j.run, 0)"
EARLIER = "(EXCLUDED.run < j.run OR (EXCLUDED.run IS NULL AND EXCLUDED.end_time < j.start_time))"
"""SQL over the stored row ``j`` and the record (``EXCLUDED``): a later run's record; an earlier run's
(by its count, or, from an epilog that carries none, an end before the row's start)."""

_SINCE = "greatest(coalesce(j.state_since, j.start_time, %(now)s::timestamptz), j.start_time)"
"""When the job row's state began (its run's start at the earliest; the time of writing when the row
names neither: a parameter, as Citus refuses now() inside a distributed UPDATE's COALESCE)."""
_THIS_JOB = "j.cluster = %(c)s AND j.job_id = %(j)s AND {t}.cluster = %(c)s AND {t}.job_id = %(j)s"
"""Every table named with the job's key as constants: Citus routes such a statement, correlated
subqueries and all, to the job's shard (a CTE over the job row made it refuse them)."""

ARCHIVE = f"""
INSERT INTO jobpulse.job_runs AS r (cluster, job_id, run, start_time, end_time, state, exit_code, nodes, gpus_total)
SELECT j.cluster, j.job_id, coalesce(j.run, 0), j.start_time, j.end_time,
       CASE WHEN j.state IN ({", ".join(f"'{s}'" for s in FINAL)}) THEN j.state ELSE '{REQUEUED}' END,
       j.exit_code, j.nodes, j.gpus_total
  FROM jobpulse.jobs j
 WHERE j.cluster = %(c)s AND j.job_id = %(j)s AND coalesce(j.run, 0) < %(run)s
ON CONFLICT (cluster, job_id, run) DO UPDATE SET
    start_time = coalesce(r.start_time, EXCLUDED.start_time), end_time = coalesce(r.end_time, EXCLUDED.end_time),
    state = CASE WHEN r.state IS NULL OR r.state = '{REQUEUED}' THEN EXCLUDED.state ELSE r.state END,
    exit_code = coalesce(r.exit_code, EXCLUDED.exit_code), nodes = coalesce(r.nodes, EXCLUDED.nodes),
    gpus_total = coalesce(r.gpus_total, EXCLUDED.gpus_total)
"""
"""Before a later run's record: the row's run kept in ``job_runs`` (a state it never ended in, such
as RUNNING, reads REQUEUED)."""

EARLIER_RUN = f"""
UPDATE jobpulse.job_runs r
   SET start_time = coalesce(r.start_time, %(start)s), end_time = coalesce(%(end)s, r.end_time),
       state = CASE WHEN %(state)s::text IS NULL OR %(state)s = '{REQUEUED}' THEN coalesce(r.state, %(state)s)
                    WHEN %(run)s::int IS NOT NULL OR r.state IS NULL OR r.state = '{REQUEUED}' THEN %(state)s
                    ELSE r.state END,
       exit_code = coalesce(%(code)s, r.exit_code)
  FROM jobpulse.jobs j
 WHERE {_THIS_JOB.format(t="r")}
   AND (%(run)s::int < j.run OR (%(run)s::int IS NULL AND %(end)s::timestamptz < j.start_time))
   AND r.run = coalesce(%(run)s::int, (SELECT max(x.run) FROM jobpulse.job_runs x WHERE x.cluster = %(c)s
                                         AND x.job_id = %(j)s AND x.start_time <= %(end)s::timestamptz))
"""
"""A record of an earlier run: onto that run (by its count; an epilog's end by when it came). The
controller's end state (its records carry the run) wins over a node's; REQUEUED never hides another."""

CLOSE_STATE = f"""
UPDATE jobpulse.job_states s
   SET until = greatest(s.since, CASE WHEN coalesce(j.run, 0) = s.run THEN coalesce(j.end_time, {_SINCE})
                                      ELSE (SELECT coalesce(r.end_time, {_SINCE}) FROM jobpulse.job_runs r
                                             WHERE r.cluster = %(c)s AND r.job_id = %(j)s AND r.run = s.run) END)
  FROM jobpulse.jobs j
 WHERE {_THIS_JOB.format(t="s")}
   AND ((s.until IS NULL AND (s.run <> coalesce(j.run, 0) OR s.state IS DISTINCT FROM j.state
                              OR j.end_time IS NOT NULL))
        -- the run's last interval, closed at an end the controller has since said exactly
        OR (s.run = coalesce(j.run, 0) AND s.until IS DISTINCT FROM j.end_time AND j.end_time IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM jobpulse.job_states t WHERE t.cluster = %(c)s AND t.job_id = %(j)s
                              AND t.run = s.run AND t.since > s.since)))
"""
OPEN_STATE = f"""
INSERT INTO jobpulse.job_states (cluster, job_id, run, state, since, source)
SELECT j.cluster, j.job_id, coalesce(j.run, 0), j.state, {_SINCE}, 'slurm' FROM jobpulse.jobs j
 WHERE j.cluster = %(c)s AND j.job_id = %(j)s AND j.state IN ('RUNNING', 'SUSPENDED') AND j.end_time IS NULL
   AND NOT EXISTS (SELECT 1 FROM jobpulse.job_states s WHERE s.cluster = %(c)s AND s.job_id = %(j)s
                     AND s.until IS NULL AND s.run = coalesce(j.run, 0) AND s.state = j.state)
ON CONFLICT (cluster, job_id, since) DO UPDATE SET state = EXCLUDED.state, run = EXCLUDED.run, until = NULL
"""
"""After a record that names a state or an end, in this order: the open interval closed where the
state changed (at the new state's start) or the run ended (moved to the controller's exact end when
that comes after a node's), and the new state's opened (RUNNING, SUSPENDED; a state that held for no
whole second gives way to the next). The open interval the second looks for is one the first never
closes (same run and state, no end)."""


def statements(cluster: str, job: wire.JobRecord) -> tuple[list[tuple[str, dict[str, Any]]],
                                                           list[tuple[str, dict[str, Any]]]]:
    """The statements around one record's upsert of the job row, with their parameters: those to run
    before it (an earlier run kept) and after it (an earlier run's record, the states)."""
    key = {"c": cluster, "j": job.job_id}
    before = [(ARCHIVE, {**key, "run": job.run})] if job.run else []
    after: list[tuple[str, dict[str, Any]]] = []
    if job.run is not None or job.end_time is not None:
        after.append((EARLIER_RUN, {**key, "run": job.run, "start": job.start_time, "end": job.end_time,
                                    "state": job.state, "code": job.exit_code}))
    if job.state is not None or job.end_time is not None or job.start_time is not None:
        states = {**key, "now": datetime.now(UTC)}
        after.extend([(CLOSE_STATE, states), (OPEN_STATE, states)])
    return before, after
