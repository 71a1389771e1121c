"""The payload of a published event is stored once per partition (issue 34, item 4), not
once per endpoint: each delivery's records hold a reference (the event id) in place of
the body, the payload record counts its live deliveries, and it goes with the last.

Run on a single server and on the real cluster (``OUTBOX_TEST_CLUSTER=1``): on a cluster,
a publish with an idempotency key spreads its deliveries over partitions, one payload
record in each partition it touches."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import outbox
from outbox import webhooks
from outbox.store import get_repository
from outbox.testing import free_port
from outbox.webhooks import PublishedEvent
from tests.support import redis_at
from tests.support.messages import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = {"pad": "x" * 180}  # about 200 bytes of JSON
LARGE = {"pad": "x" * 10_000}  # about 10 KB


def _app(endpoints: int = 5, uid: str = "acme") -> None:
    webhooks.create_event_type("order.paid")
    webhooks.create_application(uid)
    for n in range(endpoints):
        webhooks.create_endpoint(uid, f"http://127.0.0.1:9/{uid}/{n}")


def _payload_key(event: PublishedEvent, delivery_id: str) -> str:
    repo = get_repository()
    return repo.keys.of(delivery_id).payload(event.id)


def _refs() -> dict[str, int]:
    """Every payload record's count of live deliveries, by key."""
    repo = get_repository()
    out = {}
    for key in repo.connection.scan_iter(match=f"{repo.keys.prefix}*:payload:*"):
        name = key.decode()
        out[name] = int(repo.connection.hget(name, "refs") or 0)
    return out


def _live(events: list[PublishedEvent]) -> Counter[str]:
    """Deliveries still stored, by the payload record each one references."""
    repo = get_repository()
    found = Counter()
    for event in events:
        for d in event.deliveries:
            if repo.connection.exists(repo.keys.resend(d.id)):
                found[_payload_key(event, d.id)] += 1
    return found


def _delivery_bytes(event: PublishedEvent) -> float:
    """Redis memory of each delivery's own records (message and resend), averaged."""
    repo = get_repository()
    conn = repo.connection
    total = 0
    for d in event.deliveries:
        for key in (repo.keys.message(d.id), repo.keys.resend(d.id)):
            total += conn.memory_usage(key, samples=0)
    return total / len(event.deliveries)


def test_bytes_per_delivery_do_not_depend_on_the_payload_size():
    _app(5)
    small = outbox.publish("order.paid", SMALL, application="acme")
    large = outbox.publish("order.paid", LARGE, application="acme")
    small_bytes, large_bytes = _delivery_bytes(small), _delivery_bytes(large)
    assert abs(large_bytes / small_bytes - 1) <= 0.10, (small_bytes, large_bytes)
    assert large_bytes < 2_000  # not the 10 KB body


def test_the_payload_is_stored_once_per_partition_and_every_reader_sees_the_body():
    _app(5)
    event = outbox.publish("order.paid", LARGE, application="acme", idempotency_key="k1")
    keys = {_payload_key(event, d.id) for d in event.deliveries}
    assert _refs() == dict(_live([event]))  # one record per partition touched, counted right
    assert len(keys) <= min(5, get_repository().keys.partitions)
    for d in event.deliveries:
        message = outbox.get(d.id)
        assert message.json() == LARGE
        assert message.content_type == "application/json"
        assert d.message.json() == LARGE


def test_a_worker_delivers_the_body_it_reads_through_the_reference(monkeypatch):
    """The claim returns the bodies of the payload records its deliveries reference
    (``lua/lib/claimed.lua``): the worker reads none in a round trip of its own per claim
    (issue 34: the rate of a worker delivering to endpoints)."""
    from tests.support.http import receiving

    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    with receiving() as rx:
        for n in range(3):
            webhooks.create_endpoint("acme", f"{rx.base}/{n}")
        event = outbox.publish("order.paid", LARGE, application="acme")
        assert all(outbox.get(d.id).payload_ref == event.id for d in event.deliveries)
        reads = payload_reads(monkeypatch)
        run_worker(simple=True)
    assert sorted(r.path for r in rx.requests) == ["/0", "/1", "/2"]
    assert all(json.loads(r.body) == LARGE for r in rx.requests)
    assert reads == []
    assert all(outbox.get(d.id).status == "succeeded" for d in event.deliveries)


