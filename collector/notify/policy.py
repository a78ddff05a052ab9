"""The idle-GPU policy (off unless the site writes one): a GPU idle for ``warn_after_minutes`` gets
its job's owner a warning; still idle ``cancel_after_minutes`` after the warning, the job of the
site's ``cluster`` is cancelled (its
reason in the job's AdminComment, which `scontrol show job` and `sacct -o AdminComment` show), or,
in a dry run, the cancellation it would have made is recorded. Exempt by partition, account and
user, or by the job's own `policy=off` where the site allows it; never acted on when the job has an
open hardware flag (the idleness is the node's fault: drain it instead). Every decision goes into
`jobpulse.policy_actions` with its evidence, once per job and action.
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

from jobpulse.collector.notify import mail
from jobpulse.collector.store import policy_actions

log = structlog.get_logger("jobpulse.policy")


@dataclass(frozen=True)
class Policy:
    warn_after_minutes: float = 30.0
    cancel_after_minutes: float = 30.0  # after the warning
    action: str = "report"  # "cancel", or "report": a dry run
    cluster: str | None = None  # the Slurm cluster this host's scontrol and scancel reach: only its jobs
    exempt_partitions: tuple[str, ...] = ()
    exempt_accounts: tuple[str, ...] = ()
    exempt_users: tuple[str, ...] = ()
    allow_opt_out: bool = False
    scancel: str = "scancel"
    scontrol: str = "scontrol"
    smtp: str = ""  # where warnings are mailed (user@mail_domain); empty: audit only
    sender: str = "jobpulse@localhost"
    mail_domain: str = ""


def load(path: Path) -> Policy:
    """The site's policy (`[idle_gpu]` of the TOML file), or ValueError naming the bad setting."""
    try:
        data = tomllib.loads(path.read_text()).get("idle_gpu", {})
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"policy file {path}: {exc}") from None
    unknown = set(data) - set(Policy.__dataclass_fields__) - {"from"}
    if unknown:
        raise ValueError(f"policy file {path}: unknown settings {', '.join(sorted(unknown))}")
    if data.get("action", "report") not in ("cancel", "report"):
        raise ValueError(f"policy file {path}: action must be cancel or report")
    if data.get("action") == "cancel" and not data.get("cluster"):
        raise ValueError(f"policy file {path}: cancel needs cluster (the Slurm cluster whose jobs scancel reaches)")
    for key in ("warn_after_minutes", "cancel_after_minutes"):
        if not 0 < float(data.get(key, 1)) <= 7 * 24 * 60:
            raise ValueError(f"policy file {path}: {key} must be minutes, more than 0")
    lists = {k: tuple(map(str, data[k])) for k in ("exempt_partitions", "exempt_accounts", "exempt_users") if k in data}
    plain = {k: v for k, v in data.items() if k not in lists and k != "from"}
    return Policy(**{**plain, **lists, **({"sender": str(data["from"])} if "from" in data else {})})


def exemption(p: Policy, c: dict[str, Any]) -> str | None:
    """Why the policy leaves this job alone, if it does."""
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


def decide(p: Policy, c: dict[str, Any], done: dict[str, datetime], now: datetime) -> tuple[str, str] | None:
    """The next action on one idle flag of a running job: (action, reason), or None (nothing new).
    ``done``: the actions taken on the job already, and when: a cancellation comes
    ``cancel_after_minutes`` after the warning, whenever the idleness began."""
    idle_min = (now - c["started_at"]).total_seconds() / 60
    where = c["scope_key"] or "its GPUs"
    if c["hardware"]:
        return None if "held_hardware" in done else (
            "held_hardware", f"{where} idle {_min(idle_min)} min, but the job has a hardware flag: the node's fault, "
                             "not the job's (drain the node instead)")
    why = exemption(p, c)
    if why is not None:
        return None if "exempt" in done else ("exempt", why)
    if idle_min < p.warn_after_minutes:
        return None
    if "warned" not in done:
        return "warned", (f"{where} idle for {_min(idle_min)} min; the job will be "
                          + ("cancelled" if p.action == "cancel" else "reported")
                          + f" if it is still idle {_min(p.cancel_after_minutes)} min from now")
    final = "cancelled" if p.action == "cancel" else "would_cancel"
    if final in done or "failed" in done or (now - done["warned"]).total_seconds() / 60 < p.cancel_after_minutes:
        return None
    return final, f"{where} idle for {_min(idle_min)} min after a warning (site policy)"


def _run(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])}: {(out.stderr or out.stdout).strip()[:300]}")
    return out.stdout


def enforce(conn: psycopg.Connection[Any], p: Policy, now: datetime | None = None) -> list[tuple[str, str, str]]:
    """One pass over the open idle flags of running jobs; returns the actions taken (job, action,
    reason). A job is acted on once per action, whichever of its GPUs is idle."""
    now = now or datetime.now(UTC)
    found = policy_actions.candidates(conn)
    done = policy_actions.done(conn, sorted({(c["cluster"], c["job_id"]) for c in found}))
    taken: list[tuple[str, str, str]] = []
    for c in found:
        if p.cluster is not None and c["cluster"] != p.cluster:
            continue  # another cluster's job: this host's scancel would reach another job of that id
        key = (c["cluster"], c["job_id"])
        decision = decide(p, c, done.setdefault(key, {}), now)
        if decision is None:
            continue
        action, reason = decision
        evidence = {"rule": c["rule_id"], "where": c["scope_key"], "idle_since": c["started_at"].isoformat(),
                    "flag_evidence": c["evidence"]}
        try:
            if action == "cancelled":
                _run([p.scontrol, "update", f"JobId={c['job_id']}", f"AdminComment=jobpulse: cancelled, {reason}"[:250]])
                _run([p.scancel, "--", c["job_id"]])
            if action == "warned" and p.smtp and p.mail_domain and c["user_name"]:
                try:
                    mail.send(p.smtp, p.sender, f"{c['user_name']}@{p.mail_domain}",
                              f"jobpulse: job {c['job_id']} holds an idle GPU", f"Job {c['job_id']} "
                              f"({c['cluster']}): {reason}.\nIf the job does not need the GPU, cancel it and request "
                              "fewer GPUs.")
                except (OSError, ValueError) as exc:  # the warning stands (audited); the mail is what failed
                    reason += f" (the warning mail failed: {exc})"
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            action, reason = "failed", f"{action}: {exc}"[:500]
            log.warning("policy action failed", cluster=c["cluster"], job=c["job_id"], error=reason)
        policy_actions.record(conn, c["cluster"], c["job_id"], action, c["flag_id"], reason, evidence)
        done[key][action] = now
        taken.append((c["job_id"], action, reason))
        log.info("policy", cluster=c["cluster"], job=c["job_id"], action=action, reason=reason)
    return taken

