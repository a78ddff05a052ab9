"""Mail: one plain-text message to one address through the site's SMTP server (the digests)."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage


def send(smtp: str, sender: str, to: str, subject: str, body: str) -> None:
    host, sep, port = smtp.rpartition(":")
    if not sep:
        host, port = smtp, "25"
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = sender, to, " ".join(subject.split())
    msg.set_content(body)
    with smtplib.SMTP(host or "localhost", int(port or 25), timeout=15) as server:
        server.send_message(msg)
