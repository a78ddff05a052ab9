"""Records what a Slurm version says about jobs that end every way jobpulse tells apart, for the
reader's tests (`tests/data/slurm/`): `python -m tests.slurm_capture 22.05|24.11|26.05 OUTDIR` (as
root) starts that version's two-node cluster with accounting, runs the jobs and writes
`squeue-VERSION.json`, `sacct-VERSION.json` (with each job's kind in its name) and the hooks'
environments (`env-VERSION.txt`: each node's prolog and epilog environment, one block a hook)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .slurm_cluster import AccountingCluster, ChrootCluster, SlurmCluster

JOBS = {  # kind -> (sbatch options, script)
    "exit0": (["-N2", "--gres=gpu:1"], "sleep 2\nexit 0"),
    "exit3": (["-N1"], "sleep 2\nexit 3"),
    "first_second": (["-N1"], "exit 3"),  # fails before its first second is out: start == end
    "signal": (["-N1"], "sleep 1\nkill -9 $$"),
    "failed_step": (["-N1"], "srun false\nsleep 2\nexit 0"),
    "timeout": (["-N1", "--time=10"], "sleep 600"),
    "cancelled_pending": (["-N1", "--hold"], "sleep 1"),
    "running": (["-N2", "--gres=gpu:2", "--comment=jobpulse: tags=kind:running"], "sleep 600"),  # then suspended
    "pending_gpus": (["-N1", "--gres=gpu:1"], "sleep 600"),  # waits for the GPUs `running` holds
}
ENV_HOOK = '#!/bin/sh\n{{ echo "=== {hook} $SLURMD_NODENAME"; env | sort; }} >> {out}/env-$SLURMD_NODENAME.txt\n'


def cluster_of(version: str, root: Path) -> SlurmCluster:
    hooks = [root / f"{h}.sh" for h in ("prolog", "epilog", "task_prolog")]
    for hook in hooks:
        hook.write_text(ENV_HOOK.format(hook=hook.stem, out=root) if hook.stem != "task_prolog" else "#!/bin/sh\n")
        hook.chmod(0o755)
    (root / "epilog_slurmctld.sh").write_text("#!/bin/sh\n")
    (root / "epilog_slurmctld.sh").chmod(0o755)
    if version == SlurmCluster.version:
        return AccountingCluster(root, *hooks)
    return ChrootCluster(root, *hooks, version=version)


def capture(version: str, out: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="jobpulse-capture-"))
    root.chmod(0o755)
    c = cluster_of(version, root)
    try:
        c.start()
        ids = {kind: c.sbatch(*opts, f"--job-name={kind}", f"--output={root}/out-%j.txt",
                              script=f"#!/bin/bash\n{script}\n") for kind, (opts, script) in JOBS.items()}
        time.sleep(4)
        c.run("scancel", ids["cancelled_pending"], check=True)
        c.run("scontrol", "update", f"JobId={ids['timeout']}", "EndTime=now+10", check=True)
        for kind in ("exit0", "exit3", "first_second", "signal", "failed_step", "timeout", "cancelled_pending"):
            c.wait_done(ids[kind], timeout=150)
        deadline = time.monotonic() + 60
        while "RUNNING" not in c.run("squeue", "-h", "-o", "%T", "-j", ids["running"]).stdout:
            assert time.monotonic() < deadline, "the job to suspend never ran"
            time.sleep(0.5)
        c.run("scontrol", "suspend", ids["running"], check=True)
        time.sleep(1)
        squeue = json.loads(c.run("squeue", "--json", "--states=all", check=True).stdout)
        time.sleep(3)  # slurmctld hands ended jobs to slurmdbd within a few seconds
        sacct = json.loads(c.run("sacct", "--json", "-j", ",".join(ids.values()), check=True).stdout)
        out.mkdir(parents=True, exist_ok=True)
        kinds = {v: k for k, v in ids.items()}
        for name, doc in (("squeue", squeue), ("sacct", sacct)):
            for job in doc.get("jobs", []):
                job["name"] = kinds.get(str(job.get("job_id")), job.get("name"))
            (out / f"{name}-{version}.json").write_text(json.dumps(doc, indent=1) + "\n")
        hooks = "".join(p.read_text() for p in sorted(root.glob("env-n*.txt")))
        (out / f"env-{version}.txt").write_text(hooks)
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    capture(sys.argv[1], Path(sys.argv[2]))
