"""The queue beside the idle GPUs on real Slurm: 22.05 (the host's; slurm-sync counts the queue from
squeue) and 26.05 (a chroot's, with ``MetricsType=metrics/openmetrics``: the sync finds slurmctld's
OpenMetrics from `scontrol show config` and counts the waiting jobs from it). Two jobs hold every
GPU doing nothing (the fake NVML's GPUs at 0 %), two more wait for 2 and 4 GPUs in the same
partition: the cluster dashboard's query shows the idle GPUs beside them, the digest says it, and
an idle-GPU policy that acts only while others wait held back before they waited and warns once they do."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobpulse.collector.grafana import dashboards
from jobpulse.collector.report import digest

from . import slurm_chroot
from .conftest import RunningCollector, start_collector, stop_collector
from .grafana_macros import Var, expand
from .slurm_cluster import SlurmCluster, accounting_available, available
from .slurm_queue_capture import HOLD_S, MetricsCluster
from .test_slurm import configure, query, running_cluster, wait_until
from .test_slurm_policy import RULES

VERSIONS = {"22.05": "squeue", "26.05": "openmetrics"}
"""Each version tested and what counts its waiting jobs."""


def _why_not(version: str) -> str | None:
    if version == SlurmCluster.version:
        return available()
    return accounting_available() or slurm_chroot.unavailable(version)


@pytest.fixture(scope="module", params=[pytest.param(v, id=f"slurm-{v}") for v in VERSIONS])
def cluster(request: pytest.FixtureRequest, fake_nvml: Path) -> Iterator[SlurmCluster]:
    version = request.param
    why = _why_not(version)
    if why:
        pytest.skip(f"Slurm {version}: {why}")
    kind = SlurmCluster if version == SlurmCluster.version else (lambda *p: MetricsCluster(*p, version=version))
    with running_cluster(fake_nvml, kind, sm=(0, 0)) as c:  # type: ignore[arg-type]  # every GPU idle
        yield c


def sync(c: SlurmCluster, collector: RunningCollector) -> None:
    """One slurm-sync poll, run as the site runs it: that version's scontrol and squeue."""
    out = c.run(sys.executable, "-m", "jobpulse.agent", "slurm-sync", "--once", "--collector", collector.url,
                "--token-file", str(c.root / "token"), "--node", "ctld", "--cluster", "jpcluster",
                "--spool-dir", str(c.root / "sync-spool"), timeout=60)
    assert out.returncode == 0, out.stderr


def beside_the_queue(dsn: str) -> list[dict[str, Any]]:
    """The cluster dashboard's "Idle GPUs beside the queue" query, as Grafana expands it."""
    model = dashboards.as_json(dashboards.cluster_dashboard())
    panel = next(p for p in model["panels"] if p["title"] == "Idle GPUs beside the queue")
    now = datetime.now(UTC)
    sql = expand(panel["targets"][0]["rawSql"], {"cluster": Var(("jpcluster",))}, now - timedelta(hours=1), now, 1000)
    with psycopg.connect(dsn) as conn:
        cur = conn.execute(sql)
        return [dict(zip([d.name for d in cur.description], r, strict=True)) for r in cur.fetchall()]


def test_idle_gpus_beside_jobs_waiting_for_them(cluster: SlurmCluster, dsn: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster
    source = VERSIONS[c.version]
    monkeypatch.setenv("SLURM_CONF", str(c.conf))
    policy = tmp_path / "policy.toml"
    policy.write_text('[idle_gpu]\nwarn_after_minutes = 0.1\naction = "report"\nonly_while_queued = true\n')
    collector = start_collector(dsn, tmp_path, "--rules", str(RULES), "--rules-interval", "1", "--policy", str(policy))
    out = f"--output={c.root}/out-%j.txt"
    jobs: list[str] = []
    try:
        configure(c, collector.url)
        jobs += [c.sbatch("-N1", "-w", node, "--gres=gpu:2", out, script=HOLD_S) for node in ("n1", "n2")]
        holding = jobs[0]
        wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.job_flags WHERE job_id = %s AND rule_id = "
                                      "'idle_gpu'", holding)[0][0], 120, "the idle flag of a job holding GPUs")
        sync(c, collector)  # nothing waits yet
        wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.policy_actions WHERE job_id = %s", holding)[0][0],
                   60, "the policy's decision on the idle job")
        before = query(dsn, "SELECT action, reason FROM jobpulse.policy_actions WHERE job_id = %s", holding)
        assert [a for a, _ in before] == ["unqueued"] and "the site acts only while others wait" in before[0][1], before

        jobs += [c.sbatch("-N1", "--gres=gpu:2", out, script=HOLD_S),
                 c.sbatch("-N2", "--gpus-per-node=2", out, script=HOLD_S)]
        wait_until(lambda: len(c.run("squeue", "-h", "-t", "PENDING", "-o", "%i %r").stdout.split()) == 4, 30,
                   "two jobs pending with a reason")
        sync(c, collector)
        stored = query(dsn, "SELECT partition, jobs_pending, gpu_jobs_pending, gpus_pending, source"
                            " FROM jobpulse.partition_queue_now ORDER BY partition")
        waiting = {p: rest for p, *rest in stored}
        assert waiting.pop("gpu") == [2, 2, 6, source], stored
        assert all(rest[:3] == [0, 0, 0] for rest in waiting.values()), stored  # OpenMetrics names idle debug too

        wait_until(lambda: query(dsn, "SELECT count(*) FROM jobpulse.policy_actions WHERE job_id = %s AND action ="
                                      " 'warned'", holding)[0][0], 60, "the warning once jobs wait")
        (reason,), = query(dsn, "SELECT reason FROM jobpulse.policy_actions WHERE job_id = %s AND action = 'warned'",
                           holding)
        assert "idle for" in reason and "while 2 jobs wait for 6 GPUs in partition gpu" in reason, reason

        def shown() -> list[dict[str, Any]]:
            return [r for r in beside_the_queue(dsn) if r["partition"] == "gpu"]
        wait_until(lambda: [r["idle_gpus"] for r in shown()] == [4], 90, "the four idle GPUs on the dashboard")
        row = shown()[0]
        assert (row["jobs_waiting_for_gpus"], row["gpus_asked"], row["jobs_waiting"], row["source"]) == (2, 6, 2, source)

        def said() -> str:
            with psycopg.connect(dsn) as conn:
                return digest.text(digest.build(conn, "partition", timedelta(hours=1),
                                                datetime.now(UTC) + timedelta(minutes=5), "jpcluster"))
        wait_until(lambda: "4 GPUs idle in partition gpu while 2 jobs waited for 6 GPUs" in said(), 90,
                   "the digest's line")
        print(f"\nSlurm {c.version} ({source}): {reason}\n" + next(
            line for line in said().splitlines() if "idle in partition" in line))
    finally:
        for job in jobs:
            c.run("scancel", job)
        stop_collector(collector)
