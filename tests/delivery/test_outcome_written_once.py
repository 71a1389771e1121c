"""Issue 31, item 6 (and item 1 for the same case): an outcome written twice by a run's
retried exchange is logged, reported and announced as what it was, once.

A run writes its decided outcomes together with its next claim (``WorkerRun.write_and_claim``) and
retries the whole round trip when Redis answers with an error. When the first try had
applied the outcomes (its reply lost on the way, or, with partitions, a later step of the
exchange failing after the transitions), the second try found the messages no longer
``sending`` under this lease and the worker logged ``outcome=stale`` for a message that
had succeeded at its single delivery, with no ``message_succeeded`` signal at all.

The errors are injected at the client, after the real scripts ran on the real Redis
(the single test server with 1 or 16 partitions, or the real cluster)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
from collections.abc import Iterator

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import outbox
from outbox import events
from outbox.delivery import loop
from outbox.records import Status
from outbox.store import get_repository
from tests.support import with_destinations

PARTITIONS = 16


@pytest.fixture(params=["one", "p16", "cluster"])
def layout(request, settings):
    """The outbox with one partition, 16 on the single server, or on the real cluster;
    one attempt at a time (each exchange writes one outcome and claims the next)."""
    if request.param == "cluster":
        request.getfixturevalue("cluster_mode")
    elif request.param == "p16":
        settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": PARTITIONS}
    settings.OUTBOX = {**settings.OUTBOX, "CONCURRENCY": 1}
    get_repository.cache_clear()
    yield request.param
    get_repository.cache_clear()


def losing(monkeypatch, step: str) -> list[str]:
    """Make the first script round trip holding a ``step`` call (that runs after an
    outcome's transition: in the same round trip, or a later one of the same exchange)
    raise a ``ConnectionError`` after it ran: its reply lost. Returns the steps lost."""
    cls = type(get_repository())
    real = cls.run_scripts
    seen: list[str] = []
    lost: list[str] = []

    def run_scripts(self, calls, client=None, *, errors=False):
        replies = real(self, calls, client, errors=errors)
        names = [call[0] for call in calls]
        if "transition" in names:
            seen.append("transition")
        if not lost and seen and step in names:
            lost.append(step)
            raise RedisConnectionError("injected: the reply was lost")
        return replies

    monkeypatch.setattr(cls, "run_scripts", run_scripts)
    return lost


def attempt_lines(caplog) -> dict[str, list[str]]:
    """Per message id, the outcomes its ``outbox attempt`` log lines gave."""
    lines: dict[str, list[str]] = {}
    for r in caplog.records:
        found = re.match(r"outbox attempt id=(\S+) .*outcome=(\S+)", r.getMessage())
        if found:
            lines.setdefault(found[1], []).append(found[2])
    return lines


@contextlib.contextmanager
def announced(signal) -> Iterator[list[str]]:
    """The ids of the messages ``signal`` is sent for while in the block."""
    got: list[str] = []

    def handler(sender, message, **kwargs):
        got.append(message.id)

    signal.connect(handler)
    try:
        yield got
    finally:
        signal.disconnect(handler)


def fails(message):
    raise RuntimeError("refused")


@pytest.mark.parametrize("step", ["transition", "gate"])
def test_a_success_whose_write_was_repeated_is_logged_and_announced_once(layout, step, monkeypatch, caplog):
    """Three messages, each delivered once; the exchange writing the first outcome is
    retried after its transitions applied: the reply of the round trip holding them lost
    (``transition``), or with partitions the gate step after it failing (``gate``)."""
    if step == "gate" and layout == "one":
        pytest.skip("one partition: the transitions and the claim are one round trip")
    sent = outbox.send_many([{"destination": "mem", "body": i} for i in range(3)])
    lost = losing(monkeypatch, step)
    with announced(events.message_succeeded) as succeeded, caplog.at_level(logging.INFO, logger="outbox"):
        report = loop.run(sent[0].queue)
    assert lost == [step], "no reply was lost: the test tested nothing"
    assert {outbox.get(m.id).status for m in sent} == {Status.SUCCEEDED.value}
    assert all(len(outbox.attempts(m.id)) == 1 for m in sent)
    assert attempt_lines(caplog) == {m.id: ["succeeded"] for m in sent}
    assert report.outcomes == {m.id: "succeeded" for m in sent}
    assert sorted(succeeded) == sorted(m.id for m in sent)


def test_a_retry_whose_write_was_repeated_is_logged_and_announced_once(layout, monkeypatch, caplog):
    """A failure decided ``retrying``: its write repeated after the reply was lost is
    logged as ``retrying`` once, announced once, and charged one retry."""
    with with_destinations("callable", retry=(60,), fn={"OPTIONS": {"path": f"{__name__}.fails"}}):
        m = outbox.send("fn", {"a": 1})
        lost = losing(monkeypatch, "transition")
        with announced(events.message_retrying) as retried, caplog.at_level(logging.INFO, logger="outbox"):
            report = loop.run(m.queue)
    assert lost == ["transition"]
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == (Status.RETRYING.value, 1)
    assert attempt_lines(caplog) == {m.id: ["retrying"]}
    assert report.outcomes == {m.id: "retrying"}
    assert retried == [m.id]


def test_an_outcome_that_lost_its_lease_is_still_stale(layout, caplog):
    """``stale`` stays for what really lost: the message was taken back and claimed by
    another lease before the outcome was written."""
    from outbox.delivery.outcomes import decide, rules_for
    from outbox.records import Outcome

    m = outbox.send("mem", {"a": 1})
    (claimed,) = loop.claim(m.queue)
    repo = get_repository()
    repo.connection.hset(repo.keys.resend(m.id), "lease", "another-worker")
    state = loop.WorkerRun(m.queue, repo, 1.0)
    outcome = Outcome(claimed, claimed.created_at, 1.0, ok=True)
    decision = decide(outcome, claimed.created_at, rules_for(claimed))
    state.decided.append(dataclasses.replace(decision, outcome=outcome))
    with announced(events.message_succeeded) as succeeded, caplog.at_level(logging.INFO, logger="outbox"):
        state.write_and_claim(0)
    assert attempt_lines(caplog) == {m.id: ["stale"]}
    assert state.report.outcomes == {m.id: "stale"}
    assert succeeded == []
    assert outbox.get(m.id).status == Status.SENDING.value


def test_a_parked_outcome_whose_write_was_repeated_is_logged_parked_once(layout, monkeypatch, caplog):
    """A failure written as its park alternative (the destination paused meanwhile), the
    reply lost: logged ``parked`` once, no retry charged, no signal (as when not lost)."""
    from outbox.delivery.outcomes import decide, rules_for
    from outbox.destinations import controls
    from outbox.records import Outcome

    m = outbox.send("mem", {"a": 1})
    (claimed,) = loop.claim(m.queue)
    controls.pause("mem")
    repo = get_repository()
    state = loop.WorkerRun(m.queue, repo, 1.0)
    outcome = Outcome(claimed, claimed.created_at, 1.0, error="HTTP 500", error_class="http")
    decision = decide(outcome, claimed.created_at, rules_for(claimed))
    state.decided.append(dataclasses.replace(decision, outcome=outcome))
    lost = losing(monkeypatch, "transition")
    with announced(events.message_retrying) as retried, caplog.at_level(logging.INFO, logger="outbox"):
        state.write_and_claim(0)
    assert lost == ["transition"]
    assert attempt_lines(caplog) == {m.id: ["parked"]}
    assert state.report.outcomes == {m.id: "parked"}
    assert retried == []
    got = outbox.get(m.id)
    assert (got.status, got.retry_count) == (Status.PENDING.value, 0)
    assert [a.outcome for a in outbox.attempts(m.id)] == ["parked"]
