"""`jobpulse`: the admin's and researcher's command line (database, collector service)."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import datetime
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

from jobpulse.collector.settings import CapturePolicy, CollectorSettings, default
from jobpulse.schema.options import listen_address

S, C = CollectorSettings, CapturePolicy  # every default below is theirs, written once


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def _count(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected 0 or a positive integer, got {value!r}")
    return int(value)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jobpulse", description="Live GPU job monitoring for Slurm clusters.")
    p.add_argument("--version", action="version", version=f"jobpulse {dist_version('jobpulse')}")
    sub = p.add_subparsers(dest="command", required=True)

    def dsn_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--dsn", default=os.environ.get("JOBPULSE_DSN"),
                        help="PostgreSQL connection string (default: $JOBPULSE_DSN)")

    db = sub.add_parser("db", help="database schema and partitions").add_subparsers(dest="db_command", required=True)
    up = db.add_parser("upgrade", help="apply migrations (repeatable) and create partitions ahead")
    dsn_arg(up)
    up.add_argument("--partitions-ahead", type=_positive, default=default(S, "partitions_ahead_days"), metavar="DAYS")
    up.add_argument("--citus", action="store_true",
                    help="on a Citus coordinator: distribute the tables over the workers (see docs/scaling.md)")
    up.add_argument("--shard-count", type=_positive, metavar="N",
                    help="with --citus: shards per distributed table group (default: 4 per active worker;"
                         " docs/scaling.md)")
    mt = db.add_parser("maintain", help="create partitions ahead and drop those past retention")
    dsn_arg(mt)
    mt.add_argument("--partitions-ahead", type=_positive, default=default(S, "partitions_ahead_days"), metavar="DAYS")
    mt.add_argument("--retention-days", type=_positive, default=default(S, "retention_days"), metavar="DAYS",
                    help=f"events, health events and the ingest ledger (default {default(S, 'retention_days')})")
    mt.add_argument("--compact-days", type=_positive, default=180, metavar="DAYS",
                    help="samples, raw and compact (default 180)")
    mt.add_argument("--rollup-days", type=_positive, default=730, metavar="DAYS", help="roll-ups (default 730)")
    cp = db.add_parser("compact", help="pack samples older than the hot window into the compact tier (resumable)")
    dsn_arg(cp)
    cp.add_argument("--raw-hours", type=_positive, default=48, metavar="HOURS", help="hot window kept raw (default 48)")
    cp.add_argument("--duty", type=float, default=0.5, metavar="SHARE",
                    help="share of the time spent working, sleeping in between (default 0.5)")
    cp.add_argument("--max-minutes", type=_positive, metavar="MINUTES", help="stop after this long (resume later)")
    dsn_arg(db.add_parser("pyramid", help="bring the cluster dashboards' per-node and per-job sums up to now "
                                          "(the leader does it every minute; resumable)"))
    dsn_arg(db.add_parser("stats", help="rows, bytes and bytes per sample of each storage tier and table"))

    val = sub.add_parser("validate", help="node validation results").add_subparsers(dest="validate_command",
                                                                                   required=True)
    rep = val.add_parser("report", help="nodes that fail checks or deviate from the majority (exit 1 if any)")
    dsn_arg(rep)
    rep.add_argument("--format", choices=["text", "json"], default="text")

    rep = sub.add_parser("report", help="one job at a glance: GPUs, ranks, phases, flags, GPU-hours")
    rep.add_argument("job_id")
    rep.add_argument("--cluster")
    rep.add_argument("--format", choices=["text", "json", "html"], default="text")
    rep.add_argument("--output", "-o", type=Path, metavar="FILE", help="write the report here instead of stdout")
    dsn_arg(rep)

    summ = sub.add_parser("summary", help="an ended job's summary: GPU-hours held, used and wasted, flags, "
                                          "#SBATCH lines for the next run (what the job-end mail carries)")
    summ.add_argument("job_id")
    summ.add_argument("--cluster")
    summ.add_argument("--format", choices=["text", "json"], default="text")
    dsn_arg(summ)

    dig = sub.add_parser("digest", help="jobs that ended in a period, per user, account or partition: GPU-hours "
                                        "used and wasted by cause, the worst jobs, the trend; hardware per node")
    dig.add_argument("--by", choices=["user", "account", "partition"], default="user")
    dig.add_argument("--since", type=_period, default="7d", metavar="PERIOD", help="e.g. 7d, 24h (default 7d)")
    dig.add_argument("--cluster")
    dig.add_argument("--format", choices=["text", "json"], default="text")
    dig.add_argument("--mail", action="store_true",
                     help="mail each user their part (opted in, or over the waste threshold) and the admins the "
                          "hardware part, as the [digest] section of --notify says")
    dig.add_argument("--notify", type=Path, metavar="FILE", help="the collector's notify file (its [digest] section)")
    dsn_arg(dig)

    rules = sub.add_parser("rules", help="waste and hardware rules").add_subparsers(dest="rules_command", required=True)
    ev = rules.add_parser("evaluate", help="run one rule cycle now, and summarize the jobs it judged final "
                                           "(the collector does both continuously)")
    dsn_arg(ev)
    ev.add_argument("--rules", type=Path, metavar="FILE", help="thresholds TOML (default: the shipped defaults)")
    bt = rules.add_parser("backtest", help="replay the rules over stored history at a simulated clock and print the "
                                           "flags they would have raised next to those stored")
    dsn_arg(bt)
    bt.add_argument("--from", dest="start", type=_time, required=True, metavar="TIME", help="RFC 3339 time with offset")
    bt.add_argument("--to", dest="end", type=_time, required=True, metavar="TIME", help="RFC 3339 time with offset")
    bt.add_argument("--rules", type=Path, metavar="FILE", help="thresholds TOML to try (default: the shipped defaults)")
    bt.add_argument("--cluster", help="only this cluster's jobs")
    bt.add_argument("--job", help="only this job")
    bt.add_argument("--step", type=_positive, default=30.0, metavar="SECONDS",
                    help="time between simulated cycles (default 30, the collector's rules interval)")
    bt.add_argument("--format", choices=["text", "json"], default="text")

    imp = sub.add_parser("import", help="store GPU recordings (nvidia-smi's table, -q, -x, --query-gpu CSV, dmon, "
                                        "dcgmi dmon, DCGM, gpustat, nvitop, W&B, a table of one's own) as a job, "
                                        "judged by the rules")
    dsn_arg(imp)
    imp.add_argument("files", nargs="+", type=Path, metavar="FILE",
                     help="the recording (gzip is read as it is; - for stdin); several: one job, a node each")
    imp.add_argument("--format", dest="fmt", choices=list(_import_formats()),
                     help="default: recognised from the first lines")
    imp.add_argument("--columns", type=lambda v: [c.strip() for c in v.split(",")], metavar="A,B,...",
                     help="the columns of a table without a header (names as nvidia-smi, DCGM or W&B write them)")
    imp.add_argument("--dry-run", action="store_true",
                     help="say what was understood (format, columns, GPUs, times, skipped lines), store nothing")
    imp.add_argument("--job", dest="job_id", type=_job_id, metavar="ID",
                     help="job id to store it under (default: a number from the file's content)")
    imp.add_argument("--node", type=_name, metavar="NAME", help="node it ran on (default: from the file name)")
    imp.add_argument("--cluster", type=_name, default="imported", metavar="NAME", help="(default: imported)")
    imp.add_argument("--user", metavar="NAME")
    imp.add_argument("--partition", metavar="NAME", help="picks the partition's rule thresholds")
    imp.add_argument("--gpus", type=_gpus, metavar="N|0,1,...",
                     help="a recording that names no GPUs: its rows cycle through N GPUs; one that does: the GPUs "
                          "the job held (default: all)")
    imp.add_argument("--model", metavar="NAME", help="GPU model, where the recording does not name it")
    imp.add_argument("--tz", type=_zone, metavar="ZONE", help="time zone of naive timestamps (default: UTC)")
    imp.add_argument("--time-format", type=_time_format, metavar="FORM",
                     help="the time column's strftime form, e.g. '%%d-%%m-%%Y %%H:%%M:%%S' (default: read from its "
                          "values; a day-first or month-first date is told apart by a day above 12)")
    imp.add_argument("--start", type=_time, metavar="TIME",
                     help="when the first sample was taken (RFC 3339): moves the recording there")
    imp.add_argument("--recent", action="store_true",
                     help="move the recording so that it ends now (older than the retention, or to watch it live)")
    imp.add_argument("--interval", type=float, metavar="SECONDS",
                     help="seconds between samples of a recording without times (dmon, dcgmi: default 1)")
    imp.add_argument("--retention-days", type=_positive, default=30, metavar="DAYS",
                     help="the collector's retention: older recordings must be moved (default 30)")
    imp.add_argument("--rules", type=Path, metavar="FILE", help="thresholds TOML to judge it with (default: shipped)")
    imp.add_argument("--max-mib", type=_positive, default=4096, metavar="MIB",
                     help="the most read of one recording, after gunzip (default 4096): an endless input stops")
    imp.add_argument("--wait", type=_positive, default=600, metavar="SECONDS",
                     help="how long a pipe or FIFO may take to end (default 600)")

    tr = sub.add_parser("trace", help="download a flag's profiler trace: yours (a MUNGE credential proves who you "
                                      "are) or, with an admin's token, any (docs/captures.md)")
    tr.add_argument("capture", type=_positive, metavar="CAPTURE_ID", help="as `jobpulse report` names it")
    tr.add_argument("--collector", required=True, metavar="URL", help="the collector, e.g. http://collector:8080")
    tr.add_argument("-o", "--output", type=Path, metavar="FILE", help="default: job-JOB-capture-ID.json.gz here")
    tr.add_argument("--token-file", type=Path, metavar="FILE", help="an admin's bearer token instead of MUNGE")
    tr.add_argument("--munge-socket", type=Path, metavar="PATH", help="munged's socket (default: munge's own)")

    watch = sub.add_parser("watch", help="watch one job without an admin: a private database, collector and agent "
                                          "around COMMAND; its summary at the end (jobpulse watch -- COMMAND...)")
    watch.add_argument("--dir", type=Path, metavar="DIR",
                       help="where the database, logs and report go (default: ./jobpulse-watch-JOBID)")
    watch.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="sampling interval (default 1)")
    watch.add_argument("--rules", type=Path, metavar="FILE", help="thresholds TOML (default: the shipped defaults)")
    watch.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="the command to run, after --")

    demo = sub.add_parser("demo", help="the whole system on this machine: embedded PostgreSQL, simulated GPUs")
    demo.add_argument("--duration", type=_positive, default=90, metavar="SECONDS", help="how long the jobs run")
    demo.add_argument("--live", action="store_true", help="keep the jobs running until Ctrl-C")
    demo.add_argument("--keep", action="store_true", help="leave PostgreSQL up after the summary (for Grafana)")

    graf = sub.add_parser("grafana", help="dashboards, datasource and alert rules for Grafana").add_subparsers(
        dest="grafana_command", required=True)
    build = graf.add_parser("build", help="write dashboards/*.json and deploy/grafana/provisioning/ from the code")
    build.add_argument("--out", type=Path, default=Path("."), metavar="DIR",
                       help="repository root to write under (default: the current folder)")
    pub = graf.add_parser("publish", help="create or update folder, datasource, dashboards and alert rules via the API")
    pub.add_argument("--url", required=True, help="Grafana base URL, e.g. https://grafana.example.org")
    pub.add_argument("--token", default=os.environ.get("GRAFANA_TOKEN"),
                     help="service-account token (default: $GRAFANA_TOKEN)")
    pub.add_argument("--pg-host", metavar="HOST:PORT", help="PostgreSQL as Grafana reaches it (creates the datasource)")
    pub.add_argument("--pg-database", default="jobpulse")
    pub.add_argument("--pg-user", default="jobpulse_grafana", help="a login role in jobpulse_reader")
    pub.add_argument("--pg-password-file", type=Path, metavar="FILE")

    dep = sub.add_parser("deploy", help="write the shipped Slurm hooks, systemd units or Grafana provisioning "
                                        "into DIR (never replacing an edited file without --force)")
    dep.add_argument("target", choices=["slurm", "systemd", "grafana"])
    dep.add_argument("dir", type=Path, metavar="DIR")
    dep.add_argument("--force", action="store_true", help="replace files changed since jobpulse wrote them")
    dep.add_argument("--settings", type=Path, default=Path("/etc/jobpulse/jobpulse.conf"), metavar="FILE",
                     help="systemd: the settings file the units read, the Slurm hooks' jobpulse.conf "
                          "(default: /etc/jobpulse/jobpulse.conf)")

    col = sub.add_parser("collector", help="the ingest service").add_subparsers(dest="collector_command",
                                                                                required=True)
    serve = col.add_parser("serve", help="run the collector (HTTP, ASGI)")
    dsn_arg(serve)
    serve.add_argument("--listen", type=listen_address, default=("127.0.0.1", 8470), metavar="HOST:PORT")
    serve.add_argument("--request-timeout", type=float, default=default(S, "request_timeout_s"), metavar="SECONDS",
                       help="a request's headers, and its body, must arrive within this time "
                            f"(default {default(S, 'request_timeout_s'):g})")
    serve.add_argument("--token-file", type=Path, required=True,
                       help="file with agent bearer tokens, one per line")
    serve.add_argument("--max-body-mb", type=_positive, default=default(S, "max_body_bytes") // 2**20,
                       help=f"largest accepted batch (after gunzip; default {default(S, 'max_body_bytes') >> 20})")
    serve.add_argument("--retention-days", type=_positive, default=default(S, "retention_days"))
    serve.add_argument("--partitions-ahead", type=_positive, default=default(S, "partitions_ahead_days"), metavar="DAYS")
    serve.add_argument("--max-clock-skew", type=_positive, default=int(default(S, "max_clock_skew_s")),
                       metavar="SECONDS", help="refuse timestamps further than this in the future")
    serve.add_argument("--rules", type=Path, metavar="FILE", help="rule thresholds TOML (default: shipped defaults)")
    serve.add_argument("--rules-interval", type=float, default=default(S, "rules_interval_s"), metavar="SECONDS")
    serve.add_argument("--rules-processes", type=_count, default=default(S, "rules_processes"), metavar="N",
                       help="processes that read and judge a share of the jobs each, beside the collector "
                            "that leads (default 0: the leader judges in its own process)")
    serve.add_argument("--group-wait-ms", type=float, default=default(S, "group_wait_s") * 1000, metavar="MS",
                       help="a group of batches shares one commit and closes once none has come for MS "
                            f"(default {default(S, 'group_wait_s') * 1000:g})")
    serve.add_argument("--group-max-wait-ms", type=float, default=default(S, "group_max_wait_s") * 1000, metavar="MS",
                       help="the longest a group gathers from its first batch, never less than --group-wait-ms"
                            f" (default {default(S, 'group_max_wait_s') * 1000:g})")
    serve.add_argument("--notify", type=Path, metavar="FILE",
                       help="where flags are told while jobs run: webhooks and users' opt-in (TOML, docs/notify.md)")
    serve.add_argument("--policy", type=Path, metavar="FILE",
                       help="the site's idle-GPU policy: warn, then cancel or report (TOML, docs/notify.md)")
    serve.add_argument("--captures-per-hour", type=_count, default=default(C, "per_hour"), metavar="N",
                       help="flagged ranks whose Python stacks are sampled as evidence, site-wide per hour "
                            f"(default {default(C, 'per_hour')}; 0: none; docs/captures.md)")
    serve.add_argument("--capture-seconds", type=_seconds, default=default(C, "seconds"), metavar="SECONDS",
                       help=f"how long one capture samples (default {default(C, 'seconds'):g}, at most 30)")
    serve.add_argument("--traces-per-hour", type=_count, default=default(C, "traces_per_hour"), metavar="N",
                       help="profiler traces asked of flagged ranks whose job allowed them, site-wide per hour "
                            f"(default {default(C, 'traces_per_hour')}; 0: none; docs/captures.md)")
    serve.add_argument("--trace-steps", type=_count, default=default(C, "trace_steps"), metavar="N",
                       help=f"steps one trace covers (default {default(C, 'trace_steps')})")
    serve.add_argument("--trace-max-mb", type=_positive, default=default(C, "trace_max_bytes") >> 20, metavar="MB",
                       help="the largest compressed trace kept; a larger one keeps its summary only "
                            f"(default {default(C, 'trace_max_bytes') >> 20})")
    serve.add_argument("--trace-days", type=_positive, default=int(default(C, "trace_days")), metavar="DAYS",
                       help="traces are dropped after this many days, their summaries kept "
                            f"(default {default(C, 'trace_days'):g})")
    serve.add_argument("--munge-socket", type=Path, metavar="PATH",
                       help="munged's socket, to check the MUNGE credentials of users fetching their own traces "
                            "(default: munge's own)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not 0 < seconds <= 30:
        raise argparse.ArgumentTypeError(f"expected 0 < seconds <= 30, got {value!r}")
    return seconds


def _period(value: str) -> Any:
    from datetime import timedelta

    units = {"d": "days", "h": "hours", "w": "weeks"}
    if len(value) < 2 or value[-1] not in units or not value[:-1].isdigit() or int(value[:-1]) == 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a period such as 7d, 24h or 2w")
    return timedelta(**{units[value[-1]]: int(value[:-1])})


def _digest(args: argparse.Namespace, dsn: str) -> int:
    import json
    from datetime import UTC, datetime

    from jobpulse.collector.notify import channels, mail
    from jobpulse.collector.report import digest

    if args.mail and (args.notify is None or args.by != "user"):
        print("jobpulse digest: --mail needs --notify FILE (its [digest] section) and --by user", file=sys.stderr)
        return 2
    with connect(dsn) as conn:
        d = digest.build(conn, args.by, args.since, datetime.now(UTC), args.cluster)
    print(json.dumps(d, indent=2, default=str) if args.format == "json" else digest.text(d))
    if not args.mail:
        return 0
    site = channels.load(args.notify).digest
    sent = 0
    for g in d["groups"]:
        if site.wants(g["grp"], g["wasted_total"]):
            body = "\n".join([f"Your GPU jobs, {d['start'][:10]} .. {d['end'][:10]}:", *digest.group_text(d, g)])
            mail.send(site.smtp, site.sender, f"{g['grp']}@{site.domain}", "jobpulse: your GPU jobs this period", body)
            sent += 1
    if d["hardware"]:
        for admin in site.admins:
            mail.send(site.smtp, site.sender, admin, "jobpulse: hardware trouble per node",
                      "\n".join([f"{d['start'][:10]} .. {d['end'][:10]}", *digest.hardware_text(d)]))
            sent += 1
    print(f"\n{sent} digest mails sent", file=sys.stderr)
    return 0


def _summary(args: argparse.Namespace, dsn: str) -> int:
    import json

    from jobpulse.collector.store.state import summaries

    with connect(dsn) as conn:
        found = summaries.read(conn, args.job_id, args.cluster)
    if not found:
        print(f"jobpulse summary: no summary of job {args.job_id!r}"
              + (f" in cluster {args.cluster!r}" if args.cluster else "")
              + ": it is running, its end is still being judged, or it is unknown (jobpulse report shows a "
                "running job)", file=sys.stderr)
        return 1
    if len(found) > 1:
        print(f"jobpulse summary: job {args.job_id!r} exists in clusters "
              f"{', '.join(s['cluster'] for s in found)}: pass --cluster", file=sys.stderr)
        return 1
    print(json.dumps(found[0]["summary"], indent=2) if args.format == "json" else found[0]["text"])
    return 0


def _job_id(value: str) -> str:
    import re

    from jobpulse.schema.wire import JOB_ID_PATTERN

    if not re.match(JOB_ID_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Slurm job id (123, 123_4 or 123+1)")
    return value


def _name(value: str) -> str:
    if not value or any(c.isspace() for c in value) or len(value) > 255:
        raise argparse.ArgumentTypeError(f"{value!r}: a name without spaces, at most 255 characters")
    return value


def _gpus(value: str) -> tuple[frozenset[int], int | None]:
    """`--gpus`: a list of indices (the GPUs held), or one number, which is also a count of GPUs
    for a recording that names none."""
    try:
        found = frozenset(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a list of GPU indices such as 0,1,3") from None
    if not found or min(found) < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a list of GPU indices such as 0,1,3")
    return found, (min(found) if "," not in value else None)


def _import_formats() -> tuple[str, ...]:
    from jobpulse.collector.recordings.formats import FORMATS

    return FORMATS


def _zone(value: str) -> Any:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a time zone (e.g. Europe/Berlin, UTC)") from None


def _time_format(value: str) -> str:
    from jobpulse.collector.recordings.times import time_format

    try:
        return time_format(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _import(args: argparse.Namespace, dsn: str | None) -> int:
    from datetime import timedelta

    from jobpulse.collector.errors import Rejected, Unavailable
    from jobpulse.collector.recordings.faults import RecordingError
    from jobpulse.collector.recordings.importer import Options, dry_run, import_recordings
    from jobpulse.collector.recordings.intake import Limits

    if args.start and args.recent:
        print("jobpulse import: --start and --recent both place the recording: give one", file=sys.stderr)
        return 2
    if args.interval is not None and not 0 < args.interval <= 3600:
        print("jobpulse import: --interval must be between 0 and 3600 seconds", file=sys.stderr)
        return 2
    held, count = args.gpus or (None, None)
    opts = Options(fmt=args.fmt, columns=args.columns, job_id=args.job_id, node=args.node, cluster=args.cluster,
                   user=args.user, partition=args.partition, gpus=held, gpu_count=count, model=args.model,
                   tz=args.tz, time_format=args.time_format, start=args.start, recent=args.recent,
                   interval=timedelta(seconds=args.interval) if args.interval else None,
                   retention_days=args.retention_days, input=Limits(args.max_mib * 2**20, float(args.wait)))
    names = ", ".join(str(f) for f in args.files)
    try:
        if dsn is None:
            print(dry_run(args.files, opts))
            return 0
        done = import_recordings(dsn, args.files, opts)
    except RecordingError as exc:
        print(f"jobpulse import: {names}: {exc}", file=sys.stderr)
        return 2
    except Rejected as exc:
        print(f"jobpulse import: {names}: {exc.reason}", file=sys.stderr)
        return 2
    except Unavailable as exc:
        print(f"jobpulse import: cannot use the database: {exc}", file=sys.stderr)
        return 1
    print(done.text())
    from jobpulse.collector.recordings.importer import judge
    from jobpulse.collector.rules import backtest
    from jobpulse.collector.rules.thresholds import Thresholds

    replayed = judge(dsn, done, Thresholds(args.rules))
    print()
    print(backtest.text(replayed, [], done.start, done.end))
    return 0


def connect(dsn: str, **kwargs: object) -> Any:
    """A database connection; the database stack is imported only by commands that use it."""
    from jobpulse.collector.store.connect import connect as store_connect

    return store_connect(dsn, **kwargs)


def _time(value: str) -> datetime:
    """An RFC 3339 time with its UTC offset (a time without one is ambiguous: refused)."""
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a time like 2026-01-31T12:00:00+00:00, got {value!r}") from None
    if t.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{value!r} has no UTC offset (add +00:00 or Z)")
    return t


def _require_dsn(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if not args.dsn:
        parser.error("--dsn is required (or set JOBPULSE_DSN)")
    return str(args.dsn)


def _db(args: argparse.Namespace, dsn: str) -> int:
    from jobpulse.collector.store.migrate import citus, migrations
    from jobpulse.collector.store.tiers import compact, partitions, pyramid, tier_stats

    with connect(dsn, autocommit=True) as conn:
        if args.db_command == "compact":
            done = compact.compact(conn, hot_hours=args.raw_hours, duty=args.duty,
                                   max_seconds=args.max_minutes and args.max_minutes * 60.0)
            print(f"compacted {done.chunks} chunks ({', '.join(f'{t}: {n}' for t, n in done.samples.items())} samples)"
                  f" in {done.seconds:.1f} s; emptied partitions: {len(done.truncated)}"
                  + ("" if done.finished else "; stopped at --max-minutes, run again to go on"))
            return 0
        if args.db_command == "pyramid":
            built = pyramid.build(conn)
            print(f"pyramid: {built.rows} rows over {built.hours} hours ({built.late_hours} marked by late samples)"
                  f" in {built.seconds:.1f} s")
            return 0
        if args.db_command == "stats":
            print(tier_stats.text(tier_stats.stats(conn)))
            return 0
        if args.db_command == "upgrade":
            if args.citus:
                citus.require(conn)
            applied = migrations.upgrade(conn)
            shards = (args.shard_count or citus.default_shard_count(conn)) if args.citus else 0
            spread = citus.distribute(conn, shards) if args.citus else []
            created = partitions.ensure_ahead(conn, args.partitions_ahead)
            names = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "none (up to date)"
            print(f"schema version {migrations.current_version(conn)}; applied: {names}; "
                  f"partitions created: {len(created)}" + (f"; distributed: {len(spread)} tables" if args.citus else "")
                  + (f" ({shards} shards a group)" if spread else ""))
        else:
            created = partitions.ensure_ahead(conn, args.partitions_ahead)
            dropped = partitions.drop_expired(conn, args.retention_days, tiers=partitions.Tiers(
                compact_days=args.compact_days, rollup_days=args.rollup_days))
            print(f"partitions created: {len(created)}; dropped: {len(dropped)} {' '.join(dropped)}".rstrip())
    return 0


def _validate_report(args: argparse.Namespace, dsn: str) -> int:
    import json

    from jobpulse.collector.report import node_validation as validation_report
    from jobpulse.collector.store.read import reports

    with connect(dsn) as conn:
        summary = validation_report.summarize(reports.latest_validations(conn))
    print(json.dumps(summary, indent=2) if args.format == "json" else validation_report.text(summary))
    return 0 if summary["ok"] else 1


def _report(args: argparse.Namespace, dsn: str) -> int:
    import json

    from jobpulse.collector.report import html as report_html
    from jobpulse.collector.report import text as report

    with connect(dsn) as conn:
        try:
            data = report.gather(conn, args.job_id, args.cluster)
        except report.JobNotFound as exc:
            print(f"jobpulse report: {exc}", file=sys.stderr)
            return 1
        if args.format == "html":
            out = report_html.render(data, report_html.series(conn, data))
        else:
            out = json.dumps(data, indent=2, default=str) if args.format == "json" else report.text(data)
    if args.output:
        try:
            args.output.write_text(out + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"jobpulse report: cannot write --output {args.output}: {exc.strerror}", file=sys.stderr)
            return 1
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(out)
    return 0


def _grafana(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        from jobpulse.collector.grafana import dashboards
        from jobpulse.collector.grafana import provisioning as grafana_provisioning
    except ImportError as exc:
        print(f"jobpulse grafana: {exc.name} is missing: pip install 'jobpulse[grafana]'", file=sys.stderr)
        return 2
    if args.grafana_command == "build":
        files = {Path("dashboards") / n: t for n, t in dashboards.render_all().items()}
        files |= {Path("deploy/grafana/provisioning") / p: t for p, t in grafana_provisioning.render_all().items()}
        for rel, text in files.items():
            (args.out / rel).parent.mkdir(parents=True, exist_ok=True)
            (args.out / rel).write_text(text)
            print(f"wrote {args.out / rel}")
        return 0
    from jobpulse.collector.grafana.publish import Database, PublishError, publish

    if not args.token:
        parser.error("--token is required (or set GRAFANA_TOKEN)")
    database = None
    if args.pg_host:
        if not args.pg_password_file:
            parser.error("--pg-password-file is required with --pg-host")
        try:
            password = args.pg_password_file.read_text().strip()
        except OSError as exc:
            parser.error(f"--pg-password-file {args.pg_password_file}: {exc.strerror}")
        database = Database(args.pg_host, args.pg_database, args.pg_user, password)
    try:
        for line in publish(args.url.rstrip("/"), args.token, database):
            print(line)
    except PublishError as exc:
        print(f"jobpulse grafana publish: {exc}", file=sys.stderr)
        return 1
    return 0


def _rules(args: argparse.Namespace, dsn: str) -> int:
    from jobpulse.collector.rules.thresholds import Thresholds

    thresholds = Thresholds(args.rules)
    if args.rules_command == "backtest":
        return _backtest(args, dsn, thresholds)
    from jobpulse.collector.report import summary
    from jobpulse.collector.rules.engine import evaluate

    with connect(dsn) as conn:
        r = evaluate(conn, thresholds)
        written = summary.write_pending(conn)
        conn.commit()
    print(f"{r.jobs} jobs, {r.gpus} GPUs: {r.hits} hits, {r.closed} flags closed, {r.node_flags} node flags open"
          f" ({r.seconds * 1000:.0f} ms); {written} job summaries written")
    return 0


def _backtest(args: argparse.Namespace, dsn: str, thresholds: Any) -> int:
    import json
    from datetime import timedelta

    from jobpulse.collector.report.text import capture_lines, trace_lines
    from jobpulse.collector.rules import backtest
    from jobpulse.collector.store.state import captures, flags

    if args.end <= args.start:
        print("jobpulse rules backtest: --to must be after --from", file=sys.stderr)
        return 2
    with connect(dsn) as conn:
        replayed = backtest.replay(conn, thresholds, args.start, args.end, timedelta(seconds=args.step),
                                   args.cluster, args.job)
        stored = flags.stored(conn, args.start, args.end, args.cluster, args.job)
        found = captures.of_flags(conn, [row[:5] for row in stored])
    evidence = {key: capture_lines(kinds.get("stacks")) + trace_lines(kinds.get("trace")) for key, kinds in found.items()}
    if args.format == "json":
        print(json.dumps({"replayed": [f.as_json() for f in replayed],
                          "evidence": [{"flag": list(key), "lines": lines} for key, lines in evidence.items()],
                          "stored": [[v.isoformat() if hasattr(v, "isoformat") else v for v in row] for row in stored]},
                         indent=2))
    else:
        print(backtest.text(replayed, stored, args.start, args.end, evidence))
    return 0


def _serve(args: argparse.Namespace, dsn: str) -> int:
    from jobpulse.collector.ingest.server import serve
    from jobpulse.collector.service import create_app
    from jobpulse.schema import logs

    logs.configure(args.log_level)
    settings = CollectorSettings(
        dsn=dsn, token_file=args.token_file, max_body_bytes=args.max_body_mb * 1024 * 1024,
        retention_days=args.retention_days, partitions_ahead_days=args.partitions_ahead,
        max_clock_skew_s=float(args.max_clock_skew), rules_path=args.rules,
        rules_interval_s=max(0.5, args.rules_interval), request_timeout_s=args.request_timeout,
        group_wait_s=max(0.0, args.group_wait_ms / 1000), group_max_wait_s=max(0.0, args.group_max_wait_ms / 1000),
        rules_processes=args.rules_processes, log_level=args.log_level, notify_path=args.notify,
        policy_path=args.policy,
        captures=CapturePolicy(args.captures_per_hour, args.capture_seconds, traces_per_hour=args.traces_per_hour,
                               trace_steps=min(100, args.trace_steps),
                               trace_max_bytes=min(args.trace_max_mb, 64, args.max_body_mb // 2)
                               * 2**20,  # base64 in a batch within --max-body-mb
                               trace_days=args.trace_days),
        munge_socket=args.munge_socket)
    app = create_app(settings)
    host, port = args.listen
    serve(app, host, port, args.request_timeout)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "db":
            return _db(args, _require_dsn(args, parser))
        if args.command == "report":
            return _report(args, _require_dsn(args, parser))
        if args.command == "rules":
            return _rules(args, _require_dsn(args, parser))
        if args.command == "watch":
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not command:
                parser.error("watch: give the command to run after --, e.g. jobpulse watch -- python train.py")
            from jobpulse.collector.watch import main as watch_main

            return watch_main(command, args.dir, args.interval, args.rules)
        if args.command == "trace":
            from jobpulse.collector.trace_fetch import fetch

            path = fetch(args.collector, args.capture, args.output, args.token_file, args.munge_socket)
            print(f"wrote {path} ({path.stat().st_size} bytes): open it in Perfetto (ui.perfetto.dev) or Holistic "
                  "Trace Analysis")
            return 0
        if args.command == "digest":
            return _digest(args, _require_dsn(args, parser))
        if args.command == "summary":
            return _summary(args, _require_dsn(args, parser))
        if args.command == "import":
            return _import(args, None if args.dry_run else _require_dsn(args, parser))
        if args.command == "validate":
            return _validate_report(args, _require_dsn(args, parser))
        if args.command == "demo":
            try:
                from jobpulse.collector.demo.runner import main as demo_main
            except ImportError as exc:
                print(f"jobpulse demo: {exc.name} is missing: pip install 'jobpulse[agent,collector,demo]'",
                      file=sys.stderr)
                return 2
            return demo_main(args.duration, args.live, args.keep)
        if args.command == "grafana":
            return _grafana(args, parser)
        if args.command == "deploy":
            from jobpulse.collector.deploy import main as deploy_main

            return deploy_main(args.target, args.dir, args.force, args.settings)
        if args.command == "collector":
            return _serve(args, _require_dsn(args, parser))
    except Exception as exc:  # a user sees a message, never a trace
        psycopg = sys.modules.get("psycopg")  # imported only by the commands that use the database
        if psycopg is not None and isinstance(exc, psycopg.Error):
            print(f"jobpulse: cannot use the database: {str(exc).strip()}", file=sys.stderr)
            return 1
        if not isinstance(exc, (OSError, ValueError)):
            raise
        print(f"jobpulse: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
