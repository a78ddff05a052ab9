"""The job-end mail: Slurm's MailProg replaced by `slurm/mail.sh`, with a real SMTP server on loopback
and a real collector. An END mail carries the job's summary; every mail it cannot enrich (another
kind, no summary, the collector or the SMTP server down, a crafted recipient) goes out unchanged
through the site's mail program; a crafted subject or job name cannot add a recipient or a header."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Message

from jobpulse.collector.embedded.postgres import free_port

from .conftest import RunningCollector
from .test_summary import jobpulse, seed

MAIL_SH = Path(__file__).parents[1] / "slurm" / "mail.sh"
SUBJECT = "Slurm Job_id=6201 Name=train Ended, Run time 00:25:00, COMPLETED, ExitCode 0"


class Inbox(Message):
    def __init__(self) -> None:
        super().__init__()
        self.mails: list[tuple[list[str], object]] = []

    async def handle_DATA(self, server, session, envelope):  # type: ignore[no-untyped-def]  # aiosmtpd's hook
        self.mails.append((list(envelope.rcpt_tos), None))
        return await super().handle_DATA(server, session, envelope)

    def handle_message(self, message) -> None:  # type: ignore[no-untyped-def]
        self.mails[-1] = (self.mails[-1][0], message)


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox, port = Inbox(), free_port()
    server = Controller(inbox, hostname="127.0.0.1", port=port)
    server.start()
    yield inbox, port
    server.stop()


def mail(env: dict[str, str], *args: str, body: str = "") -> subprocess.CompletedProcess[str]:
    """slurmctld's call: `MailProg -s SUBJECT RECIPIENT` with jobpulse.conf's settings."""
    return subprocess.run(["bash", str(MAIL_SH), *args], input=body, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, check=False)


def test_the_end_mail_carries_the_summary_and_nothing_else_is_lost(collector: RunningCollector, dsn: str,
                                                                   smtp: tuple[Inbox, int], tmp_path: Path) -> None:
    inbox, port = smtp
    seed(collector, "6201", datetime.now(UTC) - timedelta(seconds=5))
    assert "1 job summaries written" in jobpulse("rules", "evaluate", "--dsn", dsn).stdout
    (tmp_path / "token").write_text(collector.token + "\n")
    sent = tmp_path / "fallback.log"
    fallback = tmp_path / "mail"
    fallback.write_text(f"#!/bin/bash\n{{ printf '%s|' \"$@\"; echo; cat; echo; }} >> {sent}\n")
    fallback.chmod(0o755)
    env = {"JOBPULSE_COLLECTOR": collector.url, "JOBPULSE_TOKEN_FILE": str(tmp_path / "token"),
           "JOBPULSE_CLUSTER": "sum", "JOBPULSE_SMTP": f"127.0.0.1:{port}", "JOBPULSE_MAIL_FROM": "slurm@test",
           "JOBPULSE_MAIL_FALLBACK": str(fallback), "JOBPULSE_MAIL_WAIT": "3", "JOBPULSE_PYTHON": os.sys.executable}

    out = mail(env, "-s", SUBJECT, "ann@example.org")
    assert out.returncode == 0, out.stderr
    [(rcpt, message)] = inbox.mails
    body = message.get_payload(decode=True).decode()  # type: ignore[union-attr]
    print("\n" + body)
    subject = " ".join(message["Subject"].split())  # unfolded (a long header is folded on the wire)
    assert rcpt == ["ann@example.org"] and subject == SUBJECT and message["To"] == "ann@example.org"
    assert body.startswith("jobpulse: job 6201 (sum)") and "GPU-hours: 0.83 held" in body and "idle_gpu" in body
    assert not sent.exists(), "enriched: not sent twice"

    # Not enriched, sent unchanged by the site's mail program: a BEGIN mail, a job without a summary,
    # a crafted recipient, the SMTP server or the collector down.
    began = SUBJECT.replace("Ended, Run time 00:25:00, COMPLETED, ExitCode 0", "Began, Queued time 00:00:01")
    array = "Slurm Array Summary Job_id=6200_* (6200) Name=Job_id=6201 Ended, Run time 00:25:00, COMPLETED, ExitCode 0"
    named = began.replace("Name=train", "Name=x Ended, Run time 00:25:00, COMPLETED, ExitCode 0 Ended")
    cases = [(env, began, "ann@example.org"), (env, named, "ann@example.org"),  # a name cannot make it an end mail
             (env, SUBJECT.replace("6201", "6299"), "ann@example.org"),
             (env, array, "eve@example.org"),  # a job name cannot fetch another job's summary
             (env, SUBJECT, "ann@example.org\r\nBcc: eve@example.org"), (env, SUBJECT, "Ann <ann@example.org>"),
             ({**env, "JOBPULSE_SMTP": f"127.0.0.1:{free_port()}"}, SUBJECT, "ann@example.org"),
             ({**env, "JOBPULSE_COLLECTOR": f"http://127.0.0.1:{free_port()}"}, SUBJECT, "ann@example.org")]
    for case_env, subject, recipient in cases:
        out = mail(case_env, "-s", subject, recipient, body="Slurm's own text")
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    logged = sent.read_bytes().decode().split("|\nSlurm's own text\n")
    assert [entry.strip().split("|") for entry in logged if entry.strip()] == [
        ["-s", subject, recipient] for _, subject, recipient in cases]
    assert len(inbox.mails) == 1

    # A subject (the job's name is in it) cannot add a header or a recipient.
    out = mail(env, "-s", SUBJECT.replace("Name=train", "Name=x\r\nBcc: eve@example.org"), "ann@example.org")
    assert out.returncode == 0, out.stderr
    rcpt, message = inbox.mails[-1]
    assert rcpt == ["ann@example.org"] and message["Bcc"] is None
    assert " ".join(message["Subject"].split()).startswith("Slurm Job_id=6201 Name=x Bcc: eve@example.org Ended")
