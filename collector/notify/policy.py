"""The site policy (off unless the site writes one), per kind of waste: `[idle_gpu]` (a GPU idle for
``warn_after_minutes``) and `[hung]` (a hung job: its GPUs spin in a collective after a rank or node
broke, or longer than the job's collective timeout: the strong form of the hang claim only, never the
`stalled` note; the warning says which evidence it acts on). The job's owner gets a warning; still flagged ``cancel_after_minutes`` after the warning,
the job of the site's ``cluster`` is cancelled, or (hung jobs) requeued, its reason in the job's
AdminComment (which `scontrol show job` and `sacct -o AdminComment` show); a dry run records what it
would have done. Opt-in by partition (``partitions``), exempt by partition, account and user, or by
the job's own `policy=off` where the site allows it; with ``only_while_queued`` only while jobs wait for
GPUs in the job's partition (`queue_gate`). An idle job with an open hardware flag is never
acted on (the idleness is the node's fault: drain it instead); a hung job is, whoever broke it: it
will not resume, and a requeue moves it off a lost node. Every decision goes into
`jobpulse.policy_actions` with its evidence, once per job, policy and action.
"""

from __future__ import annotations

import subprocess
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import structlog

from jobpulse.collector.notify import mail, queue_gate
from jobpulse.collector.rules.registry import HUNG, IDLE_GPU, OVER_ALLOCATION
from jobpulse.collector.store.read import queue_reads
from jobpulse.collector.store.state import policy_actions

log = structlog.get_logger("jobpulse.policy")


KINDS: dict[str, tuple[str, ...]] = {IDLE_GPU: (IDLE_GPU, OVER_ALLOCATION), HUNG: (HUNG,)}
"""Each policy (its section in the file, named after the rule it acts on first) and the flags it acts on."""
FINAL = {"cancel": "cancelled", "requeue": "requeued", "report": "would_cancel"}


@dataclass(frozen=True)
class Policy:
    warn_after_minutes: float = 30.0
    cancel_after_minutes: float = 30.0  # after the warning
    action: str = "report"  # "cancel", "requeue" (hung jobs), or "report": a dry run
    cluster: str | None = None  # the Slurm cluster this host's scontrol and scancel reach: only its jobs
    kind: str = IDLE_GPU  # the section: which flags it acts on (KINDS)
    partitions: tuple[str, ...] = ()  # opt-in: only these partitions' jobs (empty: every partition)
    exempt_partitions: tuple[str, ...] = ()
    exempt_accounts: tuple[str, ...] = ()
    exempt_users: tuple[str, ...] = ()
    allow_opt_out: bool = False
    only_while_queued: bool = False  # act only while jobs wait for GPUs in the job's partition (queue_gate)
    scancel: str = "scancel"
    scontrol: str = "scontrol"
    smtp: str = ""  # where warnings are mailed (user@mail_domain); empty: audit only
    sender: str = "jobpulse@localhost"
    mail_domain: str = ""


def load(path: Path, kind: str = IDLE_GPU) -> Policy:
    """The site's policy of one kind (its section of the TOML file), or ValueError naming the bad
    setting."""
    try:
        data = tomllib.loads(path.read_text()).get(kind, {})
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"policy file {path}: {exc}") from None
    unknown = set(data) - set(Policy.__dataclass_fields__) - {"from", "kind"}
    if unknown:
        raise ValueError(f"policy file {path}: unknown settings {', '.join(sorted(unknown))}")
    actions = ("cancel", "requeue", "report") if kind == HUNG else ("cancel", "report")
    if data.get("action", "report") not in actions:
        raise ValueError(f"policy file {path}: action must be {' or '.join(actions)}")
    if data.get("action", "report") != "report" and not data.get("cluster"):
        raise ValueError(f"policy file {path}: {data['action']} needs cluster (the Slurm cluster whose jobs scancel "
                         "reaches)")
    for key in ("warn_after_minutes", "cancel_after_minutes"):
        least = 0 if key == "warn_after_minutes" and kind == HUNG else 1e-9  # a hang: warned at once if asked
        if not least <= float(data.get(key, 1)) <= 7 * 24 * 60:
            raise ValueError(f"policy file {path}: {key} must be minutes, more than 0")
    if not isinstance(data.get("only_while_queued", False), bool):
        raise ValueError(f"policy file {path}: only_while_queued must be true or false")
    lists = {k: tuple(map(str, data[k])) for k in ("partitions", "exempt_partitions", "exempt_accounts",
                                                   "exempt_users") if k in data}
    plain = {k: v for k, v in data.items() if k not in lists and k not in ("from", "kind")}
    return Policy(**{**plain, **lists, "kind": kind, **({"sender": str(data["from"])} if "from" in data else {})})