def payload_reads(monkeypatch) -> list[str]:
    """Record each payload record the client reads with a command of its own (``HGET``,
    alone or in a pipeline), as the worker did after each claim before the claim script
    returned the bodies."""
    import redis.client
    import redis.cluster

    seen: list[str] = []

    def note(args) -> None:
        if args and str(args[0]).upper() == "HGET" and ":payload:" in str(args[1]):
            seen.append(str(args[1]))

    for cls in (redis.client.Pipeline, redis.cluster.ClusterPipeline):
        real_execute = cls.execute

        def execute(self, *a, _real=real_execute, **kw):
            for command in self.command_stack:
                note(command.args if hasattr(command, "args") else command[0])
            return _real(self, *a, **kw)

        monkeypatch.setattr(cls, "execute", execute)
    for cls in (redis.client.Redis, redis.cluster.RedisCluster):
        real_command = cls.execute_command

        def execute_command(self, *args, _real=real_command, **kw):
            note(args)
            return _real(self, *args, **kw)

        monkeypatch.setattr(cls, "execute_command", execute_command)
    return seen


def test_deleting_the_last_delivery_deletes_the_payload():
    _app(3)
    event = outbox.publish("order.paid", SMALL, application="acme")
    key = _payload_key(event, event.deliveries[0].id)
    ids = [d.id for d in event.deliveries]
    assert _refs() == {key: 3}
    assert outbox.delete(ids[:2]).acted == 2
    assert _refs() == {key: 1}
    assert outbox.get(ids[2]).json() == SMALL  # the last still has its body
    assert outbox.delete(ids[2]).acted == 1
    assert _refs() == {}


def test_the_retention_purge_deletes_the_payload_with_the_last_delivery(settings):
    from outbox.delivery.recovery import recover

    _app(2)
    event = outbox.publish("order.paid", SMALL, application="acme")
    outbox.cancel([d.id for d in event.deliveries])
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": {"cancelled": 0}}
    assert recover(now=event.deliveries[0].message.created_at + 60).purged == 2
    assert _live([event]) == Counter()
    assert _refs() == {}


def test_a_requeue_of_a_delivery_whose_payload_is_gone_is_refused_clearly(caplog):
    _app(2)  # (an event to one endpoint keeps its payload inline: below)
    event = outbox.publish("order.paid", SMALL, application="acme")
    d = event.deliveries[0]
    outbox.delete(event.deliveries[1].id)
    outbox.cancel(d.id)
    repo = get_repository()
    repo.connection.delete(_payload_key(event, d.id))  # as an erasure outside the outbox would
    result = outbox.requeue(d.id)
    assert (result.acted, result.skipped, result.payload_purged) == (0, 1, 1)
    assert outbox.get(d.id).status == "cancelled"
    assert "the event's payload was purged" in caplog.text
    # one whose payload is there is requeued as before
    other = outbox.publish("order.paid", SMALL, application="acme")
    outbox.cancel(other.deliveries[0].id)
    assert outbox.requeue(other.deliveries[0].id).acted == 1


def test_a_publish_retried_with_its_idempotency_key_neither_leaks_nor_double_counts():
    _app(4)
    first = outbox.publish("order.paid", SMALL, application="acme", idempotency_key="k")
    again = outbox.publish("order.paid", SMALL, application="acme", idempotency_key="k")
    assert [d.id for d in again.deliveries] == [d.id for d in first.deliveries]
    assert _refs() == dict(_live([first]))
    # a delivery the first call left out (here deleted, as if its partition had refused):
    # the retry stores it, counted once; the others are not counted again
    gone = first.deliveries[1].id
    outbox.delete(gone)
    third = outbox.publish("order.paid", SMALL, application="acme", idempotency_key="k")
    assert len(third.deliveries) == 4
    assert _refs() == dict(_live([third]))
    assert sum(_refs().values()) == 4


