"""Every attempt has a hard deadline its transport enforces, and outbox.W003 compares it
with half the lease (issue 11). The webhook's is tested in test_webhook_hostile_receivers.py."""

from __future__ import annotations

import contextvars
import socketserver
import threading
import time

import pytest
from django.test import override_settings

import outbox
from outbox.checks import check_outbox_settings
from outbox.exceptions import DeliveryError
from outbox.transports.base import Transport
from outbox.transports.callable import DEFAULT_DEADLINE, CallableTransport
from outbox.transports.email import DEFAULT_TIMEOUT, EmailTransport
from outbox.transports.locmem import LocmemTransport
from outbox.transports.webhook import WebhookTransport
from tests.support import serving, with_destinations

release = threading.Event()


def hangs(message):
    release.wait(10)


def quick(message):
    return None


class SilentSMTP(socketserver.BaseRequestHandler):
    """Accepts a connection and never greets (an SMTP server that hangs)."""

    def handle(self):
        release.wait(10)


class DrippingSMTP(socketserver.BaseRequestHandler):
    """Greets one byte every 0.2 s: each read succeeds, so a socket timeout never fires."""

    def handle(self):
        try:
            for byte in b"220-" + b"x" * 100:
                if release.is_set():
                    return
                self.request.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass


@pytest.fixture(autouse=True)
def released():
    release.clear()
    yield
    release.set()


def smtp_settings(port: int, **options) -> override_settings:
    return override_settings(
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=port,
        EMAIL_TIMEOUT=None,
    )


def email_message() -> outbox.Message:
    return outbox.Message(id="msg_1", destination="mail", body=b"hi", content_type="text/plain", headers={})


def test_email_has_a_finite_socket_timeout_when_email_timeout_is_none(settings):
    settings.EMAIL_TIMEOUT = None
    transport = EmailTransport("mail", to=["a@example.com"])
    assert transport.timeout == DEFAULT_TIMEOUT and transport.longest_attempt() == 3 * DEFAULT_TIMEOUT
    settings.EMAIL_TIMEOUT = 4
    assert EmailTransport("mail", to=["a@example.com"]).timeout == 4


def test_a_silent_smtp_server_times_out_on_the_socket_timeout():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), SilentSMTP)
    with serving(server), smtp_settings(server.server_address[1]):
        transport = EmailTransport("mail", to=["a@example.com"], timeout=0.5, deadline=5)
        started = time.monotonic()
        with pytest.raises(DeliveryError) as info:
            transport.deliver(email_message())
        elapsed = time.monotonic() - started
        release.set()
    assert not info.value.permanent
    assert elapsed < 1.5, elapsed


def test_a_dripping_smtp_server_is_given_up_at_the_deadline():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), DrippingSMTP)
    with serving(server), smtp_settings(server.server_address[1]):
        transport = EmailTransport("mail", to=["a@example.com"], timeout=0.5, deadline=1)
        started = time.monotonic()
        with pytest.raises(DeliveryError, match="1s deadline") as info:
            transport.deliver(email_message())
        elapsed = time.monotonic() - started
        release.set()
    assert not info.value.permanent
    assert elapsed < 1.5, elapsed


def one_hung_attempt(worker, destination: str, transport: str | None = None, **entry):
    """Send one message to ``destination`` (which hangs until ``release``), let a worker
    run one job, and return the message as stored and the seconds the job took."""
    with with_destinations(transport, max_retries=1, retry=(60,), **{destination: entry}):
        m = outbox.send(destination, {"a": 1})
        started = time.monotonic()
        worker(simple=True, max_jobs=1)
        elapsed = time.monotonic() - started
    release.set()
    return outbox.get(m.id), elapsed


def test_a_callable_that_hangs_is_given_up_at_its_deadline(worker):
    options = {"path": f"{__name__}.hangs", "deadline": 0.5}
    got, elapsed = one_hung_attempt(worker, "fn", "callable", OPTIONS=options)
    assert got.status == "retrying" and "0.5s deadline" in got.last_error
    assert elapsed < 3, elapsed


class Stuck(Transport):
    """A transport that declares a deadline and does not keep it."""

    def deliver(self, message):
        release.wait(10)

    def longest_attempt(self):
        return 0.3


