"""Where jobpulse's CPU goes per GPU sample and per process sample (not a test): the live load of
`bench/versus_tsdb.py` without its agents, so that the collector and PostgreSQL are most of what runs.

``--nodes`` simulated nodes (8 GPUs each, batches built by the agent's own code and gzipped as it
ships them) post a batch a second each over keep-alive HTTP to a real collector (its leader folding
the roll-ups behind ingest) on a PostgreSQL whose day already holds ``--day-hours`` of other GPUs,
the batches of one second spread over ``--spread-ms`` as agents' are. Rounds alternate GPUs only
and GPUs with 4 processes each (32 process samples a node). Per round: the collector's and
PostgreSQL's CPU from /proc per GPU sample, and per process sample (what the processes' rounds
spend above the GPU-only rounds' median); PostgreSQL's statements (`pg_stat_statements`, reset
each round); with ``--spy``, a `py-spy` profile of the collector over the rounds of each load,
summed by function (self and inclusive time). ``--baseline DIR``: another version's collector
(DIR holds its `jobpulse` package) alternated with this one round by round, on the same database,
so both see the same load; ``--other OPTIONS``: the same for this code's collector serving with
other options.

    python bench/profile_ingest.py [--nodes 32] [--seconds 30] [--rounds 2] [--spy] [--baseline DIR | --other OPTIONS]

Writes bench/results/profile_ingest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from harness import GPUS_PER_NODE, SimulatedNode, load_note, post_all, request, save, start_collector, tree_cpu_s
from ingest import reset_statements, statement_settings
from seed import database
from versus_tsdb import prefill_today

LOADS = ("gpus only", "processes")


def spy(pid: int, seconds: float, out: Path, native: bool) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` for ``seconds``, collapsed stacks into ``out``: without pausing it, or
    (``native``) pausing it at each sample to read its C frames too (uvloop, msgspec, psycopg's)."""
    return subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid), "--rate", "250",
                             "--duration", str(int(seconds)), "--format", "raw", "-o", str(out),
                             *(["--native"] if native else ["--nonblocking"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def by_function(stacks: Path, top: int = 40) -> dict[str, Any]:
    """Collapsed stacks summed by function: share of samples on the CPU in it (self) and under it."""
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].split(":")[0].rstrip(")") for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith("0x")] or frames  # unnamed native frames
        count = int(n)
        total += count
        own[frames[-1]] += count
        for f in set(frames):
            under[f] += count
    return {"samples": total,
            "self": {f: round(n / total, 3) for f, n in own.most_common(top)},
            "inclusive": {f: round(n / total, 3) for f, n in under.most_common(top)}}


def statements(dsn: str, seconds: float) -> dict[str, dict[str, float]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT query, total_exec_time, calls, rows FROM pg_stat_statements WHERE query NOT LIKE"
                            " '%pg_stat_statements%' ORDER BY 2 DESC LIMIT 10").fetchall()
    return {" ".join(q.split())[:100]: {"ms_per_s": round(ms / seconds, 3), "calls_per_s": round(n / seconds, 2),
                                        "rows_per_call": round(r / max(1, n), 1)} for q, ms, n, r in rows}


