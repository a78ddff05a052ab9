"""`jobpulse deploy slurm|systemd|grafana DIR`: writes what an admin deploys (shipped in the package)
where it goes, and never replaces a file the admin edited unless told to.

Each target folder gets a manifest (``.jobpulse-deploy.json``: file -> SHA-256 of what was written),
so a later deploy (an upgrade) replaces the files it wrote and left alone, and refuses, naming
them, the files someone changed since; ``--force`` replaces those too. The settings file is the
admin's to edit: once changed it is kept, even with ``--force``. Every check runs before the first
write, so a refused deploy changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# The installed `jobpulse` package, or the source checkout: both hold slurm/, deploy/ and dashboards/
# beside collector/ (importlib.resources cannot list them in an editable install's namespace).
PACKAGE = Path(__file__).resolve().parents[1]
MANIFEST = ".jobpulse-deploy.json"
SHIPPED_BIN = "/opt/jobpulse/bin/"  # the install prefix the shipped units and examples name
SHIPPED_SETTINGS = "/etc/jobpulse/jobpulse.conf"
SHIPPED_DASHBOARDS = "/var/lib/grafana/dashboards/jobpulse"
TARGETS = ("slurm", "systemd", "grafana")


class DeployError(ValueError):
    """A deploy that would replace edited files, or has nowhere to write (names the files)."""


@dataclass(frozen=True)
class Item:
    """One file to write: where under the target folder, its text, mode, and whether it is the
    admin's settings (kept once edited)."""

    path: str
    text: str
    mode: int = 0o644
    settings: bool = False


def _read(rel: str) -> str:
    return (PACKAGE / rel).read_text()


def slurm_items(target: Path) -> list[Item]:
    """Hooks, the settings file (naming this Python), the slurm.conf lines (naming ``target``),
    the README and the example batch scripts."""
    src = PACKAGE / "slurm"
    items = [Item(name, _read(f"slurm/{name}"), 0o755) for name in ("hook.sh", "prolog.sh", "epilog.sh",
                                                                     "task_prolog.sh", "mail.sh", "epilog_slurmctld.sh",
                                                                     "conf.sh")]
    conf = _read("slurm/jobpulse.conf.example").replace(f"{SHIPPED_BIN}python", sys.executable)
    items.append(Item("jobpulse.conf", conf, settings=True))
    snippet = _read("slurm/slurm.conf.snippet").replace("/opt/jobpulse/slurm", str(target))
    items.append(Item("slurm.conf.snippet", snippet))
    items.append(Item("README.md", _read("slurm/README.md")))
    items += [Item(f"examples/{p.name}", p.read_text()) for p in sorted((src / "examples").iterdir()) if p.is_file()]
    return items


def systemd_items(settings: Path) -> list[Item]:
    """The units, naming this Python, this installation's scripts and ``settings``."""
    scripts = f"{sysconfig.get_path('scripts')}/"
    out = []
    for p in sorted((PACKAGE / "deploy" / "systemd").glob("*.service")):
        text = p.read_text().replace(f"{SHIPPED_BIN}python ", f"{sys.executable} ").replace(SHIPPED_BIN, scripts)
        out.append(Item(p.name, text.replace(SHIPPED_SETTINGS, str(settings))))
    return out


def grafana_items(target: Path) -> list[Item]:
    """``provisioning/`` (datasource, dashboard provider, alert rules) and ``dashboards/jobpulse/``,
    the provider pointing at the latter."""
    prov = PACKAGE / "deploy" / "grafana" / "provisioning"
    dashboards = target / "dashboards" / "jobpulse"
    items = [Item(f"provisioning/{p.relative_to(prov)}", p.read_text().replace(SHIPPED_DASHBOARDS, str(dashboards)))
             for p in sorted(prov.rglob("*.yaml"))]
    items += [Item(f"dashboards/jobpulse/{p.name}", p.read_text())
              for p in sorted((PACKAGE / "dashboards").glob("*.json"))]
    return items


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def deploy(target_kind: str, target: Path, *, force: bool = False,
           settings: Path = Path(SHIPPED_SETTINGS)) -> list[str]:
    """Write the files of ``target_kind`` under ``target``; one line per file says what happened."""
    target = target.resolve()
    if target.exists() and not target.is_dir():
        raise DeployError(f"{target} is not a folder")
    items = {"slurm": lambda: slurm_items(target), "systemd": lambda: systemd_items(settings),
             "grafana": lambda: grafana_items(target)}[target_kind]()
    manifest_path = target / MANIFEST
    try:
        written: dict[str, str] = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        written = {}
    except ValueError as exc:
        raise DeployError(f"{manifest_path}: not a jobpulse deploy manifest ({exc}); remove it to start over") from None

    plan: list[tuple[Item, str]] = []  # (item, action)
    refused = []
    for item in items:
        path = target / item.path
        data = item.text.encode()
        if not path.exists():
            plan.append((item, "wrote"))
            continue
        current = path.read_bytes()
        if current == data:
            plan.append((item, "unchanged"))
        elif written.get(item.path) == _digest(current):
            plan.append((item, "updated"))  # ours, untouched since: an upgrade
        elif item.settings:
            plan.append((item, "kept (your settings)"))
        elif force:
            plan.append((item, "replaced (--force)"))
        else:
            refused.append(str(path))
    if refused:
        raise DeployError("changed since jobpulse wrote them (or not written by jobpulse), not replaced: "
                          + ", ".join(refused) + "; nothing was written. --force replaces them")

    lines = []
    for item, action in plan:
        path = target / item.path
        if action in ("wrote", "updated", "replaced (--force)"):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.jobpulse-tmp")
            tmp.write_text(item.text)
            tmp.chmod(item.mode)
            os.replace(tmp, path)
            written[item.path] = _digest(item.text.encode())
        lines.append(f"{action} {path}")
    manifest_path.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    return lines


NEXT_STEPS = {
    "slurm": "next: set the collector URL and token in {dir}/jobpulse.conf, add {dir}/slurm.conf.snippet to "
             "slurm.conf and run `scontrol reconfigure` (see {dir}/README.md)",
    "systemd": "next: put the settings the units read in {settings} (as slurm/jobpulse.conf.example), then "
               "`systemctl daemon-reload && systemctl enable --now jobpulse-agent` (or jobpulse-collector)",
    "grafana": "next: point Grafana's provisioning path at {dir}/provisioning (or copy it to /etc/grafana/provisioning), "
               "set JOBPULSE_PG_HOST and JOBPULSE_PG_PASSWORD in Grafana's environment, restart Grafana",
}


def main(target_kind: str, target: Path, force: bool, settings: Path) -> int:
    for line in deploy(target_kind, target, force=force, settings=settings):
        print(line)
    print(NEXT_STEPS[target_kind].format(dir=target.resolve(), settings=settings))
    return 0
