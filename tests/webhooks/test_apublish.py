"""``await outbox.apublish()`` (issue 33): publish's twin for ``async def`` code. The
subscribers are resolved in Django's sync thread (a database read on the event loop
would raise Django's ``SynchronousOnlyOperation``), the deliveries written on
``redis.asyncio`` by the steps ``send_many`` drives. Real Redis: 16 partitions on the
single test server and on the real cluster (``spread``), as tests/sending/test_asend.py."""

from __future__ import annotations

import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction

import outbox
from outbox import webhooks
from outbox.exceptions import UnknownApplication, UnknownEventType
from outbox.store import get_repository
from outbox.store.client.aconnection import aclose

pytestmark = pytest.mark.django_db(transaction=True)


def _app(uid: str = "acme", endpoints: int = 3, *, catalogue: bool = True) -> None:
    if catalogue:
        webhooks.create_event_type("order.paid")
    webhooks.create_application(uid)
    for n in range(endpoints):
        webhooks.create_endpoint(uid, f"http://127.0.0.1:9/{uid}/{n}")


def _stored(message_id: str) -> outbox.Message | None:
    return get_repository().get_many([message_id])[0]


@pytest.mark.asyncio
async def test_apublish_stores_what_publish_stores(spread):
    await sync_to_async(_app)()
    event = await outbox.apublish(
        "order.paid", {"order": 7}, application="acme"
    )  # a cold cache: the database
    assert event.id.startswith("evt_") and event.application == "acme" and len(event.deliveries) == 3
    for d in event.deliveries:
        got = await outbox.aget(d.id)
        assert got.destination == d.destination and got.json() == {"order": 7}
        assert got.headers["Outbox-Event-Id"] == event.id
    keyed = await outbox.apublish("order.paid", {"order": 8}, application="acme", idempotency_key="k1")
    again = await outbox.apublish("order.paid", {"order": 8}, application="acme", idempotency_key="k1")
    assert again.id == keyed.id and [d.id for d in again.deliveries] == [d.id for d in keyed.deliveries]
    sync = await sync_to_async(outbox.publish)(
        "order.paid", {"order": 8}, application="acme", idempotency_key="k1"
    )
    assert [d.id for d in sync.deliveries] == [d.id for d in keyed.deliveries]  # one key, both twins
    assert get_repository().count() == 6
    await aclose()


@pytest.mark.asyncio
async def test_apublish_refuses_what_publish_refuses(spread):
    await sync_to_async(_app)()
    with pytest.raises(UnknownApplication):
        await outbox.apublish("order.paid", {}, application="nobody")
    with pytest.raises(UnknownEventType):
        await outbox.apublish("order.nope", {}, application="acme")
    with pytest.raises(outbox.MessageTooLarge):
        await outbox.apublish("order.paid", "x" * 2_000_000, application="acme")
    first = await outbox.apublish("order.paid", {"a": 1}, application="acme", idempotency_key="k")
    with pytest.raises(outbox.IdempotencyConflict) as conflict:
        await outbox.apublish("order.paid", {"a": 2}, application="acme", idempotency_key="k")
    assert "'k'" in str(conflict.value) and first.id in str(conflict.value), str(conflict.value)
    assert conflict.value.existing_id == first.id
    await sync_to_async(webhooks.create_application)("empty")
    none = await outbox.apublish("order.paid", {"a": 3}, application="empty")
    assert none.deliveries == () and none.application == "empty"
    await aclose()


@pytest.mark.asyncio
async def test_the_database_part_runs_off_the_loop(redis):
    """The registry's reads happen in Django's sync thread, never on the loop's thread."""
    from django.db.models.signals import pre_init

    from outbox.models import Application

    await sync_to_async(_app)()
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []

    def seen(sender, **kwargs):
        threads.append(threading.current_thread())

    pre_init.connect(seen, sender=Application)  # the application read, cold
    try:
        event = await outbox.apublish("order.paid", "hello", application="acme")
    finally:
        pre_init.disconnect(seen, sender=Application)
    assert threads and loop_thread not in threads
    assert len(event.deliveries) == 3 and all(_stored(d.id) for d in event.deliveries)
    await aclose()


def test_apublish_through_async_to_sync_inside_atomic_is_captured_with_the_transaction(redis):
    from outbox.models import CapturedMessage

    class Rollback(Exception):
        pass

    webhooks.create_event_type("order.paid")
    with pytest.raises(Rollback), transaction.atomic():
        webhooks.create_application("acme")  # uncommitted: only this transaction sees it
        webhooks.create_endpoint("acme", "http://127.0.0.1:9/a")
        gone = async_to_sync(outbox.apublish)("order.paid", {"a": 1}, application="acme")
        (delivery,) = gone.deliveries
        assert CapturedMessage.objects.filter(id=delivery.id).exists()
        raise Rollback
    assert _stored(delivery.id) is None and not CapturedMessage.objects.filter(id=delivery.id).exists()
    _app("globex", endpoints=2, catalogue=False)
    with transaction.atomic():
        kept = async_to_sync(outbox.apublish)("order.paid", {"a": 2}, application="globex")
        assert len(kept.deliveries) == 2 and not any(_stored(d.id) for d in kept.deliveries)
    assert all(_stored(d.id) for d in kept.deliveries)  # pushed when it committed
