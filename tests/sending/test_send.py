"""send() and send_many(): validation at the boundary, one round trip, idempotency, transactions."""

import dataclasses
import inspect
from datetime import date, timedelta

import pytest
import redis.connection
from django.db import transaction

import outbox
from outbox.exceptions import InvalidMessage, MessageTooLarge, UnknownDestination
from outbox.sending.validation import SendArguments
from tests.support import assert_index_invariant


def nothing_written(repo):
    return repo.connection.dbsize() == 0


@pytest.mark.parametrize(
    "kwargs,error,field",
    [
        ({"destination": "nowhere"}, UnknownDestination, "destination"),
        ({"body": object()}, InvalidMessage, "body"),
        ({"body": {"x": float("nan")}}, InvalidMessage, "body"),
        ({"body": "\ud800"}, InvalidMessage, "body"),
        ({"content_type": "not a type"}, InvalidMessage, "content_type"),
        ({"headers": {"Bad Name": "x"}}, InvalidMessage, "headers"),
        ({"headers": {"X-Ok": "a\r\nInjected: 1"}}, InvalidMessage, "headers"),
        ({"headers": {"X-Ok": 5}}, InvalidMessage, "headers"),
        ({"headers": {"webhook-id": "mine"}}, InvalidMessage, "headers"),
        ({"headers": {"X-A": "1", "x-a": "2"}}, InvalidMessage, "headers"),
        ({"headers": ["X-A"]}, InvalidMessage, "headers"),
        ({"idempotency_key": ""}, InvalidMessage, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, InvalidMessage, "idempotency_key"),
        ({"max_retries": -1}, InvalidMessage, "max_retries"),
        ({"max_retries": 1001}, InvalidMessage, "max_retries"),
        ({"max_retries": "3"}, InvalidMessage, "max_retries"),
        ({"retry": {"base": -5}}, InvalidMessage, "retry"),
        ({"retry": {"jitter": "lots"}}, InvalidMessage, "retry"),
        ({"delay": -1}, InvalidMessage, "delay"),
        ({"delay": float("inf")}, InvalidMessage, "delay"),
        ({"delay": "5"}, InvalidMessage, "delay"),
        ({"priority": "urgent"}, InvalidMessage, "priority"),
    ],
)
def test_bad_input_fails_clearly_and_writes_nothing(repo, kwargs, error, field):
    args = {"destination": "mem", "body": {"ok": 1}, **kwargs}
    with pytest.raises(error) as info:
        outbox.send(args.pop("destination"), args.pop("body"), **args)
    assert info.value.field == field
    assert str(info.value)
    assert isinstance(info.value, ValueError)
    assert nothing_written(repo)


def test_oversize_body_is_refused(repo, settings):
    settings.OUTBOX = {**settings.OUTBOX, "MAX_BODY_BYTES": 100}
    outbox.send("mem", b"x" * 100)
    repo.connection.flushdb()
    with pytest.raises(MessageTooLarge) as info:
        outbox.send("mem", b"x" * 101)
    assert (info.value.size, info.value.limit) == (101, 100)
    assert nothing_written(repo)


def test_body_types_and_content_types(repo):
    assert outbox.send("mem", b"\x00\x01").content_type == "application/octet-stream"
    text = outbox.send("mem", "héllo")
    assert text.content_type == "text/plain; charset=utf-8" and text.body == "héllo".encode()
    data = outbox.send("mem", {"when": date(2026, 1, 2)})
    assert data.content_type == "application/json" and data.json() == {"when": "2026-01-02"}
    assert outbox.send("mem", "<b>x</b>", content_type="text/html").content_type == "text/html"


def test_send_many_validates_everything_before_writing(repo):
    items = [{"destination": "mem", "body": i} for i in range(5)] + [{"destination": "mem", "body": object()}]
    with pytest.raises(InvalidMessage, match="item 5"):
        outbox.send_many(items)
    assert nothing_written(repo)
    with pytest.raises(InvalidMessage, match="item 0"):
        outbox.send_many([{"destination": "mem"}])
    with pytest.raises(InvalidMessage, match="twice"):
        outbox.send_many([{"destination": "mem", "body": 1, "idempotency_key": "a"}] * 2)
    assert nothing_written(repo)


def test_send_many_writes_all_and_wakes_each_queue_once(repo):
    messages = outbox.send_many(
        [{"destination": "mem", "body": i, "priority": "low" if i % 5 == 0 else None} for i in range(25)]
    )
    assert len({m.id for m in messages}) == 25
    assert repo.count("pending") == 25
    from outbox.store.background.wakeups import get_queue

    queue, low = get_queue("outbox"), get_queue("outbox_low")
    assert queue.count == 1 and low.count == 1  # one wake-up job per queue, not per message
    assert queue.jobs[0].args == ("outbox",) and queue.jobs[0].result_ttl == 0
    part = repo.keys.of(messages[0].id)  # a call's messages without a key share a partition
    assert (
        repo.connection.zcard(part.due("outbox")) == 20 and repo.connection.zcard(part.due("outbox_low")) == 5
    )
    assert_index_invariant(repo)


def test_send_enqueues_a_job_only_when_none_is_waiting(repo):
    from outbox.store.background.wakeups import get_queue

    for i in range(20):
        outbox.send("mem", i)
    assert get_queue("outbox").count == 1
    repo.clear_wake_flag("outbox")  # a worker started that job: the next send wakes another
    outbox.send("mem", "after")
    assert get_queue("outbox").count == 2


