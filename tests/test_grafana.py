"""Grafana as code: every panel, variable, annotation and alert query expanded as Grafana would
and run against real PostgreSQL holding a seeded two-node job (stored through the real collector,
so the roll-ups are the ones ingest keeps). That the committed dashboards and provisioning are what
the code generates: tests/unit/test_dashboards.py."""

from __future__ import annotations

import decimal
import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobpulse.agent.capture import trace_summary
from jobpulse.collector.grafana import dashboards
from jobpulse.collector.grafana import provisioning as grafana_provisioning
from jobpulse.collector.report import summary
from jobpulse.collector.report.text import gather
from jobpulse.collector.rules.capture_policy import ask_for_new_flags
from jobpulse.collector.settings import CapturePolicy
from jobpulse.collector.store.state import summaries
from jobpulse.schema import wire
from jobpulse.schema.fields import PANELS

from .conftest import RunningCollector
from .grafana_macros import Var, expand
from .test_ingest_http import post

JOB, MINUTES = "5001", 40
TRACE = Path(__file__).parent / "data" / "traces" / "nccl_two_rank" / "rank-0.json.gz"
GPUS = {"n1": ["GPU-a0", "GPU-a1"], "n2": ["GPU-b0", "GPU-b1"]}
# Grafana's interval for each range on a ~1000 px panel with timeInterval 1s
RANGES = {"15m": (timedelta(minutes=15), 1000), "6h": (timedelta(hours=6), 20_000),
          "24h": (timedelta(hours=24), 60_000)}