def one_round(port: int, sims: list[SimulatedNode], seconds: int, processes: bool, spread_ms: float) -> int:
    """Post ``seconds`` of every node's batches, each second's spread over ``spread_ms``; GPU samples sent.
    The batches are built first, their samples timed when they will be sent (a sample before the
    leader's fold mark would take the late path)."""
    t = time.monotonic()
    for sim in sims[:4]:
        sim.batch(datetime.now(UTC), processes)  # what building one costs here
    start = int(time.time() + (time.monotonic() - t) / 4 * len(sims) * seconds * 1.5) + 2
    plan = [(start + s + n * spread_ms / 1000 / len(sims), sim, start + s) for s in range(seconds)
            for n, sim in enumerate(sims)]
    built = [(at, request(port, sim.batch(datetime.fromtimestamp(ts, UTC), processes)[1])) for at, sim, ts in plan]
    offset = time.monotonic() - time.time()
    asyncio.run(post_all(port, ((at + offset, data) for at, data in built), connections=len(sims)))
    return len(plan) * GPUS_PER_NODE


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--seconds", type=int, default=30, help="seconds a round")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each load (and version)")
    ap.add_argument("--day-hours", type=float, default=6)
    ap.add_argument("--spread-ms", type=float, default=80, help="one second's batches arrive over this long")
    ap.add_argument("--other", metavar="OPTIONS", help="a second collector of this code with these `collector serve`"
                    " options (e.g. \"--group-wait-ms 5\"), alternated with the first round by round")
    ap.add_argument("--spy", action="store_true", help="py-spy the collector (costs CPU of its own)")
    ap.add_argument("--native", action="store_true", help="with --spy: C frames too (pauses the collector a little)")
    ap.add_argument("--baseline", type=Path, help="a folder holding another version's `jobpulse` package")
    args = ap.parse_args()
    note = load_note()
    work = Path(tempfile.mkdtemp(prefix="jobpulse-profile-ingest-"))
    versions = {"this": None, **({"baseline": str(args.baseline.resolve())} if args.baseline else {}),
                **({"other": None} if args.other else {})}
    rounds: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    try:
        with database("profile-ingest", statement_settings()) as pg:
            prefill_today(pg.dsn, args.nodes * GPUS_PER_NODE, args.day_hours)
            with psycopg.connect(pg.dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            postmaster = int((pg.datadir / "postmaster.pid").read_text().split()[0])
            sims = [SimulatedNode(n) for n in range(args.nodes)]
            collectors = {}
            for name, path in versions.items():
                (work / name).mkdir()
                extra = shlex.split(args.other) if name == "other" else []
                collectors[name] = start_collector(work / name, pg.dsn, *extra, pythonpath=path)
            for _, port in collectors.values():  # warm-up: pools, plans, partitions
                one_round(port, sims, 5, True, args.spread_ms)
            for r in range(args.rounds):
                for load in LOADS:
                    order = list(versions) if r % 2 == 0 else list(reversed(versions))
                    for name in order:
                        col, port = collectors[name]
                        reset_statements(pg.dsn)
                        before = (tree_cpu_s(col.pid), tree_cpu_s(postmaster), time.monotonic())
                        stack = work / f"{name}-{load}-{r}.txt"
                        probe = spy(col.pid, args.seconds + 2, stack, args.native) if args.spy and name == "this" else None
                        gpu_samples = one_round(port, sims, args.seconds, load == "processes", args.spread_ms)
                        time.sleep(1)  # the last group commits, the leader's fold runs
                        span = time.monotonic() - before[2]
                        used = (tree_cpu_s(col.pid) - before[0], tree_cpu_s(postmaster) - before[1])
                        if probe:
                            probe.wait(60)
                            profiles.setdefault(load, []).append(stack)
                        rounds.append({"version": name, "load": load, "round": r, "gpu_samples": gpu_samples,
                                       "process_samples": gpu_samples * 4 if load == "processes" else 0,
                                       "collector_us_per_gpu_sample": round(used[0] / gpu_samples * 1e6, 1),
                                       "postgres_us_per_gpu_sample": round(used[1] / gpu_samples * 1e6, 1),
                                       "statements": statements(pg.dsn, span)})
                        print(f"round {r} {name} {load}: collector {rounds[-1]['collector_us_per_gpu_sample']} us, "
                              f"PostgreSQL {rounds[-1]['postgres_us_per_gpu_sample']} us a GPU sample", flush=True)
            for col, _ in collectors.values():
                col.terminate()
                col.wait(30)
        summary: dict[str, Any] = {}
        for name in versions:
            per = {load: {side: statistics.median(x[f"{side}_us_per_gpu_sample"] for x in rounds
                                                  if x["version"] == name and x["load"] == load)
                          for side in ("collector", "postgres")} for load in LOADS}
            summary[name] = {"us_per_gpu_sample_gpus_only": per["gpus only"],
                             # what 4 process samples add to a GPU sample, per process sample
                             "us_per_process_sample": {side: round((per["processes"][side] - per["gpus only"][side]) / 4, 1)
                                                       for side in ("collector", "postgres")}}
        if profiles:
            merged = {}
            for load, files in profiles.items():
                merged_file = work / f"merged-{load}.txt"
                merged_file.write_text("".join(f.read_text() for f in files))
                merged[load] = by_function(merged_file)
            summary["collector_profile"] = merged
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"summary": summary, "rounds": rounds, "nodes": args.nodes, "seconds": args.seconds, "other_options": args.other,
              "conditions": note,
              "conditions_at_end": load_note()}
    print(f"\n{note}; at the end: {result['conditions_at_end']}")
    for name, s in summary.items():
        print(f"{name}: {s}")
    save("profile_ingest.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