def test_the_run_gives_up_an_attempt_its_transport_does_not_end_at_its_deadline(worker):
    got, elapsed = one_hung_attempt(worker, "stuck", TRANSPORT=f"{__name__}.Stuck")
    assert got.status == "retrying", got.status
    assert "'stuck' did not finish within its 0.3s deadline" in got.last_error
    assert outbox.attempts(got.id)[0].error_class == "deadline"
    assert elapsed < 3, elapsed


threads_seen: list[str] = []


def where(message):
    threads_seen.append(threading.current_thread().name)


def test_a_worker_runs_a_callable_in_its_attempt_thread_not_a_helper(worker):
    """Watched by the run, the callable needs no helper thread (two thread wake-ups
    fewer per attempt); called outside a run, it still gets one."""
    threads_seen.clear()
    fn = {"OPTIONS": {"path": f"{__name__}.where"}}
    with with_destinations("callable", fn=fn):
        m = outbox.send("fn", {"a": 1})
        worker(simple=True, max_jobs=1)
        assert outbox.get(m.id).status == "succeeded"
        CallableTransport("fn", path=f"{__name__}.where").deliver(email_message())
    assert threads_seen[0].startswith("outbox-attempt"), threads_seen
    assert threads_seen[1].startswith("outbox-deadline"), threads_seen


seen_var = contextvars.ContextVar("seen_var", default="unset")
seen_values: list[str] = []


def sets_a_context_var(message):
    seen_values.append(seen_var.get())
    seen_var.set(message.id)


def test_context_variables_a_callable_sets_do_not_carry_over_to_the_next_attempt(worker, settings):
    seen_values.clear()
    settings.OUTBOX = {**settings.OUTBOX, "CONCURRENCY": 1}
    fn = {"OPTIONS": {"path": f"{__name__}.sets_a_context_var"}}
    with with_destinations("callable", fn=fn):
        outbox.send("fn", {"a": 1})
        outbox.send("fn", {"a": 2})
        worker(simple=True, max_jobs=1)
    assert seen_values == ["unset", "unset"]


def test_a_callable_within_its_deadline_delivers():
    transport = CallableTransport("fn", path=f"{__name__}.quick")
    assert transport.longest_attempt() == DEFAULT_DEADLINE
    transport.deliver(email_message())


class NoDeadline(Transport):
    def deliver(self, message):
        return None


@pytest.mark.parametrize(
    "entry,warns",
    [
        ({"TRANSPORT": "callable", "OPTIONS": {"path": f"{__name__}.quick", "deadline": 16}}, True),
        ({"TRANSPORT": "callable", "OPTIONS": {"path": f"{__name__}.quick", "deadline": 15}}, False),
        ({"TRANSPORT": "email", "OPTIONS": {"to": ["a@example.com"], "timeout": 10}}, True),  # 30 s
        ({"TRANSPORT": "email", "OPTIONS": {"to": ["a@example.com"], "timeout": 10, "deadline": 14}}, False),
        ({"TRANSPORT": "webhook", "OPTIONS": {"url": "http://x/", "timeout": 1, "deadline": 20}}, True),
        ({"TRANSPORT": "webhook", "OPTIONS": {"url": "http://x/", "timeout": 60, "deadline": 15}}, False),
        ({"TRANSPORT": "locmem"}, False),
        ({"TRANSPORT": f"{__name__}.NoDeadline"}, True),
    ],
)
def test_w003_compares_every_transports_deadline_with_half_the_lease(settings, entry, warns):
    settings.OUTBOX = {**settings.OUTBOX, "DESTINATIONS": {"d": entry}, "VISIBILITY_TIMEOUT": 30}
    found = [e for e in check_outbox_settings() if e.id == "outbox.W003"]
    assert bool(found) == warns, found


def test_every_builtin_transport_declares_its_deadline():
    assert WebhookTransport("w", url="http://x/").longest_attempt() == 25
    assert LocmemTransport("m").longest_attempt() == 1.0
    assert NoDeadline("n").longest_attempt() is None


def leaks(message):
    raise RuntimeError(f"auth failed for {message.headers['Authorization']}")


def test_a_callables_error_text_is_redacted(redis):
    transport = CallableTransport("fn", path=f"{__name__}.leaks")
    leaky = outbox.Message(
        id="msg_1",
        destination="fn",
        body=b"",
        content_type="a/b",
        headers={"Authorization": "Bearer CALLABLE-SECRET"},
    )
    with pytest.raises(DeliveryError) as info:
        transport.deliver(leaky)
    assert str(info.value).startswith("RuntimeError: auth failed for") and "CALLABLE-SECRET" not in str(
        info.value
    )