def load_all(path: Path) -> list[Policy]:
    """Every policy the file writes: `[hung]` where it has one; `[idle_gpu]` where it has one, or
    where it has neither (a file of the idle policy's first release)."""
    try:
        sections = set(tomllib.loads(path.read_text()))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"policy file {path}: {exc}") from None
    kinds = [k for k in KINDS if k in sections] or [IDLE_GPU]
    return [load(path, kind) for kind in kinds]


def exemption(p: Policy, c: dict[str, Any]) -> str | None:
    """Why the policy leaves this job alone, if it does."""
    if p.partitions and c["partition"] not in p.partitions:
        return f"partition {c['partition']} has not opted in"
    if c["partition"] in p.exempt_partitions:
        return f"partition {c['partition']} is exempt"
    if c["account"] in p.exempt_accounts:
        return f"account {c['account']} is exempt"
    if c["user_name"] in p.exempt_users:
        return f"user {c['user_name']} is exempt"
    if p.allow_opt_out and (c["tags"] or {}).get("policy") == "off":
        return "the job opted out (policy=off)"
    return None


def _min(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def _what(p: Policy, c: dict[str, Any], minutes: float) -> str:
    """The flag's cause in words: an idle GPU and for how long, or what broke a hung job."""
    if p.kind != HUNG:
        return f"{c['scope_key'] or 'its GPUs'} idle for {_min(minutes)} min"
    e = c["evidence"] or {}
    broke = (f"node {e.get('node')} stopped reporting" if e.get("broken") == "node" else
             f"{e.get('gpu')} failed (hardware)" if e.get("broken") == "gpu" else
             f"rank {', '.join(map(str, e['ranks']))} on {e.get('gpu')} {e.get('how', 'went idle')}" if e.get("ranks")
             else f"the rank on {e.get('gpu')} {e.get('how', 'went idle')}" if e.get("broken") == "rank"
             else "no rank stands out")
    basis = {"broken part": "a broken part", "timeout": "the stall outlasted the collective timeout"}.get(
        e.get("basis", ""), "")
    acts_on = f"; acting on {basis}: {e['acts_on']}" if basis and e.get("acts_on") else ""
    return (f"job {c['job_id']} hung since {c['started_at']:%H:%M} UTC ({_min(minutes)} min): {broke}; "
            f"{e.get('spinning_gpus', '?')} GPUs waiting{acts_on}")


def decide(p: Policy, c: dict[str, Any], done: dict[str, datetime], now: datetime) -> tuple[str, str] | None:
    """The next action on one flag of a running job: (action, reason), or None (nothing new).
    ``done``: the actions this policy took on the job already, and when: the final action comes
    ``cancel_after_minutes`` after the warning, whenever the cause began."""
    if p.kind == HUNG and (c["evidence"] or {}).get("form") == "weak":
        return None  # a stall with no broken part, not past its timeout: a note, never acted on
    minutes = (now - c["started_at"]).total_seconds() / 60
    what = _what(p, c, minutes)
    if c["hardware"] and p.kind != HUNG:
        return None if "held_hardware" in done else (
            "held_hardware", f"{what}, but the job has a hardware flag: the node's fault, not the job's (drain the "
                             "node instead)")
    why = exemption(p, c)
    if why is not None:
        return None if "exempt" in done else ("exempt", why)
    if minutes < p.warn_after_minutes:
        return None
    if p.only_while_queued:
        if (back := queue_gate.held_back(c)) is not None:
            return None if "unqueued" in done else ("unqueued", f"{what}, but {back}")
        what += f" while {queue_gate.queued(c['queue'])}"
    final = FINAL[p.action]
    verb = {"cancelled": "cancelled", "requeued": "requeued", "would_cancel": "reported"}[final]
    if "warned" not in done:
        return "warned", f"{what}; the job will be {verb} if it is still so {_min(p.cancel_after_minutes)} min from now"
    if final in done or "failed" in done or (now - done["warned"]).total_seconds() / 60 < p.cancel_after_minutes:
        return None
    return final, f"{what} after a warning (site policy)"


def _run(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])}: {(out.stderr or out.stdout).strip()[:300]}")
    return out.stdout