def test_a_create_that_runs_twice_counts_once():
    """The create call's own retry (a reply lost: send_again, the relay racing the fast
    path) finds its records and counts nothing again."""
    _app(3)
    event = outbox.publish("order.paid", SMALL, application="acme")
    messages = [d.message for d in event.deliveries]
    outbox.send_again(messages)
    assert _refs() == dict(_live([event]))


def test_a_conflicting_publish_writes_no_payload():
    _app(2)
    first = outbox.publish("order.paid", SMALL, application="acme", idempotency_key="k")
    before = _refs()
    with pytest.raises(outbox.IdempotencyConflict) as conflict:
        outbox.publish("order.paid", LARGE, application="acme", idempotency_key="k")
    assert _refs() == before == dict(_live([first]))
    # the caller's key, application and event, not a delivery's internal key
    text = str(conflict.value)
    assert "'k'" in text and "'acme'" in text and first.id in text, text
    assert "send_many" not in text and "evt:" not in text and "endpoint:" not in text, text
    assert conflict.value.existing_id == first.id and conflict.value.field == "idempotency_key"


def test_publish_inside_a_transaction_is_captured_with_its_body_and_pushed_with_a_reference():
    from django.db import transaction

    from outbox.models import CapturedMessage
    from outbox.sending.capture import push, relay

    _app(2)
    with transaction.atomic():
        event = outbox.publish("order.paid", LARGE, application="acme")
        rows = list(CapturedMessage.objects.all())
        assert len(rows) == 2 and all(bytes(r.body) for r in rows)
    assert _refs() == dict(_live([event]))  # pushed on commit
    assert [outbox.get(d.id).json() for d in event.deliveries] == [LARGE, LARGE]
    # Redis down at commit: the relay pushes the rows, and a late fast path racing it
    # writes nothing twice
    with redis_at(f"redis://127.0.0.1:{free_port()}/0"), transaction.atomic():
        later = outbox.publish("order.paid", SMALL, application="acme")
    captured = [outbox.get(d.id) for d in later.deliveries]  # from the capture table
    assert [m.json() for m in captured] == [SMALL, SMALL]
    assert relay("default", older_than=0) == 2
    push(captured, "default")
    assert not CapturedMessage.objects.exists()
    assert _refs() == dict(_live([event, later]))
    assert [outbox.get(d.id).json() for d in later.deliveries] == [SMALL, SMALL]


def test_eager_mode_delivers_the_body(settings):
    from tests.support.http import receiving

    settings.OUTBOX = {**settings.OUTBOX, "EAGER": True}
    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    with receiving() as rx:
        webhooks.create_endpoint("acme", rx.url)
        event = outbox.publish("order.paid", SMALL, application="acme")
    assert [json.loads(r.body) for r in rx.requests] == [SMALL]
    assert event.deliveries[0].message.json() == SMALL


def test_an_event_to_one_endpoint_keeps_its_payload_inline():
    """One delivery: no payload record (one copy either way), as ``send()`` stores a body."""
    _app(1)
    repo = get_repository()
    (d,) = outbox.publish("order.paid", SMALL, application="acme").deliveries
    assert repo.connection.get(repo.keys.message(d.id)).endswith(d.message.body) and d.message.body
    assert "payload" not in {k.decode() for k in repo.connection.hkeys(repo.keys.resend(d.id))}
    assert _refs() == {}
    assert outbox.get(d.id).body == d.message.body


def test_send_keeps_its_body_inline():
    repo = get_repository()
    message = outbox.send("hook", {"a": 1})
    assert repo.connection.get(repo.keys.message(message.id)).endswith(b'{"a":1}')
    assert "payload" not in {k.decode() for k in repo.connection.hkeys(repo.keys.resend(message.id))}
    assert _refs() == {}


