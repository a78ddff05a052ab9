"""`jobpulse-agent`: the node agent's command line (run, probe, register, unregister, status)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from datetime import UTC, datetime
from importlib.metadata import version as dist_version
from pathlib import Path
from urllib.parse import urlsplit

from jobpulse.schema.options import listen_address
from jobpulse.schema.semantics import check_interval


def _default_runtime_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/run/jobpulse")
    return Path(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/jobpulse-{os.geteuid()}")


def _events_socket() -> Path:
    return Path(os.environ.get("JOBPULSE_EVENTS_SOCKET") or _default_runtime_dir() / "events.sock")


def _default_spool_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/spool/jobpulse")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jobpulse" / "spool"


def _collector_url(value: str) -> str:
    """http(s)://HOST[:PORT][/PATH]: an empty value (an unset variable in a unit file) is an error,
    never a silent "no collector"."""
    url = urlsplit(value.strip())
    if url.scheme not in ("http", "https") or not url.hostname:
        raise argparse.ArgumentTypeError(f"expected http(s)://HOST[:PORT], got {value!r}")
    try:
        url.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc}") from None
    return value.strip()


def _interval(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    try:
        return check_interval(v)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jobpulse-agent",
                                description="jobpulse node agent: samples GPUs and ships them to the collector.")
    p.add_argument("--version", action="version", version=f"jobpulse-agent {dist_version('jobpulse')}")
    sub = p.add_subparsers(dest="command", required=True)
    sock = argparse.ArgumentParser(add_help=False)
    sock.add_argument("--control-socket", type=Path, default=_default_runtime_dir() / "agent.sock")

    run = sub.add_parser("run", parents=[sock], help="sample, attribute and ship (one agent per node)")
    run.add_argument("--collector", type=_collector_url, metavar="URL",
                     help="collector base URL; without it only /metrics is served")
    run.add_argument("--token-file", type=Path, help="file whose first line is this agent's bearer token")
    run.add_argument("--interval", type=_interval, default=1.0, metavar="SECONDS", help="sampling interval (0.1-3600)")
    run.add_argument("--flush-interval", type=_interval, default=1.0, metavar="SECONDS")
    run.add_argument("--node", default=socket.gethostname().split(".")[0], help="node name (short hostname)")
    run.add_argument("--cluster", default=os.environ.get("SLURM_CLUSTER_NAME", "cluster"))
    run.add_argument("--spool-dir", type=Path, default=_default_spool_dir())
    run.add_argument("--spool-max-mb", type=float, default=256, help="spool bound; the oldest batches go first")
    run.add_argument("--prometheus-listen", type=listen_address, metavar="HOST:PORT",
                     help="serve /metrics with dcgm-exporter's names (suggested port 9470; dcgm-exporter's is 9400)")
    run.add_argument("--dcgm-counters", type=Path, metavar="FILE",
                     help="a dcgm-exporter counters CSV (DCGM_FI_NAME, gauge|counter|label, help): what /metrics "
                          "shows (default: every metric the agent can serve)")
    run.add_argument("--hostname-label", choices=["Hostname", "hostname", "none"], default="Hostname",
                     help="the host label's name: dcgm-exporter before 3.3 (Hostname), since (hostname), or none")
    run.add_argument("--events-socket", type=Path, default=_events_socket(),
                     help="application events socket (the task prolog exports it as JOBPULSE_EVENTS_SOCKET)")
    run.add_argument("--event-rate", type=float, default=200.0, help="events per second per process")
    run.add_argument("--event-burst", type=float, default=2000.0, help="burst size per process")
    run.add_argument("--no-capture", dest="capture", action="store_false",
                     help="never sample a job's Python stacks when the collector asks (docs/captures.md)")
    run.add_argument("--sysfs-root", type=Path, default=Path("/sys"), metavar="DIR",
                     help="where sysfs is: the RDMA ports under class/infiniband (docs/fabric.md)")
    run.add_argument("--no-fabric", dest="fabric", action="store_false",
                     help="do not sample the node's InfiniBand/RoCE ports")
    run.add_argument("--exit-when-idle", action="store_true",
                     help="exit once no job is registered and the spool is empty (agents the prolog starts)")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    sub.add_parser("probe", help="print what NVML shows on this node: GPUs, supported fields, topology")

    sync = sub.add_parser("slurm-sync", help="once per cluster: ship what only slurmctld knows (job name, limits, "
                                             "final state) from squeue to the collector")
    sync.add_argument("--collector", type=_collector_url, metavar="URL", required=True)
    sync.add_argument("--token-file", type=Path, required=True)
    sync.add_argument("--interval", type=_interval, default=30.0, metavar="SECONDS",
                      help="between squeue calls (default 30; keep it well below Slurm's MinJobAge)")
    sync.add_argument("--node", default=socket.gethostname().split(".")[0], help="this host's name, as its token allows")
    sync.add_argument("--cluster", default=os.environ.get("SLURM_CLUSTER_NAME", "cluster"))
    sync.add_argument("--spool-dir", type=Path, default=_default_spool_dir().with_name("slurm-sync"))
    sync.add_argument("--once", action="store_true", help="one poll and delivery, then exit")
    sync.add_argument("--openmetrics", type=_collector_url, metavar="URL", default=None,
                      help="slurmctld's OpenMetrics partitions endpoint (Slurm 25.11+), e.g. "
                           "http://ctld:6817/metrics/partitions (default: found from `scontrol show config` where "
                           "MetricsType=metrics/openmetrics; else the queue is counted from squeue)")

    reg = sub.add_parser("register", parents=[sock], help="register a job with the running agent")
    reg.add_argument("job_id")
    reg.add_argument("--uid", type=int)
    reg.add_argument("--user")
    reg.add_argument("--partition")
    reg.add_argument("--gpus", default="", help="Slurm GPU indices, UUIDs or PCI bus ids, comma separated")
    reg.add_argument("--nodes", default="", help="comma-separated node names of the job")
    reg.add_argument("--shared", action="store_true", help="the job shares its GPUs with other jobs (shards, MPS)")
    unreg = sub.add_parser("unregister", parents=[sock], help="unregister a job (epilog)")
    unreg.add_argument("job_id")
    unreg.add_argument("--state", default="COMPLETED")
    unreg.add_argument("--exit-code", type=int)
    sub.add_parser("status", parents=[sock], help="what the running agent serves")
    val = sub.add_parser("validate", help="check this node's GPUs, driver, links and health; exit 1 on failure")
    val.add_argument("--expect", type=Path, metavar="FILE", help="TOML of what this node class should look like")
    val.add_argument("--record", type=Path, metavar="FILE", help="write an expect file from this (good) node")
    val.add_argument("--format", choices=["text", "json"], default="text")
    val.add_argument("--sysfs-root", type=Path, default=Path("/sys"), metavar="DIR",
                     help="where sysfs is: the RDMA ports checked under class/infiniband")
    val.add_argument("--collector", type=_collector_url, metavar="URL",
                     help="also store the results (jobpulse validate report)")
    val.add_argument("--token-file", type=Path)
    val.add_argument("--node", default=os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0])
    val.add_argument("--cluster", default=os.environ.get("SLURM_CLUSTER_NAME", "cluster"))
    emit = sub.add_parser("emit", help="send one application event from a shell script")
    emit.add_argument("message")
    emit.add_argument("--level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    emit.add_argument("--phase-start", metavar="NAME", help="mark the start of a phase instead of a log line")
    emit.add_argument("--phase-end", metavar="NAME", help="mark the end of a phase")
    emit.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE")
    return p


def _run(args: argparse.Namespace) -> int:
    from jobpulse.agent.run import Agent, AgentConfig
    from jobpulse.schema import logs

    logs.configure(args.log_level)
    cfg = AgentConfig(node=args.node, cluster=args.cluster, control_socket=args.control_socket,
                      spool_dir=args.spool_dir, collector_url=args.collector, token_file=args.token_file,
                      interval_s=args.interval, flush_s=args.flush_interval,
                      spool_max_bytes=int(args.spool_max_mb * 1024 * 1024), prometheus_listen=args.prometheus_listen,
                      dcgm_counters=args.dcgm_counters, hostname_label=args.hostname_label,
                      events_socket=args.events_socket, event_rate=args.event_rate, event_burst=args.event_burst,
                      exit_when_idle=args.exit_when_idle, capture=args.capture,
                      sysfs_root=args.sysfs_root if args.fabric else None)
    Agent(cfg).run()
    return 0


def _slurm_sync(args: argparse.Namespace) -> int:
    from jobpulse.agent.slurm.sync import SlurmSync
    from jobpulse.schema import logs

    logs.configure("info")
    SlurmSync(args.node, args.cluster, args.collector, args.token_file, args.spool_dir,
              metrics_url=args.openmetrics).run(args.interval, args.once)
    return 0


def _probe() -> int:
    from jobpulse.agent.nvml import Nvml
    from jobpulse.agent.sources.gpu import GpuSampler
    from jobpulse.agent.sources.topology import matrix, snapshot
    from jobpulse.schema import logs

    logs.configure("warning")
    nvml = Nvml()
    print(f"driver {nvml.driver_version()}  CUDA {nvml.cuda_version()}  GPUs {len(nvml.gpus)}")
    sampler = GpuSampler(nvml, lambda _: None)
    sampler.sample(datetime.now(UTC))
    for s in sampler.sample(datetime.now(UTC)):  # second pass: rates need two samples
        g = next(g for g in nvml.gpus if g.uuid == s.gpu_uuid)
        print(f"\nGPU{g.index} {g.name}  {g.uuid}  bus {g.pci_bus_id}  /dev/nvidia{g.minor}")
        values = {f: getattr(s, f) for f in s.__struct_fields__ if f not in ("ts", "gpu_uuid", "gpu_index", "job_id")}
        print("  " + "  ".join(f"{k}={v}" for k, v in values.items() if v is not None))
        missing = [k for k, v in values.items() if v is None]
        if missing:
            print(f"  unsupported: {' '.join(missing)}")
    print("\n" + matrix(snapshot(nvml, datetime.now(UTC))))
    nvml.shutdown()
    return 0


def _validate(args: argparse.Namespace) -> int:
    import tempfile
    from dataclasses import asdict

    from jobpulse.agent import node_checks
    from jobpulse.agent.nvml import Nvml, NvmlUnavailable
    from jobpulse.agent.shipping.batch import Batcher
    from jobpulse.agent.shipping.send import Shipper, compress
    from jobpulse.agent.shipping.spool import Spool
    from jobpulse.schema import logs

    logs.configure("warning")
    expect = node_checks.load_expect(args.expect) if args.expect else {}
    try:
        nvml = Nvml()
    except NvmlUnavailable as exc:
        print(f"jobpulse-agent validate: {exc}", file=sys.stderr)
        return 2
    seen = node_checks.observe(nvml, args.sysfs_root)
    nvml.shutdown()
    if args.record:
        args.record.write_text(node_checks.record(seen))
        print(f"wrote {args.record}")
        return 0
    results = node_checks.run_checks(seen, expect)
    failed = any(r.status == "fail" for r in results)
    if args.format == "json":
        print(json.dumps({"node": args.node, "ok": not failed, "checks": [asdict(r) for r in results]}, indent=2))
    else:
        for r in results:
            print(r.line())
        counts = {s: sum(r.status == s for r in results) for s in ("pass", "warn", "fail")}
        print(f"{args.node}: {counts['pass']} passed, {counts['warn']} warned, {counts['fail']} failed")
    if args.collector:
        if args.token_file is None:
            print("jobpulse-agent validate: --token-file is required with --collector", file=sys.stderr)
            return 2
        batcher = Batcher(args.node, args.cluster)
        batcher.add("validations", node_checks.as_records(results, seen["ts"]))
        ready = batcher.take()
        with tempfile.TemporaryDirectory() as tmp:
            spool = Spool(Path(tmp), 64 * 1024 * 1024)
            if ready:
                spool.put(*compress(ready))
            if not Shipper(args.collector, args.token_file, spool, lambda _: None).drain():
                print("jobpulse-agent validate: results not delivered to the collector", file=sys.stderr)
                return 3
    return 1 if failed else 0


def _control(args: argparse.Namespace) -> int:
    import msgspec

    from jobpulse.schema import control
    from jobpulse.schema.control import request

    msg: control.Register | control.Unregister | control.Status
    try:
        if args.command == "register":
            msg = control.Register(job=control.job_spec(
                job_id=args.job_id, uid=args.uid, user_name=args.user, partition=args.partition,
                gpus=[g for g in args.gpus.split(",") if g], nodes=[n for n in args.nodes.split(",") if n] or None,
                shared=args.shared))
        elif args.command == "unregister":
            msg = control.Unregister(job_id=args.job_id, state=args.state, exit_code=args.exit_code)
        else:
            msg = control.Status()
    except msgspec.ValidationError as exc:
        print(f"jobpulse-agent {args.command}: {exc}", file=sys.stderr)
        return 2
    try:
        reply = request(args.control_socket, msg)
    except (OSError, ValueError) as exc:
        print(f"jobpulse-agent {args.command}: {exc}", file=sys.stderr)
        return 1
    print(msgspec.json.encode(reply).decode())
    return 0 if reply.ok else 1


def _emit(args: argparse.Namespace) -> int:
    from jobpulse.agent import client

    attrs = {}
    for item in args.attr:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"jobpulse-agent: --attr must be KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        attrs[key] = value
    if args.phase_start:
        client.phase_start(args.phase_start, note=args.message, **attrs)
    elif args.phase_end:
        client.phase_end(args.phase_end, note=args.message, **attrs)
    else:
        client.event(args.message, level=args.level, **attrs)
    if client.dropped():
        print("jobpulse-agent: no agent is listening; event dropped", file=sys.stderr)
    return 0  # a shell script must never fail because monitoring is away


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "emit":
        return _emit(args)
    if args.command in ("register", "unregister", "status"):
        return _control(args)  # hooks and admins call these often: no NVML or logging stack to load
    from jobpulse.agent.nvml import NvmlUnavailable

    try:
        if args.command == "run":
            return _run(args)
        if args.command == "probe":
            return _probe()
        if args.command == "slurm-sync":
            return _slurm_sync(args)
        return _validate(args)
    except NvmlUnavailable as exc:
        print(f"jobpulse-agent: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"jobpulse-agent: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