def seed(c: RunningCollector, dsn: str, end: datetime | None = None) -> datetime:
    """A 2-node, 4-GPU, 4-rank job over the last 40 min at 1 Hz: GPU a1 idle all along, b1 at 15 %,
    two jobs waiting for 4 GPUs in its partition, events, phases, steps, an application XID (a node's XID would explain away the usage flags),
    topology, a failed validation; then one rule cycle. (``end``: the same data in two databases.)"""
    end = end or datetime.now(UTC).replace(microsecond=0)
    start = end - timedelta(minutes=MINUTES)
    job = wire.JobRecord(job_id=JOB, user_name="alice", uid=1000, account="ml", partition="gpu", job_name="llm-pretrain",
                         nodes=["n1", "n2"], gpus_total=4, start_time=start, state="RUNNING",
                         tags={"trace": "on"})  # the job allowed profiler traces as evidence
    for n, (node, uuids) in enumerate(GPUS.items()):
        agent = wire.AgentInfo(instance=f"seed-{node}", node=node, cluster="seedcluster", version="0.1.0",
                               started_at=start)
        util = {uuids[0]: 90, uuids[1]: 0 if node == "n1" else 15}
        job_here = wire.JobRecord(**{**{f: getattr(job, f) for f in job.__struct_fields__},
                                     "gpus": [wire.JobGpu(u, i, None) for i, u in enumerate(uuids)]})
        topo = [wire.TopologyGpu(ts=start, gpu_uuid=u, gpu_index=i, model="NVIDIA H100 80GB HBM3", numa_node=i,
                                 cpu_affinity="0-15" if i == 0 else "16-31",
                                 links={uuids[1 - i]: "NV18" if node == "n1" else "SYS"}) for i, u in enumerate(uuids)]
        if node == "n2":  # a third GPU that went silent
            topo.append(wire.TopologyGpu(ts=start, gpu_uuid="GPU-b2", gpu_index=2, model="NVIDIA H100 80GB HBM3"))
        for minute in range(MINUTES):
            t0 = start + timedelta(minutes=minute)
            stamps = [t0 + timedelta(seconds=s) for s in range(60)]
            gpu = [wire.GpuSample(ts=t, gpu_uuid=u, gpu_index=i, job_id=JOB, sm_util=util[u], mem_util=30,
                                  power_w=100.0 + 4 * util[u], power_limit_w=700.0, gpu_temp_c=50 + util[u] // 5,
                                  sm_clock_mhz=1980, fb_used_mib=20_000 if util[u] else 500, fb_total_mib=81_559,
                                  pcie_rx_kbs=1000 * util[u], pcie_tx_kbs=500, pcie_gen=4 if node == "n2" else 5,
                                  pcie_width=16, pcie_gen_max=5, pcie_width_max=16, nvlink_rx_kbs=10_000,
                                  nvlink_tx_kbs=10_000, clock_event_reasons=0x40 if node == "n2" else 0,
                                  gpm_sm_active=util[u] * 0.9, gpm_tensor_active=util[u] * 0.3,
                                  **{f.name: f.python(minute) for fs in PANELS.values() for f in fs})
                   for t in stamps for i, u in enumerate(uuids)]
            procs = [wire.ProcessSample(ts=t, pid=1000 + 2 * n + i, gpu_uuid=u, job_id=JOB, step="0", rank=2 * n + i,
                                        local_rank=i, gpu_mem_mib=19_000, sm_util=util[u], cpu_percent=100.0 - util[u],
                                        rss_mib=8000, command="python", cpu=3 + 16 * i)
                     for t in stamps[::5] for i, u in enumerate(uuids)]
            events = [wire.AppEvent(ts=t0 + timedelta(seconds=30), pid=1000 + 2 * n, kind="step", job_id=JOB, rank=2 * n,
                                    name="train", message="step", attrs={"step": minute, "samples_per_s": 500.0 + n})]
            if minute % 10 == 0:
                events += [wire.AppEvent(ts=t0, pid=1000 + 2 * n, kind="phase_start", job_id=JOB, rank=2 * n,
                                         name="epoch", message="epoch"),
                           wire.AppEvent(ts=t0 + timedelta(minutes=9), pid=1000 + 2 * n, kind="phase_end",
                                         job_id=JOB, rank=2 * n, name="epoch", message="epoch",
                                         attrs={"duration_s": 540.0, "status": "ok"}),
                           wire.AppEvent(ts=t0 + timedelta(seconds=1), pid=1000 + 2 * n, level="warning", job_id=JOB,
                                         rank=2 * n, message=f"loss spike at minute {minute}")]
            health = [wire.HealthEvent(ts=end - timedelta(minutes=5), kind="xid", gpu_uuid=uuids[0], job_id=JOB, code=31,
                                       message="GPU memory page fault")] if node == "n2" and minute == 0 else []
            checks = [wire.NodeValidation(ts=start, check="pcie_link", status="fail", observed="4x16", expected="5x16",
                                          message="link trained down", gpu_uuid=uuids[1])] if minute == 0 else []
            batch = wire.Batch(version=1, agent=agent, seq=minute, created_at=t0 + timedelta(seconds=59),
                               gpu_samples=gpu, process_samples=procs, events=events, health_events=health,
                               topology=topo if minute == 0 else [], jobs=[job_here] if minute == 0 else [],
                               validations=checks, queue=[  # the sync's reading: jobs wait for GPUs in gpu
                                   wire.PartitionQueue(ts=t0 + timedelta(seconds=30), partition="gpu", jobs_pending=3,
                                                       gpu_jobs_pending=2, gpus_pending=4, source="squeue")
                               ] if node == "n1" else [], fabric_samples=[  # one port each; n2's trained down, erring
                                   wire.FabricSample(ts=t, device="mlx5_0", port=1, job_id=JOB, link_layer="InfiniBand",
                                                     port_state=4, phys_state=5, rate_gbps=25.0 if node == "n2" else 100.0,
                                                     width=1 if node == "n2" else 4, rate_max_gbps=100.0, width_max=4,
                                                     rx_kbs=2_000_000, tx_kbs=1_900_000, symbol_error=minute if node == "n2" else 0,
                                                     link_downed=0, port_rcv_errors=0) for t in stamps[::5]])
            assert post(c, wire.encode(batch)).status_code == 200
    for command in (["rules", "evaluate"], ["db", "pyramid"]):
        out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", *command, "--dsn", dsn],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    with psycopg.connect(dsn) as conn:  # the summary its end would write: the goodput panels read it
        summaries.write(conn, summary.build(gather(conn, JOB, "seedcluster")))
    answer_captures(c, dsn, start)
    return end