def enforce(conn: psycopg.Connection[Any], policies: Policy | list[Policy],
            now: datetime | None = None) -> list[tuple[str, str, str]]:
    """One pass of each policy over the open flags it acts on, of running jobs; returns the actions
    taken (job, action, reason). A job is acted on once per policy and action, whichever GPU is idle."""
    now = now or datetime.now(UTC)
    taken: list[tuple[str, str, str]] = []
    for p in policies if isinstance(policies, list) else [policies]:
        taken += _enforce(conn, p, now)
    return taken


def _enforce(conn: psycopg.Connection[Any], p: Policy, now: datetime) -> list[tuple[str, str, str]]:
    found = policy_actions.candidates(conn, list(KINDS[p.kind]))
    done = policy_actions.done(conn, sorted({(c["cluster"], c["job_id"]) for c in found}), p.kind)
    taken: list[tuple[str, str, str]] = []
    for c in found:
        if p.cluster is not None and c["cluster"] != p.cluster:
            continue  # another cluster's job: this host's scancel would reach another job of that id
        key = (c["cluster"], c["job_id"])
        if p.only_while_queued:
            c["queue"] = queue_reads.waiting(conn, c["cluster"], c["partition"])
        decision = decide(p, c, done.setdefault(key, {}), now)
        if decision is None:
            continue
        action, reason = decision
        evidence = {"rule": c["rule_id"], "where": c["scope_key"], "since": c["started_at"].isoformat(),
                    "flag_evidence": c["evidence"]}
        try:
            if action in ("cancelled", "requeued"):
                _run([p.scontrol, "update", f"JobId={c['job_id']}", f"AdminComment=jobpulse: {action}, {reason}"[:250]])
                _run([p.scancel, "--", c["job_id"]] if action == "cancelled" else
                     [p.scontrol, "requeue", c["job_id"]])
            if action == "warned" and p.smtp and p.mail_domain and c["user_name"]:
                try:
                    mail.send(p.smtp, p.sender, f"{c['user_name']}@{p.mail_domain}", _subject(p, c),
                              f"Job {c['job_id']} ({c['cluster']}): {reason}.\n" + _hint(p))
                except (OSError, ValueError) as exc:  # the warning stands (audited); the mail is what failed
                    reason += f" (the warning mail failed: {exc})"
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            action, reason = "failed", f"{action}: {exc}"[:500]
            log.warning("policy action failed", cluster=c["cluster"], job=c["job_id"], error=reason)
        policy_actions.record(conn, c["cluster"], c["job_id"], action, c["flag_id"], reason, evidence, p.kind)
        done[key][action] = now
        taken.append((c["job_id"], action, reason))
        log.info("policy", policy=p.kind, cluster=c["cluster"], job=c["job_id"], action=action, reason=reason)
    return taken


def _subject(p: Policy, c: dict[str, Any]) -> str:
    return f"jobpulse: job {c['job_id']} " + ("has hung" if p.kind == HUNG else "holds an idle GPU")


def _hint(p: Policy) -> str:
    if p.kind == HUNG:
        return ("Its GPUs wait in a collective and will until the time limit. Cancel it, look at the place named, "
                "and set TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a collective timeout below the time limit.")
    return "If the job does not need the GPU, cancel it and request fewer GPUs."
