"""outbox.testing: deliver_all(), SentMessages and the EAGER setting (issue 9: testing a
project that uses the outbox without this repository's private run_worker())."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

import outbox
from outbox.testing import SentMessages, deliver_all

LATER = {"strategy": "schedule", "delays": [60]}  # a retry a minute later: not due within the test


def test_deliver_all_delivers_what_is_due_in_process(hook):
    sent = [outbox.send("hook", {"n": i}) for i in range(3)]
    report = deliver_all()
    assert (report.succeeded, report.attempts) == (3, 3)
    assert {outbox.get(m.id).status for m in sent} == {"succeeded"}
    assert len(hook.requests) == 3


def test_deliver_all_leaves_future_work_unless_asked(hook):
    hook.respond(503, 200)
    m = outbox.send("hook", {"n": 1}, retry=LATER)
    later = outbox.send("hook", {"n": 2}, delay=3600)
    first = deliver_all()
    assert (first.retrying, outbox.get(m.id).status, outbox.get(later.id).status) == (
        1,
        "retrying",
        "pending",
    )
    second = deliver_all(include_future=True)
    assert second.succeeded == 2
    assert (outbox.get(m.id).status, outbox.get(later.id).status) == ("succeeded", "succeeded")
    assert outbox.get(m.id).retry_count == 1  # the retry was spent, not reset


def test_deliver_all_with_include_future_ends_a_failing_message_as_a_dead_letter(hook):
    hook.respond(500)
    m = outbox.send("hook", {"n": 1}, max_retries=3, retry=LATER)
    report = deliver_all(include_future=True)
    got = outbox.get(m.id)
    assert (got.status, got.retry_count, report.attempts, report.failed) == ("failed", 3, 4, 1)


@pytest.mark.django_db
def test_messages_sent_inside_the_test_transaction_are_seen_and_delivered(hook):
    """pytest-django wraps the test in a transaction whose on-commit callbacks never run:
    the message stays captured in the database; SentMessages sees it, deliver_all pushes
    and delivers it."""
    seen = SentMessages()
    with transaction.atomic():
        m = outbox.send("hook", {"order": 7})
    assert outbox.get(m.id).status == "pending"
    assert [x.id for x in seen.assert_sent("hook", count=1, body={"order": 7})] == [m.id]
    assert deliver_all().succeeded == 1
    assert outbox.get(m.id).status == "succeeded"
    assert len(hook.requests) == 1


def test_sent_messages_assertions(hook):
    seen = SentMessages()
    seen.assert_nothing_sent()
    outbox.send("hook", {"a": 1}, headers={"X-Trace": "t1"})
    outbox.send("hook", "plain text", content_type="text/plain")
    assert len(seen) == 2
    seen.assert_sent("hook", count=1, body={"a": 1}, headers={"X-Trace": "t1"})
    seen.assert_sent("hook", body="plain text")
    with pytest.raises(AssertionError, match="expected 3 message"):
        seen.assert_sent("hook", count=3)
    with pytest.raises(AssertionError, match="found 0"):
        seen.assert_sent("hook", body={"a": 2})
    with pytest.raises(AssertionError, match="expected no message"):
        seen.assert_nothing_sent("hook")
    seen.reset()
    seen.assert_nothing_sent()


def test_eager_delivers_inside_send(hook):
    with override_settings(OUTBOX={**_outbox(), "EAGER": True}):
        m = outbox.send("hook", {"n": 1})
        assert outbox.get(m.id).status == "succeeded"
        assert len(hook.requests) == 1
        many = outbox.send_many([{"destination": "hook", "body": {"n": i}} for i in range(3)])
        assert {outbox.get(x.id).status for x in many} == {"succeeded"}


def test_eager_records_a_failure_and_leaves_the_retry_waiting(hook):
    hook.respond(503)
    with override_settings(OUTBOX={**_outbox(), "EAGER": True}):
        m = outbox.send("hook", {"n": 1}, retry=LATER)
        got = outbox.get(m.id)
        assert (got.status, got.retry_count, got.last_status_code) == ("retrying", 1, 503)
        assert len(hook.requests) == 1


@pytest.mark.django_db
def test_eager_inside_a_transaction_delivers_at_send_time(hook):
    with override_settings(OUTBOX={**_outbox(), "EAGER": True}), transaction.atomic():
        m = outbox.send("hook", {"n": 1})
        assert outbox.get(m.id).status == "succeeded"


def test_eager_send_returns_the_message_as_the_attempt_left_it(hook):
    """docs/testing.md: in eager mode the returned message is already succeeded (or
    retrying / failed, with its attempt), not the pending message that was written."""
    hook.respond(200, 503, 400)  # in turn, one per request; the last repeats
    with override_settings(OUTBOX={**_outbox(), "EAGER": True}):
        m = outbox.send("hook", {"n": 1})
        assert (m.status, m.retry_count) == ("succeeded", 0)
        assert m == outbox.get(m.id)
        retrying = outbox.send("hook", {"n": 2}, retry=LATER)
        assert (retrying.status, retrying.retry_count, retrying.last_status_code) == ("retrying", 1, 503)
        # (both get a 400: a batch's attempts run in parallel, in no fixed order)
        many = outbox.send_many([{"destination": "hook", "body": {"n": n}} for n in (3, 4)])
        assert [(x.status, x.last_status_code) for x in many] == [("failed", 400)] * 2
        later = outbox.send("hook", {"n": 5}, delay=3600)
        assert later.status == "pending"  # not due: no attempt


def test_rq_async_false_delivers_inside_send(hook, settings):
    """RQ runs a job inside enqueue when its queue has ASYNC=False: the wake-up job then
    delivers what is due, so send() returns with the message delivered (each time)."""
    queues = {name: {**conf, "ASYNC": False} for name, conf in settings.RQ_QUEUES.items()}
    with override_settings(RQ_QUEUES=queues):
        for n in range(3):
            m = outbox.send("hook", {"n": n})
            assert outbox.get(m.id).status == "succeeded"
    assert len(hook.requests) == 3


def _outbox():
    from django.conf import settings

    return dict(settings.OUTBOX)
