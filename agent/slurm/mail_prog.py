"""Slurm's MailProg, with the job's summary: a drop-in for `/usr/bin/mail` as slurmctld calls it
(`MailProg -s SUBJECT RECIPIENT`), which adds jobpulse's summary of the job (GPU-hours held, used
and wasted, flags and advice, #SBATCH lines) to the END, FAIL and TIME_LIMIT mails a user asked
for with `--mail-type`, and sends them through the site's SMTP server.

Slurm's own mail is never lost: a mail it cannot enrich (another kind, no summary in time, the
collector or the SMTP server down, a recipient that is not one plain address) goes out unchanged
through the site's mail program (`JOBPULSE_MAIL_FALLBACK`, default /usr/bin/mail). Standard library
only: it runs on the Slurm controller. Settings from jobpulse.conf (`slurm/mail.sh` exports them).
"""

from __future__ import annotations

import os
import re
import smtplib
import sys
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import parseaddr
from pathlib import Path

from jobpulse.agent.slurm import job_summary

ENRICHED = re.compile(r" (?:Ended|Failed|Reached time limit), Run time [^,]*(?:, [^,]*, ExitCode (?:-?\d+|\[[^]]*\]))?$")
"""Subjects of the mails that get a summary: slurmctld's wording for END, FAIL and TIME_LIMIT (not
TIME_LIMIT_90 and the like: the job still runs), read where slurmctld writes it, after the job's
name, at the subject's end (``Name=NAME Ended, Run time 00:25:00, COMPLETED, ExitCode 0``): a name
with "Ended" in it does not make a BEGIN mail an end mail."""
JOB_ID = re.compile(r"^Slurm (?:Array Task )?Job_id=([0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?) ")
"""slurmctld's subject starts so; an array's summary mail (``Job_id=123_*``) is not one job's, and
the job's name, later in the subject, is the user's to choose: only the start is read."""
ADDRESS = re.compile(r"^[^@\s,;<>\"]+@[^@\s,;<>\"]+$")


@dataclass(frozen=True)
class MailSettings:
    collector: str
    token_file: Path
    cluster: str | None
    smtp_host: str
    smtp_port: int
    sender: str
    fallback: str
    wait_s: float

    @classmethod
    def from_env(cls, env: dict[str, str]) -> MailSettings:
        host, port = smtp_address(env.get("JOBPULSE_SMTP", "localhost:25"))
        return cls(collector=env.get("JOBPULSE_COLLECTOR", "").rstrip("/"),
                   token_file=Path(env.get("JOBPULSE_TOKEN_FILE", "/etc/jobpulse/agent.token")),
                   cluster=env.get("SLURM_CLUSTER_NAME") or env.get("JOBPULSE_CLUSTER"),
                   smtp_host=host, smtp_port=port,
                   sender=env.get("JOBPULSE_MAIL_FROM", f"slurm@{os.uname().nodename}"),
                   fallback=env.get("JOBPULSE_MAIL_FALLBACK", "/usr/bin/mail"),
                   wait_s=float(env.get("JOBPULSE_MAIL_WAIT", "30")))


def smtp_address(value: str) -> tuple[str, int]:
    """``host[:port]`` (port 25 when not given); ValueError for a port that is not a number."""
    host, sep, port = value.rpartition(":")
    return (host or "localhost", int(port)) if sep else (value or "localhost", 25)


def parse_args(argv: list[str]) -> tuple[str, list[str]]:
    """`-s SUBJECT RECIPIENT...` as slurmctld passes them (other mail(1) options are kept for the
    fallback but not understood)."""
    subject, recipients, i = "", [], 0
    while i < len(argv):
        if argv[i] == "-s" and i + 1 < len(argv):
            subject, i = argv[i + 1], i + 2
        elif argv[i].startswith("-"):
            i += 2 if argv[i] in ("-a", "-b", "-c", "-r") else 1
        else:
            recipients.append(argv[i])
            i += 1
    return subject, recipients


def summary_of(s: MailSettings, job_id: str) -> str | None:
    """The job's summary text from the collector, waiting up to ``wait_s`` for it."""
    found = job_summary.fetch(s.collector, s.token_file, s.cluster, job_id, s.wait_s)
    return str(found["text"]) if found else None


def compose(s: MailSettings, subject: str, recipients: list[str], summary: str, body: str) -> EmailMessage:
    """The mail: Slurm's subject on one line, the summary, then whatever Slurm wrote. Each recipient
    must be one plain address: a crafted --mail-user cannot add one."""
    addresses = []
    for r in recipients:
        name, addr = parseaddr(r)
        if name or addr != r or not ADDRESS.match(addr):
            raise ValueError(f"not one plain address: {r!r}")
        user, _, domain = addr.partition("@")
        addresses.append(Address(username=user, domain=domain))
    msg = EmailMessage()
    msg["From"] = s.sender
    msg["To"] = addresses
    msg["Subject"] = " ".join(subject.split())  # no line break can start a header of its own
    msg.set_content(summary + ("\n\n" + body if body.strip() else "\n"))
    return msg


def fallback(s: MailSettings, argv: list[str], body: str) -> int:
    """Slurm's mail as it would have gone without jobpulse."""
    import subprocess

    return subprocess.run([s.fallback, *argv], input=body, text=True, check=False).returncode


def main(argv: list[str] | None = None, env: dict[str, str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    environ = dict(os.environ if env is None else env)
    body = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    try:
        s = MailSettings.from_env(environ)
    except ValueError as exc:  # a bad setting: Slurm's mail still goes out
        print(f"jobpulse-mail: {exc}: sent unchanged", file=sys.stderr)
        return fallback(MailSettings("", Path(), None, "", 0, "", environ.get("JOBPULSE_MAIL_FALLBACK",
                                                                          "/usr/bin/mail"), 0), argv, body)
    subject, recipients = parse_args(argv)
    job = JOB_ID.match(subject)
    if job is None or not ENRICHED.search(subject) or not recipients:
        return fallback(s, argv, body)
    try:
        summary = summary_of(s, job.group(1))
        if summary is None:
            print(f"jobpulse-mail: no summary of job {job.group(1)} within {s.wait_s:.0f} s: sent unchanged",
                  file=sys.stderr)
            return fallback(s, argv, body)
        with smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=30) as smtp:
            smtp.send_message(compose(s, subject, recipients, summary, body))
        return 0
    except Exception as exc:  # noqa: BLE001 - whatever broke, Slurm's own mail still goes out
        print(f"jobpulse-mail: job {job.group(1)}: {exc!r}: sent unchanged", file=sys.stderr)
        return fallback(s, argv, body)


if __name__ == "__main__":
    sys.exit(main())
