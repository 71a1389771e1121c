"""The callable transport: a dotted-path function, called by a real RQ worker in this process."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

import outbox
from outbox.checks import check_outbox_settings
from outbox.exceptions import DeliveryError
from outbox.transports import DeliveryResult
from outbox.transports.callable import CallableTransport
from tests.support import assert_index_invariant, with_destinations

calls: list[outbox.Message] = []
statuses: list[str] = []  # the message's status when the function was called


def record(message):
    calls.append(message)
    statuses.append(message.status)


def record_with_result(message):
    calls.append(message)
    return DeliveryResult(status_code=202, detail="queued")


def refuse(message):
    calls.append(message)
    raise DeliveryError("account closed", permanent=True, status_code=410)


def flaky(message):
    calls.append(message)
    if len(calls) == 1:
        raise ValueError("database is busy")


def busy(message):
    calls.append(message)
    raise DeliveryError("rate limited", retry_after=90)


def no_arguments():
    pass


def two_arguments(message, other):
    pass


class NotAFunction:
    pass


@pytest.fixture(autouse=True)
def clean_calls():
    calls.clear()
    statuses.clear()
    yield
    calls.clear()


def with_function(name: str, **entry) -> override_settings:
    return with_destinations(
        "callable", max_retries=2, fn={"OPTIONS": {"path": f"{__name__}.{name}"}, **entry}
    )


def test_success(worker, repo):
    with with_function("record"):
        m = outbox.send("fn", {"order": 1}, headers={"X-Trace": "t"})
        worker(simple=True)
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == ("succeeded", 0)
    (called,) = calls
    assert called.id == m.id and called.json() == {"order": 1} and called.headers == {"X-Trace": "t"}
    assert statuses == ["sending"]  # it is called while the message is claimed
    assert_index_invariant(repo)


def test_a_returned_delivery_result_is_recorded(worker):
    with with_function("record_with_result"):
        m = outbox.send("fn", "hi")
        worker(simple=True)
    got = outbox.get(m.id)
    assert (got.status, got.last_status_code) == ("succeeded", 202)
    assert outbox.attempts(m.id)[0].status_code == 202


def test_permanent_delivery_error_fails_at_once(worker, repo):
    with with_function("refuse"):
        m = outbox.send("fn", "hi")
        worker(simple=True)
    got = outbox.get(m.id)
    assert (got.status, got.retry_count, got.last_error, got.last_status_code) == (
        "failed",
        0,
        "account closed",
        410,
    )
    assert len(calls) == 1
    assert_index_invariant(repo)


def test_other_exceptions_are_retried_with_their_text_recorded(worker):
    with with_function("flaky"):
        m = outbox.send("fn", "hi")
        worker(simple=True)
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == ("succeeded", 1)
    later, first = outbox.attempts(m.id)
    assert (first.outcome, first.error) == ("retrying", "ValueError: database is busy")
    assert (later.outcome, later.error) == ("succeeded", "")
    assert len(calls) == 2 and calls[0].id == calls[1].id == m.id


def test_retry_after_from_a_delivery_error_is_honoured(worker):
    with with_function("busy"):
        m = outbox.send("fn", "hi")
        worker(simple=True)
    got = outbox.get(m.id)
    assert (got.status, got.last_error) == ("retrying", "rate limited")
    assert got.next_attempt_at - got.last_attempt_at >= 90
    assert len(calls) == 1


@pytest.mark.parametrize(
    "options,match",
    [
        ({}, "needs OPTIONS\\['path'\\]"),
        ({"path": ""}, "needs OPTIONS\\['path'\\]"),
        ({"path": 5}, "needs OPTIONS\\['path'\\]"),
        ({"path": "nodots"}, "cannot import"),
        ({"path": "tests.no_such_module.f"}, "cannot import"),
        ({"path": f"{__name__}.no_such_function"}, "cannot import"),
        ({"path": "outbox.conf.PRIORITIES"}, "is not a function"),
        ({"path": f"{__name__}.NotAFunction"}, "is not a function"),
        ({"path": f"{__name__}.no_arguments"}, "must take one argument"),
        ({"path": f"{__name__}.two_arguments"}, "must take one argument"),
        (
            {"path": f"{__name__}.record", "timeout": 1},
            "unknown option\\(s\\) for CallableTransport: timeout",
        ),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ImproperlyConfigured, match=match):
        CallableTransport("fn", **options)
    config = {**settings.OUTBOX, "DESTINATIONS": {"fn": {"TRANSPORT": "callable", "OPTIONS": options}}}
    with override_settings(OUTBOX=config):
        errors = [e for e in check_outbox_settings() if e.id == "outbox.E002"]
    assert len(errors) == 1 and "destination 'fn'" in errors[0].msg


def test_builtin_without_signature_is_accepted():
    assert CallableTransport("fn", path="builtins.print").function is print


def test_delivery_result_detail_reaches_the_attempt_history(worker):
    with with_function("record_with_result"):
        m = outbox.send("fn", "hi")
        worker(simple=True)
    (attempt,) = outbox.attempts(m.id)
    assert getattr(attempt, "detail", None) == "queued"