def test_a_delivery_whose_payload_is_gone_fails_instead_of_sending_an_empty_body():
    from tests.support.http import receiving

    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    with receiving() as rx:
        webhooks.create_endpoint("acme", rx.url)
        webhooks.create_endpoint("acme", rx.url + "/b")  # two deliveries: a reference (one: inline)
        event = outbox.publish("order.paid", SMALL, application="acme")
        d, other = event.deliveries
        outbox.delete(other.id)
        get_repository().connection.delete(_payload_key(event, d.id))  # as an erasure outside the outbox
        run_worker(simple=True)
    assert rx.requests == []
    message = outbox.get(d.id)
    assert message.status == "failed" and "payload was purged" in message.last_error


@pytest.mark.asyncio
async def test_aget_reads_a_published_delivery_with_its_body():
    """``outbox.aget`` attaches the payload as ``get`` does (the body is not in the
    delivery's own records)."""
    from asgiref.sync import sync_to_async

    event = await sync_to_async(_publish_large)()
    for d in event.deliveries:
        message = await outbox.aget(d.id)
        assert message.json() == LARGE
        assert message.payload_ref == event.id


def _publish_large() -> PublishedEvent:
    _app(2)
    return outbox.publish("order.paid", LARGE, application="acme")


def _payload_hgets(repo) -> int:
    """``HGET`` commands Redis ran so far (INFO commandstats; every primary on a cluster):
    inside scripts too, so the claims' own reads of payload records count."""
    from redis.cluster import RedisCluster

    if isinstance(repo.connection, RedisCluster):
        per_node = repo.connection.info("commandstats", target_nodes=RedisCluster.PRIMARIES)
        stats = list(per_node.values())
    else:
        stats = [repo.connection.info("commandstats")]
    return sum(int(s.get("cmdstat_hget", {}).get("calls", 0)) for s in stats)


def test_a_workers_claims_read_an_events_payload_once():
    """A worker's claims of one event's deliveries read its payload record once: the first
    claim returns the body, and each later claim is told the events whose bodies the
    worker holds (``have``), so it returns none again. Claims are small when deliveries
    spread over endpoints (about 1.4 deliveries a claim in ``benchmarks.compare
    --endpoints``): each read the whole payload again, 0.73 ``HGET`` a delivery there, a
    10 KB copy each for a 10 KB event."""
    import time as clock

    from outbox.records import partition_of
    from outbox.store.messages import ClaimOptions

    _app(6)
    event = outbox.publish("order.paid", LARGE, application="acme")
    repo = get_repository()
    partition = partition_of(event.deliveries[0].id) if repo.keys.partitioned else 0
    before = _payload_hgets(repo)
    bodies = []
    for _ in range(6):
        now = clock.time()
        claim = repo.claim("outbox", now + 1, partition, ClaimOptions(lease="t", deadline=now + 60, limit=1))
        bodies += [m.body for m in claim.messages]
    assert [json.loads(b) for b in bodies] == [LARGE] * 6
    assert _payload_hgets(repo) - before == 1


def test_a_held_body_keeps_the_time_it_was_read_from_redis():
    """A body a claim took from the worker's memory is not kept again: it keeps the time
    it was read from Redis, so ``MAX_AGE`` bounds how long it stays (an erased payload
    leaves no copy for longer), however often claims use it."""
    import time as clock

    from outbox.records import partition_of
    from outbox.store.messages import ClaimOptions

    _app(3)
    event = outbox.publish("order.paid", LARGE, application="acme")
    repo = get_repository()
    partition = partition_of(event.deliveries[0].id) if repo.keys.partitioned else 0
    stamps = []
    for _ in range(3):
        now = clock.time()
        claim = repo.claim("outbox", now + 1, partition, ClaimOptions(lease="t", deadline=now + 60, limit=1))
        assert len(claim.messages) == 1
        (stamp,) = [at for at, _ in repo.payload_bodies._bodies.values()]
        stamps.append(stamp)
    assert stamps == [stamps[0]] * 3
