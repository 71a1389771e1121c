"""publish() keeps the application, its enabled endpoints and the event type's state in
the process's versioned cache (outbox.destinations.endpoints, "what publish() reads"):
a change committed by this process is seen at once, one announced by another process
within VERSION_CHECK, and a transaction that changed the registry reads its own
uncommitted rows and keeps nothing of them."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

import outbox
from outbox import webhooks
from outbox.endpoint_names import application_tag, event_type_tag
from outbox.exceptions import UnknownApplication, UnknownEventType
from outbox.models import Application, Endpoint, EventType
from outbox.store import endpoint_versions, get_repository

pytestmark = pytest.mark.django_db(transaction=True)

URL = "https://93.184.215.14/hook"


@pytest.fixture
def app():
    webhooks.create_event_type("order.paid")
    return webhooks.create_application("acme")


def _to(app_uid, event_type="order.paid"):
    return {d.destination for d in outbox.publish(event_type, {"n": 1}, application=app_uid).deliveries}


def test_a_warm_publish_reads_no_database(app, django_assert_num_queries):
    first = webhooks.create_endpoint(app, URL).endpoint
    assert _to("acme") == {first.destination}
    with django_assert_num_queries(0):
        event = outbox.publish("order.paid", {"n": 2}, application="acme")
    assert [d.destination for d in event.deliveries] == [first.destination]


def test_changes_committed_by_this_process_are_seen_at_once(app):
    first = webhooks.create_endpoint(app, URL).endpoint
    assert _to("acme") == {first.destination}
    second = webhooks.create_endpoint(app, URL, filter_types=["order.paid"]).endpoint
    assert _to("acme") == {first.destination, second.destination}
    webhooks.disable_endpoint(first)
    assert _to("acme") == {second.destination}
    webhooks.update_endpoint(second, channels=["eu"])
    assert _to("acme") == set()
    webhooks.enable_endpoint(first)
    assert _to("acme") == {first.destination}
    webhooks.delete_endpoint(first)
    assert _to("acme") == set()
    webhooks.update_event_type("order.paid", archived=True)
    with pytest.raises(UnknownEventType, match="archived"):
        _to("acme")
    webhooks.update_event_type("order.paid", archived=False)
    webhooks.update_application("acme", uid="acme-2")
    with pytest.raises(UnknownApplication):
        _to("acme")
    assert _to("acme-2") == set()
    webhooks.delete_application("acme-2")
    with pytest.raises(UnknownApplication):
        _to("acme-2")


def test_orm_saves_of_applications_and_event_types_are_announced(app):
    webhooks.create_endpoint(app, URL)
    assert len(_to("acme")) == 1
    event_type = EventType.objects.get(name="order.paid")
    event_type.archived = True
    event_type.save()  # the admin's way
    with pytest.raises(UnknownEventType, match="archived"):
        _to("acme")
    EventType.objects.get(name="order.paid").delete()
    with pytest.raises(UnknownEventType, match="unknown"):
        _to("acme")
    webhooks.create_event_type("order.paid")
    app.uid = "renamed"
    app.save()
    with pytest.raises(UnknownApplication):
        _to("acme")
    assert len(_to("renamed")) == 1


def test_a_change_announced_by_another_process_is_seen_within_version_check(app, settings):
    settings.OUTBOX = {**settings.OUTBOX, "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "VERSION_CHECK": 0}}
    first = webhooks.create_endpoint(app, URL).endpoint
    assert _to("acme") == {first.destination}
    # another process: its rows committed, this process's copies untouched
    Endpoint.objects.filter(pk=first.pk).update(disabled=True)
    EventType.objects.filter(name="order.paid").update(archived=True)
    assert _to("acme") == {first.destination}  # the copy (until announced, or CACHE_TTL)
    endpoint_versions.bump(get_repository(), [first.destination, application_tag(app.pk)])
    assert _to("acme") == set()
    assert _to("acme") == set()  # the type's state: still its copy (not announced yet)
    endpoint_versions.bump(get_repository(), [event_type_tag("order.paid")])
    with pytest.raises(UnknownEventType, match="archived"):
        _to("acme")


def test_copies_expire_after_cache_ttl_when_a_change_was_never_announced(app, settings):
    first = webhooks.create_endpoint(app, URL).endpoint
    assert _to("acme") == {first.destination}
    Endpoint.objects.filter(pk=first.pk).update(disabled=True)  # the announcement lost
    assert _to("acme") == {first.destination}
    settings.OUTBOX = {**settings.OUTBOX, "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "CACHE_TTL": 0}}
    assert _to("acme") == set()


def test_a_transaction_sees_its_own_uncommitted_endpoints_and_keeps_none_of_them(app):
    first = webhooks.create_endpoint(app, URL).endpoint
    assert _to("acme") == {first.destination}  # warm
    with pytest.raises(RuntimeError), transaction.atomic():
        second = webhooks.create_endpoint(app, URL).endpoint
        event = outbox.publish("order.paid", {"n": 1}, application="acme")
        assert {d.destination for d in event.deliveries} == {first.destination, second.destination}
        webhooks.disable_endpoint(first)
        assert _to("acme") == {second.destination}
        raise RuntimeError("rolled back")
    assert _to("acme") == {first.destination}  # nothing of the rolled-back rows kept
    with transaction.atomic():
        other = webhooks.create_application("globex")
        webhooks.create_endpoint(other, URL)
        assert len(_to("globex")) == 1
        transaction.set_rollback(True)
    assert not Application.objects.filter(uid="globex").exists()
    with pytest.raises(UnknownApplication):
        _to("globex")


def test_a_savepoint_rolled_back_takes_its_changes_and_their_mark_with_it(app):
    first = webhooks.create_endpoint(app, URL).endpoint
    assert _to("acme") == {first.destination}
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            webhooks.create_endpoint(app, URL)
            assert len(_to("acme")) == 2
            raise RuntimeError
        assert _to("acme") == {first.destination}


def test_fan_out_deliveries_are_separate_messages(app):
    endpoints = [webhooks.create_endpoint(app, URL).endpoint for _ in range(3)]
    event = outbox.publish("order.paid", {"n": 1}, application="acme", idempotency_key="k-1")
    messages = [d.message for d in event.deliveries]
    assert [d.endpoint_id for d in event.deliveries] == [e.pk for e in endpoints]
    assert len({m.id for m in messages}) == 3
    assert [m.destination for m in messages] == [e.destination for e in endpoints]
    assert len({id(m.headers) for m in messages}) == 3
    assert {m.idempotency_key for m in messages} == {f"evt:{event.id}"}
    assert all(m.headers["Outbox-Event-Id"] == event.id for m in messages)
    again = outbox.publish("order.paid", {"n": 1}, application="acme", idempotency_key="k-1")
    assert [d.id for d in again.deliveries] == [m.id for m in messages]


def _on(app_uid, channels):
    event = outbox.publish("order.paid", {"n": 1}, application=app_uid, channels=channels)
    return {d.destination for d in event.deliveries}


def test_a_publication_is_as_old_as_the_oldest_copy_it_was_built_from(app, settings):
    # publish() keeps what it resolves per (application, type, channels), built from the
    # kept application, type and endpoints: built later than they were read, it must
    # still expire when they do (CACHE_TTL after the oldest read), not CACHE_TTL after
    # it was built
    settings.OUTBOX = {**settings.OUTBOX, "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "CACHE_TTL": 2.0}}
    webhooks.create_event_type("order.shipped")
    first = webhooks.create_endpoint(app, URL).endpoint
    t0 = time.monotonic()
    assert _to("acme") == {first.destination}  # the application and its endpoints read now
    time.sleep(1.0)
    assert _to("acme", "order.shipped") == {first.destination}  # built now, from copies 1 s old
    Endpoint.objects.filter(pk=first.pk).update(disabled=True)  # its announcement lost
    time.sleep(max(0.0, t0 + 2.4 - time.monotonic()))
    assert _to("acme", "order.shipped") == set()  # those copies expired, and what was built from them


def test_each_kind_of_kept_value_keeps_its_own_room(app, monkeypatch, django_assert_num_queries):
    # an application published to on many channels keeps many publications: they must
    # not push out the application and endpoints every other publication is built from
    from outbox.destinations import config

    monkeypatch.setattr(config, "ENDPOINT_CACHE_SIZE", 3)
    first = webhooks.create_endpoint(app, URL).endpoint
    for n in range(6):
        assert _on("acme", [f"c{n}"]) == {first.destination}
    with django_assert_num_queries(0):
        assert _on("acme", ["c-new"]) == {first.destination}


def test_values_pushed_out_leave_nothing_under_their_tags(app, monkeypatch):
    # per-user channels make a new publication per call: the tags of those pushed out
    # must go with them, or this process's memory grows with every channel ever used
    from outbox.destinations import config

    monkeypatch.setattr(config, "ENDPOINT_CACHE_SIZE", 3)
    webhooks.create_endpoint(app, URL)
    for n in range(50):
        _on("acme", [f"user-{n}"])
    tagged = sum(len(keys) for keys in config.endpoint_cache._tagged.values())
    # 3 publications (3 tags each); the application (2), the type (1), the endpoints (1)
    assert tagged <= 3 * 3 + 4, tagged
