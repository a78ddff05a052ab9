"""The digest: a period's ended jobs per user (GPU-hours used and wasted by cause, the worst jobs,
the trend against the period before), hardware trouble per node with a drain suggestion, and the
mails: to each user who opted in or wasted past the site's threshold, and to the admins."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from psycopg.types.json import Jsonb

from .conftest import RunningCollector
from .test_job_mail import Inbox, smtp  # noqa: F401 - the SMTP server fixture
from .test_summary import jobpulse, seed


def test_a_weeks_digest_per_user_with_trend_hardware_and_mail(collector: RunningCollector, dsn: str,
                                                              smtp: tuple[Inbox, int], tmp_path: Path) -> None:  # noqa: F811
    inbox, port = smtp
    seed(collector, "6301", datetime.now(UTC) - timedelta(seconds=5))  # ann's: one GPU idle most of the time
    assert "1 job summaries written" in jobpulse("rules", "evaluate", "--dsn", dsn).stdout
    with psycopg.connect(dsn) as conn:  # the week before: ann used 90 % of her GPU-hours; ben's clean job now
        for job, user, days, held, used in (("6300", "ann", 8, 10.0, 9.0), ("6302", "ben", 1, 4.0, 3.6)):
            end = datetime.now(UTC) - timedelta(days=days)
            conn.execute("INSERT INTO jobpulse.job_summaries (cluster, job_id, user_name, state, start_time, end_time,"
                         " gpus, gpu_hours, gpu_hours_used, wasted, summary, text) VALUES ('sum', %s, %s, 'COMPLETED',"
                         " %s, %s, 1, %s, %s, '{}', %s, 'x')",
                         (job, user, end - timedelta(hours=held), end, held, used, Jsonb({})))
        conn.execute("INSERT INTO jobpulse.node_flags (cluster, node, rule_id, severity, category, scope_key, started_at,"
                     " last_seen, evidence, advice) VALUES ('sum', 'n7', 'xid_error', 'critical', 'hardware', 'n7/GPU-z',"
                     " now() - interval '1 day', now(), '{}', 'drain')")

    out = jobpulse("digest", "--dsn", dsn, "--since", "7d")
    assert out.returncode == 0, out.stderr
    print("\n" + out.stdout)
    lines = out.stdout.splitlines()
    ann = next(line for line in lines if line.startswith("  user ann:"))
    assert "1 jobs, 0.8 GPU-hours held, 0.4 used" in ann and "points on the period before" in ann and "idle 0." in ann
    assert int(re.search(r"([-+]\d+) points", ann).group(1)) < -40, "from 90 % to under half: the trend says so"  # type: ignore[union-attr]
    assert any("job 6301 (train Bcc: x) wasted 0." in line for line in lines)
    assert any(line.startswith("  user ben: 1 jobs, 4.0 GPU-hours held, 3.6 used (90%)") for line in lines)
    assert "  sum/n7: xid_error x1 (0 jobs)" in lines
    assert '    drain: scontrol update NodeName=n7 State=DRAIN Reason="jobpulse: xid_error x1"' in lines
    by_partition = json.loads(jobpulse("digest", "--dsn", dsn, "--by", "partition", "--format", "json").stdout)
    assert {g["grp"] for g in by_partition["groups"]} == {"gpu", "?"}

    notify = tmp_path / "notify.toml"
    notify.write_text(f"""
[digest]
smtp = "127.0.0.1:{port}"
from = "jobpulse@example.org"
mail_domain = "example.org"
opted_in = ["ben"]
min_wasted_gpu_hours = 0.3
admins = ["ops@example.org"]
""")
    mailed = jobpulse("digest", "--dsn", dsn, "--mail", "--notify", str(notify))
    assert mailed.returncode == 0 and "3 digest mails sent" in mailed.stderr, mailed.stderr
    got = {tuple(rcpt): message.get_payload(decode=True).decode() for rcpt, message in inbox.mails}
    assert set(got) == {("ann@example.org",), ("ben@example.org",), ("ops@example.org",)}
    assert "user ann:" in got[("ann@example.org",)] and "ben" not in got[("ann@example.org",)]
    assert "drain: scontrol update NodeName=n7" in got[("ops@example.org",)] and "ann" not in got[("ops@example.org",)]
    refused = jobpulse("digest", "--dsn", dsn, "--mail")
    assert refused.returncode == 2 and "--mail needs --notify" in refused.stderr