def answer_captures(c: RunningCollector, dsn: str, start: datetime) -> None:
    """As the leader's cycle and the agents do: the flagged ranks' nodes are asked for their stacks and
    a trace (in the answer to their next batch), and their next batch answers (the trace a real one)."""
    with psycopg.connect(dsn) as conn:
        assert ask_for_new_flags(conn, CapturePolicy()) >= 1
        conn.commit()
    time.sleep(2.1)  # the collector looks for waiting captures every 2 s
    for node in GPUS:
        agent = wire.AgentInfo(instance=f"seed-{node}", node=node, cluster="seedcluster", version="0.1.0",
                               started_at=start)
        asked = post(c, wire.encode(wire.Batch(version=1, agent=agent, seq=MINUTES, created_at=start))).json()
        answers = [wire.CaptureResult(id=a["id"], job_id=a["job_id"], ok=True, seconds=5.0,
                                      samples={"main": 240, "workers": 0},
                                      top=[wire.StackShare("main", "train (train.py) > next_batch (data.py)", 0.7)])
                   if a.get("kind", "stacks") == "stacks" else
                   wire.CaptureResult(id=a["id"], job_id=a["job_id"], ok=True, seconds=3.0,
                                      summary=trace_summary.summarize(TRACE.read_bytes()), trace=TRACE.read_bytes())
                   for a in asked.get("captures", [])]
        batch = wire.Batch(version=1, agent=agent, seq=MINUTES + 1, created_at=start, captures=answers)
        assert post(c, wire.encode(batch)).status_code == 200


def variables(dsn: str) -> dict[str, Var]:
    return {"cluster": Var(("seedcluster",)), "job": Var((JOB,)), "node": Var(("n1", "n2"), multi=True),
            "gpu": Var(tuple(u for us in GPUS.values() for u in us), multi=True),
            "rank": Var(("0", "1", "2", "3"), multi=True), "group_by": Var(("user_name",))}


