"""Slurm prolog and epilog logic: `python -m jobpulse.agent.slurm prolog|epilog|serve|sync`.

Called by `slurm/prolog.sh` and `slurm/epilog.sh` (as root, on every node of the job, under a
hard timeout) with the settings of `jobpulse.conf` in the environment. Every failure becomes a
log line and exit status 0: monitoring never fails or delays a job beyond its time bound.

The prolog starts the node agent when none runs (the agent's own lock says so, not whether its
socket answers: a busy or flooded socket is "cannot tell", never "not running"; two prologs at once
start one agent), then registers the job with its GPUs and the researcher's `#SBATCH
--comment "jobpulse: ..."` settings, left in the agent's queue first: a prolog cut off at its time
bound, or an agent slow to start, still gets the job monitored. The epilog unregisters it with its exit code; an agent
started here exits by itself once no job is left and its spool is empty.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import hostlist

from jobpulse.agent.control import backlog
from jobpulse.agent.control.listen import agent_running
from jobpulse.agent.slurm import env as slurm_env
from jobpulse.agent.slurm.env import HookError, parse_hooks
from jobpulse.agent.slurm.gres_conf import MIG_MINORS
from jobpulse.schema import control, storable, wire


def expand_hostlist(spec: str) -> list[str]:
    """Slurm's compressed host list (``n[1-3,7],gpu01``, ``rack[1-2]-n[01-02]``) as names, in
    Slurm's order, duplicates kept, as `scontrol show hostnames` gives them (python-hostlist)."""
    try:
        return hostlist.expand_hostlist(spec or "", allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise ValueError(f"bad host list {spec!r}: {exc}") from None


class HookSettings:
    """jobpulse.conf, read from the environment: exported by the hooks' shell wrapper, or loaded by
    systemd (``EnvironmentFile=``) for a permanent agent, so both ways run the same agent.
    ``%n`` in any value stands for the node name (as in slurm.conf)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.node = env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]

        def get(key: str, default: str) -> str:
            return env.get(key, default).replace("%n", self.node)

        self.runtime = Path(get("JOBPULSE_RUNTIME_DIR", "/run/jobpulse"))
        self.spool = Path(get("JOBPULSE_SPOOL_DIR", "/var/spool/jobpulse"))
        self.log_dir = Path(get("JOBPULSE_LOG_DIR", "/var/log/jobpulse"))
        self.collector = get("JOBPULSE_COLLECTOR", "")
        self.token_file = get("JOBPULSE_TOKEN_FILE", "/etc/jobpulse/agent.token")
        self.interval = get("JOBPULSE_INTERVAL", "1")
        self.extra = shlex.split(get("JOBPULSE_AGENT_ARGS", ""))
        self.cluster = env.get("SLURM_CLUSTER_NAME") or get("JOBPULSE_CLUSTER", "cluster")
        # What the prolog maps SLURM_JOB_GPUS through (slurmd's gres.conf; the driver's MIG table).
        self.gres_conf = Path(get("JOBPULSE_GRES_CONF", "/etc/slurm/gres.conf"))
        self.mig_minors = Path(get("JOBPULSE_MIG_MINORS", str(MIG_MINORS)))

    @property
    def control(self) -> Path:
        return self.runtime / "agent.sock"

    def agent_args(self) -> list[str]:
        """`jobpulse-agent run` arguments for these settings."""
        args = ["run", "--node", self.node, "--cluster", self.cluster, "--interval", self.interval,
                "--control-socket", str(self.control), "--events-socket", str(self.runtime / "events.sock"),
                "--spool-dir", str(self.spool), *self.extra]
        if self.collector:
            args += ["--collector", self.collector, "--token-file", self.token_file]
        return args


def _alive(s: HookSettings) -> bool:
    try:
        return control.request(s.control, control.Status(), timeout_s=2).ok
    except (OSError, ValueError):
        return False


def _ask(s: HookSettings, message: control.Register | control.Unregister, wait_s: float = 6.0) -> control.Reply:
    """One request to the running agent, retried while its socket is busy, within ``wait_s``; raises
    at once when no agent holds the lock any more (it exited: the caller may start one)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return control.request(s.control, message, timeout_s=max(0.5, min(3.0, deadline - time.monotonic())))
        except (OSError, ValueError):
            if time.monotonic() > deadline or not agent_running(s.control):
                raise
            time.sleep(0.2)


class AgentStarting(TimeoutError):
    """The agent this hook started is alive but has not answered yet (a slow start under load)."""


def agent_command(args: list[str]) -> list[str]:
    """`jobpulse-agent ARGS` as this interpreter runs it: the hooks start the agent's command line as a
    program, never import it (it sits above them: it runs `slurm-sync`)."""
    return [sys.executable, "-m", "jobpulse.agent.cli", *args]


def ensure_agent(s: HookSettings, wait_s: float = 8.0) -> None:
    """Start the node agent unless one runs (holds its lock); two prologs at once start one agent."""
    if agent_running(s.control):
        return
    s.runtime.mkdir(parents=True, exist_ok=True)
    s.log_dir.mkdir(parents=True, exist_ok=True)
    with open(s.runtime / "agent.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if agent_running(s.control):
            return
        argv = agent_command([*s.agent_args(), "--exit-when-idle"])
        with open(s.log_dir / "agent.log", "ab") as out:
            agent = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                     close_fds=True)
        deadline = time.monotonic() + wait_s
        while not _alive(s):
            if agent.poll() is not None:
                if agent.returncode != 0 and agent_running(s.control):  # one started beside it (systemd): fine
                    return
                raise RuntimeError(f"the agent exited at start (status {agent.returncode}); see {s.log_dir}/agent.log")
            if time.monotonic() > deadline:
                raise AgentStarting(f"it did not answer on {s.control} within {wait_s:.0f} s")
            time.sleep(0.05)


def prolog(env: dict[str, str]) -> str:
    env = {k: storable.text(v) for k, v in env.items()}  # a job name of undecodable bytes is still a name
    s = HookSettings(env)
    job = env["SLURM_JOB_ID"]
    try:
        hooks = parse_hooks(env.get("SLURM_JOB_COMMENT"))
    except HookError as exc:
        hooks = {}
        print(f"jobpulse: job {job}: ignoring the job comment's jobpulse settings: {exc}", file=sys.stderr)
    if hooks.get("off"):
        return f"job {job}: monitoring off (job comment)"
    record: dict[str, Any] = {
        "job_id": job, **slurm_env.job_metadata(env), "nodes": expand_hostlist(env.get("SLURM_NODELIST", "")) or None,
        "gpus": slurm_env.job_gpus(env, s.gres_conf, s.mig_minors), "shared": slurm_env.shares_gpus(env),
        "share": slurm_env.gpu_share(env), "tags": hooks.get("tags", {}),
    }
    if "interval_s" in hooks:
        record["interval_s"] = hooks["interval_s"]
    record, cut = wire.clipped(wire.JobRecord, record)
    if cut:
        print(f"jobpulse: job {job}: clipped {', '.join(cut)}", file=sys.stderr)
    message = control.Register(job=control.job_spec(**record), sent=time.time())
    left = backlog.put(s.control, message)  # first: a prolog killed at its time bound still registers
    try:
        try:
            ensure_agent(s)
            reply = _ask(s, message)
        except OSError:  # the agent exited as it was asked (idle exit): start one, once more
            if agent_running(s.control):
                raise
            ensure_agent(s)
            reply = _ask(s, message)
    except AgentStarting as exc:
        left.let_go()
        return f"job {job}: left for the agent on {s.node}, still starting: {exc}"
    except OSError as exc:
        if not agent_running(s.control):
            left.take_back()  # no agent will read it: this job is not monitored
            raise
        left.let_go()
        return f"job {job}: left for the agent on {s.node}, which did not answer in time: {exc}"
    left.take_back()
    if not reply.ok:
        raise RuntimeError(f"agent refused the registration: {reply.error}")
    return f"job {job}: registered on {s.node} with GPUs {reply.gpus}"


def epilog(env: dict[str, str]) -> str:
    s = HookSettings(env)
    job = env["SLURM_JOB_ID"]
    if not agent_running(s.control):
        for waiting in backlog.waiting(s.control, job):  # no agent read them: the job went unmonitored
            waiting.unlink(missing_ok=True)
        return f"job {job}: no agent on {s.node}; nothing to unregister"
    state, code = slurm_env.end_state(env, slurm_env.oom_killed(job, sluid=env.get("SLURM_JOB_SLUID")))
    message = control.Unregister(job_id=job, state=state, exit_code=code)
    said = state or "ended; slurmctld has the state"
    if backlog.waiting(s.control, job):  # its registration waits: the end must come after it
        backlog.put(s.control, message).let_go()
        return f"job {job}: end ({said}) left for the agent on {s.node}, behind its registration"
    left = backlog.put(s.control, message)
    try:
        reply = _ask(s, message)
    except OSError as exc:
        if not agent_running(s.control):
            left.take_back()
            raise
        left.let_go()
        return f"job {job}: end ({said}) left for the agent on {s.node}, which did not answer in time: {exc}"
    left.take_back()
    return f"job {job}: unregistered ({said}, exit code {code}): {'ok' if reply.ok else reply.error}"


def serve(env: dict[str, str]) -> NoReturn:
    """The permanent agent (systemd): this process becomes the agent the prolog would start, in the
    foreground (the unit's PID), never exiting by itself."""
    s = HookSettings(env)
    s.spool.mkdir(parents=True, exist_ok=True)
    s.runtime.mkdir(parents=True, exist_ok=True)
    s.runtime.chmod(0o755)  # every job's processes reach the events socket in it, whatever the unit's umask
    _become(agent_command(s.agent_args()))


def sync(env: dict[str, str]) -> NoReturn:
    """`jobpulse-agent slurm-sync` with the same settings (systemd, once per cluster)."""
    s = HookSettings(env)
    _become(agent_command(["slurm-sync", "--collector", s.collector, "--token-file", s.token_file,
                           "--cluster", s.cluster, "--spool-dir", str(s.spool / "slurm-sync")]))


def _become(argv: list[str]) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def main(argv: list[str]) -> int:
    """Prolog and epilog: always 0, a broken monitor must never fail a job; the outcome is one log
    line. ``serve`` (the agent) and ``sync`` (slurm-sync) run for systemd and exit with their status."""
    started = time.monotonic()
    what = argv[1] if len(argv) > 1 else ""
    if what in ("serve", "sync"):
        return (serve if what == "serve" else sync)(dict(os.environ))
    try:
        if what == "prolog":
            line = prolog(dict(os.environ))
        elif what == "epilog":
            line = epilog(dict(os.environ))
        else:
            line = f"usage: python -m jobpulse.agent.slurm prolog|epilog|serve|sync (got {what!r})"
    except Exception as exc:  # noqa: BLE001 - log and let the job run
        line = f"{what} failed for job {os.environ.get('SLURM_JOB_ID')}: {type(exc).__name__}: {exc}"
    print(f"jobpulse {what}: {line} ({(time.monotonic() - started) * 1000:.0f} ms)", file=sys.stderr)
    return 0

