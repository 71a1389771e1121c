"""The email transport: Django's locmem backend in an in-process worker, and a real SMTP
server on loopback (a small one written here) behind Django's SMTP backend.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy

import pytest
from django.core import mail
from django.core.exceptions import ImproperlyConfigured
from django.core.mail.backends.base import BaseEmailBackend
from django.test import override_settings

import outbox
from outbox.checks import check_outbox_settings
from outbox.testing import free_port
from outbox.transports.email import HAS_MAILERS, EmailTransport
from tests.support import assert_index_invariant, serving, with_destinations

SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"


def mail_settings(**entries: dict) -> override_settings:
    """override_settings adding email destinations (``RETRY [0]``, ``MAX_RETRIES 2`` unless given)."""
    return with_destinations("email", max_retries=2, **entries)


@pytest.fixture
def mailbox():
    mail.outbox = []
    return mail.outbox


# -- a real SMTP server on 127.0.0.1 -----------------------------------------------------------


@dataclass
class SMTPServer:
    """Speaks enough SMTP (RFC 5321) for smtplib; replies are scripted.

    ``rcpt[address]``: replies to ``RCPT TO`` for that address, used in turn, the last
    repeating (default ``250 OK``). ``data_reply``: the reply after the message data.
    Accepted messages land in ``messages`` as (sender, recipients, raw bytes).
    """

    port: int = 0
    greeting: str = "220 outbox-test ESMTP"
    rcpt: dict[str, list[str]] = field(default_factory=dict)
    data_reply: str = "250 2.0.0 queued"
    messages: list[tuple[str, list[str], bytes]] = field(default_factory=list)
    connections: int = 0
    seen_rcpt: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rcpt_reply(self, address: str) -> str:
        with self.lock:
            n = self.seen_rcpt.get(address, 0)
            self.seen_rcpt[address] = n + 1
        replies = self.rcpt.get(address, ["250 2.1.5 OK"])
        return replies[min(n, len(replies) - 1)]

    def received(self) -> list:
        return [message_from_bytes(raw, policy=policy.default) for _, _, raw in self.messages]


@pytest.fixture
def smtp() -> Iterator[SMTPServer]:
    state = SMTPServer()

    class Handler(socketserver.StreamRequestHandler):
        def reply(self, line: str) -> None:
            self.wfile.write(line.encode() + b"\r\n")

        def handle(self) -> None:
            with state.lock:
                state.connections += 1
            self.reply(state.greeting)
            if not state.greeting.startswith("220"):
                return
            sender, recipients = "", []
            while line := self.rfile.readline():
                verb = line[:4].upper()
                arg = line[4:].strip().decode()
                if verb in (b"EHLO", b"HELO"):
                    self.reply("250 outbox-test")
                elif verb == b"MAIL":
                    sender, recipients = arg.split(":", 1)[1].strip("<> "), []
                    self.reply("250 2.1.0 OK")
                elif verb == b"RCPT":
                    address = arg.split(":", 1)[1].strip().strip("<>")
                    answer = state.rcpt_reply(address)
                    if answer.startswith("250"):
                        recipients.append(address)
                    self.reply(answer)
                elif verb == b"DATA":
                    self.reply("354 end with <CRLF>.<CRLF>")
                    data = b""
                    while (chunk := self.rfile.readline()) and chunk != b".\r\n":
                        data += chunk[1:] if chunk.startswith(b"..") else chunk
                    if state.data_reply.startswith("250"):
                        with state.lock:
                            state.messages.append((sender, recipients, data))
                    self.reply(state.data_reply)
                elif verb == b"QUIT":
                    self.reply("221 2.0.0 bye")
                    return
                else:  # RSET, NOOP
                    self.reply("250 OK")

    with serving(socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)) as server:
        state.port = server.server_address[1]
        with override_settings(EMAIL_HOST="127.0.0.1", EMAIL_PORT=state.port, EMAIL_TIMEOUT=5):
            yield state


def smtp_destination(**options) -> dict:
    return {"OPTIONS": {"backend": SMTP_BACKEND, "from_email": "shop@example.com", **options}}


# -- Django's locmem backend, jobs run in this process -------------------------------------------


def test_html_email_from_options(mailbox, worker, repo):
    with mail_settings(
        ops={"OPTIONS": {"to": ["ops@example.com"], "subject": "New order", "from_email": "shop@example.com"}}
    ):
        m = outbox.send("ops", "<p>Order <b>42</b></p>", content_type="text/html; charset=utf-8")
        worker(simple=True)
    assert outbox.get(m.id).status == "succeeded"
    (email,) = mailbox
    assert (email.subject, email.to, email.from_email) == (
        "New order",
        ["ops@example.com"],
        "shop@example.com",
    )
    assert email.body == "<p>Order <b>42</b></p>" and email.content_subtype == "html"
    mime = email.message()
    assert mime.get_content_type() == "text/html"
    assert mime["X-Outbox-Message-Id"] == m.id
    (attempt,) = outbox.attempts(m.id)
    assert attempt.outcome == "succeeded" and attempt.status_code is None
    assert_index_invariant(repo)


def test_to_and_subject_headers_override_the_options(mailbox, worker):
    with mail_settings(ops={"OPTIONS": {"to": ["ops@example.com"]}}):
        m = outbox.send(
            "ops",
            "Zoë's order shipped",
            headers={"To": "a@example.com, Bea <b@example.com>", "Subject": "Shipped ✓", "X-Order": "42"},
        )
        worker(simple=True)
    (email,) = mailbox
    assert email.to == ["a@example.com", "Bea <b@example.com>"]
    assert email.subject == "Shipped ✓" and email.body == "Zoë's order shipped"
    assert email.content_subtype == "plain"
    mime = email.message()
    assert mime["X-Order"] == "42" and mime["X-Outbox-Message-Id"] == m.id
    assert "To" not in email.extra_headers and "Subject" not in email.extra_headers


def test_default_subject_and_sender(mailbox, worker, settings):
    settings.DEFAULT_FROM_EMAIL = "noreply@example.com"
    with mail_settings(ops={"OPTIONS": {"to": ["ops@example.com"]}}):
        outbox.send("ops", {"order": 1})
        worker(simple=True)
    (email,) = mailbox
    assert (email.subject, email.from_email, email.body) == (
        "Notification",
        "noreply@example.com",
        '{"order":1}',
    )


@pytest.mark.parametrize(
    "options,kwargs,match",
    [
        ({}, {}, "has no OPTIONS\\['to'\\]"),
        ({}, {"headers": {"To": " , "}}, "'To'"),
        ({}, {"headers": {"To": "not-an-address"}}, "'To' header"),
        ({"to": ["ops@example.com"]}, {"headers": {"to": "a@example.com, nope"}}, "'To' header"),
        ({"to": ["ops@example.com"]}, {"body": b"\xff\xfe"}, "UTF-8"),
    ],
)
def test_messages_that_cannot_be_emails_are_refused_at_send(redis, options, kwargs, match):
    with mail_settings(ops={"OPTIONS": options}), pytest.raises(outbox.InvalidMessage, match=match):
        outbox.send("ops", kwargs.pop("body", "hi"), **kwargs)
    assert redis.dbsize() == 0


class SendsNothing(BaseEmailBackend):
    """An email backend that accepts messages and sends none (a silent failure)."""

    def send_messages(self, email_messages):
        return 0


def test_a_backend_that_sends_nothing_is_retried(mailbox, worker):
    with mail_settings(ops={"OPTIONS": {"to": ["ops@example.com"], "backend": f"{__name__}.SendsNothing"}}):
        m = outbox.send("ops", "hi", max_retries=1)
        worker(simple=True)
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == ("failed", 1)
    assert "0 messages sent" in got.last_error and mailbox == []


# -- a real SMTP server ---------------------------------------------------------------------------


def test_smtp_delivery(smtp, worker, repo):
    with mail_settings(ops=smtp_destination(to=["ops@example.com"], subject="Order 42")):
        m = outbox.send("ops", "<h1>Order 42</h1>", content_type="text/html")
        worker()
    assert outbox.get(m.id).status == "succeeded"
    ((sender, recipients, _),) = smtp.messages
    assert (sender, recipients) == ("shop@example.com", ["ops@example.com"])
    (received,) = smtp.received()
    assert received["Subject"] == "Order 42" and received["X-Outbox-Message-Id"] == m.id
    assert received.get_content_type() == "text/html" and "<h1>Order 42</h1>" in received.get_content()
    assert_index_invariant(repo)


def test_smtp_recipient_refused_with_550_fails_at_once(smtp, worker, repo):
    smtp.rcpt["gone@example.com"] = ["550 5.1.1 no such user"]
    with mail_settings(ops=smtp_destination(to=["gone@example.com"])):
        m = outbox.send("ops", "hello")
        worker()
    got = outbox.get(m.id)
    assert (got.status, got.retry_count, got.last_status_code) == ("failed", 0, None)
    assert (
        "550" in got.last_error and "no such user" in got.last_error and "gone@example.com" in got.last_error
    )
    assert smtp.seen_rcpt == {"gone@example.com": 1} and smtp.messages == []
    assert_index_invariant(repo)


def test_smtp_greylisting_451_is_retried(smtp, worker):
    smtp.rcpt["grey@example.com"] = ["451 4.7.1 greylisted, try again later", "250 2.1.5 OK"]
    with mail_settings(ops=smtp_destination(to=["grey@example.com"])):
        m = outbox.send("ops", "hello")
        worker()
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == ("succeeded", 1)
    _, first = outbox.attempts(m.id)
    assert first.outcome == "retrying" and "451" in first.error
    assert len(smtp.messages) == 1


def test_smtp_one_recipient_refused_of_two_is_still_sent(smtp, worker):
    smtp.rcpt["gone@example.com"] = ["550 5.1.1 no such user"]
    with mail_settings(ops=smtp_destination(to=["ops@example.com", "gone@example.com"])):
        m = outbox.send("ops", "hello")
        worker()
    assert outbox.get(m.id).status == "succeeded"
    ((_, recipients, _),) = smtp.messages
    assert recipients == ["ops@example.com"]


def test_smtp_data_rejected_with_554_fails_at_once(smtp, worker):
    smtp.data_reply = "554 5.7.1 message rejected as spam"
    with mail_settings(ops=smtp_destination(to=["ops@example.com"])):
        m = outbox.send("ops", "buy now")
        worker()
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == ("failed", 0)
    assert "554" in got.last_error and "spam" in got.last_error


def test_smtp_service_unavailable_is_retried(smtp, worker):
    smtp.greeting = "421 4.3.2 service shutting down"
    with mail_settings(ops=smtp_destination(to=["ops@example.com"])):
        m = outbox.send("ops", "hello", max_retries=1)
        worker()
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == ("failed", 1)  # retried once, then out of retries
    assert [a.outcome for a in outbox.attempts(m.id)] == ["failed", "retrying"]
    assert "421" in got.last_error and smtp.connections == 2


def test_smtp_connection_refused_is_retried(worker):
    port = free_port()
    with (
        override_settings(EMAIL_HOST="127.0.0.1", EMAIL_PORT=port, EMAIL_TIMEOUT=2),
        mail_settings(ops=smtp_destination(to=["ops@example.com"])),
    ):
        m = outbox.send("ops", "hello", max_retries=1)
        worker()
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == ("failed", 1)
    assert "ConnectionRefusedError" in got.last_error


# -- options ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options,match",
    [
        ({"to": "ops@example.com"}, "OPTIONS\\['to'\\] must be a list"),
        ({"to": None}, "OPTIONS\\['to'\\] must be a list"),
        ({"to": ["nope"]}, "OPTIONS\\['to'\\] must be a list"),
        ({"to": ["a@example.com\nBcc: x@example.com"]}, "OPTIONS\\['to'\\]"),
        ({"from_email": "shop"}, "OPTIONS\\['from_email'\\]"),
        ({"subject": "two\nlines"}, "OPTIONS\\['subject'\\]"),
        ({"subject": 5}, "OPTIONS\\['subject'\\]"),
        ({"backend": "no.such.Backend"}, "OPTIONS\\['backend'\\] 'no.such.Backend' cannot be imported"),
        ({"backend": 3}, "OPTIONS\\['backend'\\]"),
        ({"cc": ["a@example.com"]}, "unknown option\\(s\\) for EmailTransport: cc"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ImproperlyConfigured, match=match):
        EmailTransport("ops", **options)
    with mail_settings(ops={"OPTIONS": options}):
        errors = [e for e in check_outbox_settings() if e.id == "outbox.E002"]
    assert len(errors) == 1 and "destination 'ops'" in errors[0].msg


def test_good_options():
    transport = EmailTransport(
        "ops",
        to=("Ops <ops@example.com>",),
        from_email="Shop <shop@example.com>",
        subject="S",
        backend=SMTP_BACKEND,
    )
    assert transport.to == ["Ops <ops@example.com>"] and transport.backend == SMTP_BACKEND


# -- Django 6.1's MAILERS ---------------------------------------------------------------------------


@pytest.mark.skipif(
    not HAS_MAILERS, reason="MAILERS is Django 6.1's (this Django has no django.core.mail.mailers)"
)
def test_a_mailers_alias_delivers_without_deprecated_calls(smtp, worker, recwarn):
    mailers = {
        "default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"},
        "transactional": {
            "BACKEND": SMTP_BACKEND,
            "OPTIONS": {"host": "127.0.0.1", "port": smtp.port, "timeout": 5},
        },
    }
    with (
        override_settings(MAILERS=mailers),
        with_destinations(
            "email",
            ops={
                "OPTIONS": {
                    "mailer": "transactional",
                    "to": ["ops@example.com"],
                    "from_email": "a@example.com",
                }
            },
        ),
    ):
        m = outbox.send("ops", "hello")
        worker(simple=True)
    assert outbox.get(m.id).status == "succeeded"
    assert len(smtp.messages) == 1
    ours = [w for w in recwarn if "RemovedInDjango" in type(w.message).__name__ and "/outbox/" in w.filename]
    assert ours == []


@pytest.mark.skipif(HAS_MAILERS, reason="before Django 6.1 there is no MAILERS to name")
def test_a_mailer_option_needs_django_6_1():
    with pytest.raises(ImproperlyConfigured, match="needs Django 6.1"):
        EmailTransport("ops", mailer="transactional", to=["ops@example.com"])