def targets(model: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, format, rawSql) of every query in a dashboard: panels, variables, annotations."""
    out = [(f"panel {p['title']!r}", t["format"], t["rawSql"]) for p in model["panels"] for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", "table", v["query"]) for v in model["templating"]["list"] if v["type"] == "query"]
    out += [(f"annotation {a['name']}", "table", a["target"]["rawSql"]) for a in model.get("annotations", {}).get("list", [])
            if "target" in a and "rawSql" in a["target"]]
    return out


def check_shape(what: str, fmt: str, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    assert rows, f"{what}: no rows"
    if fmt == "time_series":
        assert columns[0] == "time", f"{what}: first column {columns[0]!r}"
        times = [r[0] for r in rows]
        assert times == sorted(times), f"{what}: not sorted by time"
        for i, name in enumerate(columns[1:], 1):
            kinds = {type(r[i]) for r in rows if r[i] is not None}
            if name == "metric":
                assert kinds == {str}, f"{what}: metric column {kinds}"
            else:
                assert kinds <= {int, float, decimal.Decimal} and kinds, f"{what}: column {name} is {kinds}"
    elif what.startswith("annotation"):
        assert "time" in columns and "text" in columns, f"{what}: {columns}"
    elif what.startswith("variable"):
        assert len(columns) == 1 or {"__text", "__value"} <= set(columns), f"{what}: {columns}"


def test_every_dashboard_query_runs_as_grafana_expands_it(quiet_collector: RunningCollector, dsn: str) -> None:
    end = seed(quiet_collector, dsn)
    vars_ = variables(dsn)
    ran = 0
    with psycopg.connect(dsn) as conn:
        conn.execute("SET statement_timeout = '20s'")
        for name, fn in dashboards.DASHBOARDS.items():
            model = dashboards.as_json(fn())
            for what, fmt, sql in targets(model):
                for label, (span, interval_ms) in RANGES.items():
                    query = expand(sql, vars_, end - span, end, interval_ms)
                    assert "$" not in query.replace("$$", ""), f"{name} {what}: unexpanded {query}"
                    cur = conn.execute(query)
                    columns = [d.name for d in cur.description]
                    check_shape(f"{what} ({name}, {label})", fmt, columns, cur.fetchall())
                    ran += 1
        # Variables give the values the other queries were run with.
        job = dashboards.as_json(dashboards.job_dashboard())
        by_name = {v["name"]: v["query"] for v in job["templating"]["list"] if v["type"] == "query"}
        got = {k: conn.execute(expand(by_name[k], vars_, end - timedelta(hours=1), end, 1000)).fetchall()
               for k in ("node", "gpu", "rank", "job")}
        assert [r[0] for r in got["node"]] == ["n1", "n2"] and len(got["gpu"]) == 4
        assert [r[0] for r in got["rank"]] == [0, 1, 2, 3]
        assert got["job"][0] == (f"{JOB} · alice · llm-pretrain", JOB)  # searchable by id, user and name
        # Long ranges read roll-ups, short ranges raw samples; the values agree.
        series = "SELECT DISTINCT source FROM jobpulse.gpu_series('seedcluster', %s, %s, %s, %s)"
        sources = {label: conn.execute(series, (JOB, end - span, end, ms // 1000)).fetchall()
                   for label, (span, ms) in RANGES.items()}
        assert sources == {"15m": [("gpu_samples",)], "6h": [("gpu_rollup 10 s",)], "24h": [("gpu_rollup 300 s",)]}
        # A panel with its numbers checked: the idle GPU is at 0 and the busy one at 90.
        util = next(t for t in targets(job) if "utilization (duty cycle)" in t[0])[2]
        rows = conn.execute(expand(util, vars_, end - timedelta(hours=6), end, 20_000)).fetchall()
        means = {m: sum(r[2] for r in rows if r[1] == m) / sum(1 for r in rows if r[1] == m) for m in {r[1] for r in rows}}
        assert means == pytest.approx({"n1/GPU0": 90, "n1/GPU1": 0, "n2/GPU0": 90, "n2/GPU1": 15})
        # Only the GPU that went silent is missing (the others were heard within 5 minutes).
        health = dashboards.as_json(dashboards.node_health_dashboard())
        missing = next(t for t in targets(health) if "GPUs missing" in t[0])[2]
        rows = conn.execute(expand(missing, vars_, end - timedelta(hours=1), end, 1000)).fetchall()
        assert [(r[0], r[2]) for r in rows] == [("n2", "GPU-b2")]
    print(f"{ran} dashboard queries expanded and run over 15 min, 6 h and 24 h ranges")

    # Alert rules: no dashboard variables; table with one numeric column, strings become labels.
    alerting = grafana_provisioning.alerting_yaml()
    with psycopg.connect(dsn) as conn:
        for rule in alerting["groups"][0]["rules"]:
            query = rule["data"][0]["model"]["rawSql"]
            cur = conn.execute(expand(query, {}, end - timedelta(minutes=10), end, 1000))
            rows, columns = cur.fetchall(), [d.name for d in cur.description]
            assert rows, f"alert {rule['title']}: no rows on the seeded job"
            numeric = [c for i, c in enumerate(columns) if isinstance(rows[0][i], (int, float, decimal.Decimal))]
            assert numeric == ["value"], f"alert {rule['title']}: numeric columns {numeric}"
            assert all(isinstance(v, str) for r in rows for i, v in enumerate(r) if columns[i] != "value")
            labels = {columns[i]: v for i, v in enumerate(rows[0]) if columns[i] != "value"}
            print(f"alert {rule['uid']}: {len(rows)} series, e.g. labels {labels}")
            if rule["uid"] == "jobpulse-idle-gpu":
                assert labels["user"] == "alice" and labels["job_id"] == JOB and labels["category"] == "code"
            if rule["uid"] == "jobpulse-hardware":
                assert {r[columns.index("node")] for r in rows} == {"n2"}


MIG_SLICES = {"MIG-s1": ("1g.10gb", 9, 50.0), "MIG-s3": ("3g.40gb", 2, 100.0)}  # profile, GPU instance, activity


def test_mig_slices_are_rows_of_their_own_and_count_as_their_share(collector: RunningCollector, dsn: str) -> None:
    """One job on two slices of one H100 (1 and 3 of its 7 compute slices), 20 min at 1 Hz, the
    small one half busy, and an MPS job holding a quarter of another GPU, its processes at 20 % of
    it: the heatmap draws each slice as its own row, named by its profile and GPU instance, and
    GPU-hours (the job's busy/allocated, the cluster's waste, the report) count each slice and the
    MPS job as their share of the GPU, not as a whole GPU."""
    end = datetime.now(UTC).replace(microsecond=0)
    start = end - timedelta(minutes=20)
    agent = wire.AgentInfo(instance="seed-m1", node="m1", cluster="migcluster", version="0.1.0", started_at=start)
    model = "NVIDIA H100 80GB HBM3"
    topo = [wire.TopologyGpu(ts=start, gpu_uuid="GPU-p0", gpu_index=0, model=model, mig_mode=True),
            wire.TopologyGpu(ts=start, gpu_uuid="GPU-w1", gpu_index=1, model=model, mig_mode=False)]
    topo += [wire.TopologyGpu(ts=start, gpu_uuid=u, gpu_index=0, model=f"{model} MIG {p}", parent_uuid="GPU-p0",
                              mig_profile=p, gpu_instance_id=gi, compute_instance_id=0)
             for u, (p, gi, _) in MIG_SLICES.items()]
    job = wire.JobRecord(job_id="6001", user_name="bob", uid=1001, account="ml", partition="mig", nodes=["m1"],
                         gpus_total=2, start_time=start, end_time=end, state="COMPLETED",
                         gpus=[wire.JobGpu(u, 0, None) for u in MIG_SLICES])
    mps = wire.JobRecord(job_id="6002", user_name="carol", uid=1002, partition="mps", nodes=["m1"], gpus_total=1,
                         start_time=start, end_time=end, state="COMPLETED", gpus=[wire.JobGpu("GPU-w1", 1, None, 0.25)])
    for minute in range(20):
        t0 = start + timedelta(minutes=minute)
        samples = [wire.GpuSample(ts=t0 + timedelta(seconds=s), gpu_uuid=u, gpu_index=0, job_id="6001",
                                  gpm_sm_active=act, fb_used_mib=5000, fb_total_mib=9856)
                   for s in range(60) for u, (_, _, act) in MIG_SLICES.items()]
        samples += [wire.GpuSample(ts=t0 + timedelta(seconds=s), gpu_uuid="GPU-w1", gpu_index=1, job_id="6002",
                                   sm_util=20) for s in range(60)]  # the MPS job's own processes' share
        batch = wire.Batch(version=1, agent=agent, seq=minute, created_at=t0 + timedelta(seconds=59),
                           gpu_samples=samples, topology=topo if minute == 0 else [],
                           jobs=[job, mps] if minute == 0 else [])
        assert post(collector, wire.encode(batch)).status_code == 200
    out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "db", "pyramid", "--dsn", dsn],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    vars_ = {**variables(dsn), "cluster": Var(("migcluster",)), "job": Var(("6001",)), "group_by": Var(("user_name",))}
    cluster, jobd = (dashboards.as_json(fn()) for fn in (dashboards.cluster_dashboard, dashboards.job_dashboard))

    def run(model: dict[str, Any], title: str) -> list[tuple[Any, ...]]:
        sql = next(t[2] for t in targets(model) if title in t[0])
        with psycopg.connect(dsn) as conn:
            return conn.execute(expand(sql, vars_, end - timedelta(hours=6), end, 20_000)).fetchall()

    rows = run(cluster, "Node x GPU activity")
    means = {m: sum(r[2] for r in rows if r[1] == m) / sum(1 for r in rows if r[1] == m) for m in {r[1] for r in rows}}
    assert means == pytest.approx({"m1/GPU0 MIG 1g.10gb (GI 9)": 50, "m1/GPU0 MIG 3g.40gb (GI 2)": 100,
                                   "m1/GPU1": 20})
    seconds = 20 * 60
    wasted = {m: sum(r[2] for r in run(cluster, "Wasted GPU-hours") if r[1] == m) for m in ("bob", "carol")}
    assert wasted["bob"] == pytest.approx(seconds * 1 / 7 * 0.5 / 3600, rel=0.01)  # as a whole GPU: 7 times more
    assert wasted["carol"] == pytest.approx(seconds * (0.25 - 0.2) / 3600, rel=0.01)  # whole: 16 times more
    vars_["job"] = Var(("6002",))
    assert run(jobd, "GPU-hours busy / allocated") == [pytest.approx((seconds * 0.2 / 3600, seconds * 0.25 / 3600),
                                                                      rel=0.01)]
    vars_["job"] = Var(("6001",))
    ((busy, allocated),) = run(jobd, "GPU-hours busy / allocated")
    assert busy == pytest.approx(seconds * (1 / 7 * 0.5 + 3 / 7 * 1.0) / 3600, rel=0.01)
    assert allocated == pytest.approx(seconds * 4 / 7 / 3600, rel=0.01)
    for job_id, hours in (("6001", (busy, allocated)), ("6002", (seconds * 0.2 / 3600, seconds * 0.25 / 3600))):
        out = subprocess.run([sys.executable, "-m", "jobpulse.collector.cli", "report", job_id, "--cluster",
                              "migcluster", "--dsn", dsn, "--format", "json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        usage = json.loads(out.stdout)["usage"]
        assert (usage["gpu_hours_busy"], usage["gpu_hours_allocated"]) == pytest.approx(hours, abs=0.001)