@pytest.mark.single_server(
    "on a cluster the wake-up flag's slot ({g}) may be on another primary: two round trips then"
)
def test_send_costs_one_round_trip(repo, monkeypatch):
    outbox.send("mem", "warm-up")  # first use loads the queue (RQ reads the server version once)
    calls = []
    original = redis.connection.Connection.send_packed_command

    def counting(self, command, check_health=True):
        calls.append(command)
        return original(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    # With partitions too: the wake-up flag (a key across the deployment, which the
    # partition's create may not touch) goes in the same write as the create when both
    # are on one server (MessageStore.create_and_flag).
    outbox.send("mem", {"n": 1})
    assert len(calls) == 1
    calls.clear()
    outbox.send_many([{"destination": "mem", "body": i} for i in range(50)])
    assert len(calls) == 1


def test_idempotency_key_returns_the_first_message(repo):
    first = outbox.send("mem", {"n": 1}, idempotency_key="order-1")
    again = outbox.send("mem", {"n": 1}, idempotency_key="order-1")
    assert again.id == first.id and again.json() == {"n": 1}
    assert repo.count() == 1
    other = outbox.send("mem", {"n": 3}, idempotency_key="order-2")
    assert other.id != first.id and repo.count() == 2
    assert 0 < repo.connection.ttl(repo.keys.of(first.id).idempotency("mem", "order-1")) <= 24 * 3600


def test_idempotency_key_with_another_body_is_a_conflict(repo):
    first = outbox.send("mem", {"order": 1}, idempotency_key="order-1")
    with pytest.raises(outbox.IdempotencyConflict) as info:
        outbox.send("mem", {"order": 999}, idempotency_key="order-1")
    assert info.value.existing_id == first.id and isinstance(info.value, InvalidMessage)
    assert repo.count() == 1


def test_idempotency_keys_are_scoped_per_destination(repo):
    mem = outbox.send("mem", {"order": 1}, idempotency_key="order-1")
    hook = outbox.send("hook", {"order": 999}, idempotency_key="order-1")
    assert hook.id != mem.id and hook.destination == "hook" and hook.json() == {"order": 999}
    assert repo.count() == 2 and outbox.get(hook.id).destination == "hook"


def test_a_conflict_in_send_many_writes_nothing(repo, monkeypatch):
    from outbox.store.keys import partition_for

    # With partitions a call is all-or-nothing within each partition (one script call
    # each): the message without a key goes to the conflicting key's partition.
    monkeypatch.setattr("outbox.api.random_partition", lambda p: partition_for("mem", "order-1", p))
    outbox.send("mem", {"order": 1}, idempotency_key="order-1")
    with pytest.raises(outbox.IdempotencyConflict, match="item 1"):
        outbox.send_many(
            [
                {"destination": "mem", "body": "fresh"},
                {"destination": "mem", "body": {"order": 2}, "idempotency_key": "order-1"},
            ]
        )
    assert repo.count() == 1


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_the_write_waits_for_commit(repo):
    with transaction.atomic():
        m = outbox.send("mem", {"n": 1})
        assert repo.count() == 0
    assert repo.get(m.id).status == "pending"


@pytest.mark.django_db(transaction=True)
def test_a_rollback_sends_nothing(repo):
    with pytest.raises(RuntimeError), transaction.atomic():
        outbox.send("mem", {"n": 1})
        raise RuntimeError("roll back")
    assert nothing_written(repo)


@pytest.mark.django_db(transaction=True)
def test_idempotency_inside_a_transaction(repo):
    first = outbox.send("mem", {"n": 1}, idempotency_key="tx-key")
    with transaction.atomic():
        again = outbox.send("mem", {"n": 1}, idempotency_key="tx-key")
        twice = outbox.send("mem", {"n": 2}, idempotency_key="tx-2")
        assert outbox.send("mem", {"n": 2}, idempotency_key="tx-2").id == twice.id  # same transaction
    assert again.id == first.id and repo.count() == 2


def test_priority_picks_the_queue(repo):
    from outbox.store.background.wakeups import get_queue

    high = outbox.send("mem", 1, priority="high")
    low = outbox.send("mem", 1, priority="low")
    assert (high.queue, low.queue) == ("outbox_high", "outbox_low")
    assert get_queue("outbox_high").count == 1 and get_queue("outbox_low").count == 1


def test_delay_schedules_the_first_attempt(repo):
    from outbox.delivery.recovery import wake_due
    from outbox.store.background.wakeups import get_queue

    m = outbox.send("mem", 1, delay=timedelta(minutes=5))
    assert m.next_attempt_at == pytest.approx(m.created_at + 300)
    queue = get_queue("outbox")
    assert queue.count == 0  # nothing to wake yet: no job at all
    assert repo.connection.zscore(repo.keys.of(m.id).due("outbox"), m.id) == pytest.approx(m.created_at + 300)
    assert wake_due(now=m.created_at + 299) == [] and queue.count == 0
    assert wake_due(now=m.created_at + 301) == ["outbox"] and queue.count == 1


def test_send_and_asend_list_the_fields_of_send_arguments_in_their_order():
    """send() and asend() build :class:`SendArguments` by position (the fastest call, on
    the hottest path): its fields must stay in the order of their parameters."""
    names = [f.name for f in dataclasses.fields(SendArguments)]
    for function in (outbox.send, outbox.asend):
        assert list(inspect.signature(function).parameters) == [*names, "using"]
