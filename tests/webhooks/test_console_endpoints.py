"""Endpoints in the console, the admin and the alerts (issue 34, items 5 and 8): the
destination page names the application and the endpoint and its buttons act on it
(through its row), the admin's endpoint list shows each row's health from Redis, alerts
name the application and the endpoint, an automatic disable reaches the endpoint's row;
the erasure path (item 4): deleting an application deletes its endpoints, deliveries,
captured rows and Redis state, and a sweep finishes what an outage left."""

from __future__ import annotations

import re
import time

import pytest
from django.db import transaction
from redis.exceptions import ConnectionError as RedisConnectionError

import outbox
from outbox import webhooks
from outbox.events import DestinationEvent, send_destination_events
from outbox.models import Application, CapturedMessage, Endpoint, OrderingSequence
from outbox.store import get_repository

pytestmark = pytest.mark.django_db(transaction=True)

URL = "https://93.184.215.14/hooks/acme"


@pytest.fixture
def endpoint():
    webhooks.create_event_type("order.paid", example={"order": 1})
    webhooks.create_application("customer-42", name="ACME")
    return webhooks.create_endpoint("customer-42", URL, uid="main").endpoint


def _page(client, name, suffix=""):
    return client.get(f"/admin/outbox/message/destinations/{name}/{suffix}")


def test_the_destination_page_of_an_endpoint_names_it_and_its_buttons_act_on_its_row(
    superuser_client, endpoint
):
    name = endpoint.destination
    page = _page(superuser_client, name)
    text = page.content.decode()
    assert page.status_code == 200
    assert 'id="endpoint-application"' in text and "customer-42" in text and "ACME" in text
    assert "main" in text and URL in text and str(endpoint.pk) in text
    assert f"/admin/outbox/endpoint/{endpoint.pk}/change/" in text
    assert 'id="state-action-disable"' in text and 'id="recover-form"' in text
    assert 'id="destination-ordering"' in text

    base = f"/admin/outbox/message/destinations/{name}"
    confirm = superuser_client.post(f"{base}/state/", {"action": "disable", "reason": "asked"})
    assert confirm.status_code == 200 and not Endpoint.objects.get(pk=endpoint.pk).disabled
    done = superuser_client.post(f"{base}/state/", {"action": "disable", "reason": "asked", "post": "yes"})
    assert done.status_code == 302
    row = Endpoint.objects.get(pk=endpoint.pk)
    assert row.disabled and row.disabled_reason == "asked"  # the row: workers follow it
    assert get_repository().connection.hget(get_repository().keys.dest(name), "admin") == b"disabled"
    superuser_client.post(f"{base}/state/", {"action": "enable", "post": "yes"})
    assert not Endpoint.objects.get(pk=endpoint.pk).disabled
    # pause stays in Redis (a hold, not the endpoint's registration)
    superuser_client.post(f"{base}/state/", {"action": "pause", "post": "yes"})
    assert get_repository().connection.hget(get_repository().keys.dest(name), "admin") == b"paused"
    assert not Endpoint.objects.get(pk=endpoint.pk).disabled
    superuser_client.post(f"{base}/state/", {"action": "resume", "post": "yes"})

    # recover since: the confirmation counts the endpoint's dead letters
    recover = superuser_client.post(f"{base}/recover/", {"since": "2h"})
    assert recover.status_code == 200 and b"Requeue" in recover.content
    assert superuser_client.post(f"{base}/recover/", {"since": "2h", "post": "yes"}).status_code == 302
    assert _page(superuser_client, name, "blocked-keys/").status_code == 200


def test_a_deleted_endpoint_s_page_says_so_and_refuses_its_buttons(superuser_client, endpoint):
    name = endpoint.destination
    outbox.publish("order.paid", {"a": 1}, application="customer-42")
    get_repository().connection.hset(get_repository().keys.dest(name), "admin", "active")
    Endpoint.objects.filter(pk=endpoint.pk).delete()  # through the ORM: Redis is not told
    page = _page(superuser_client, name)
    assert page.status_code == 200 and b"was deleted" in page.content
    assert b'id="state-action-' not in page.content
    refused = superuser_client.post(
        f"/admin/outbox/message/destinations/{name}/state/", {"action": "pause", "post": "yes"}
    )
    assert refused.status_code == 404
    webhooks.forget_endpoint_state(name)  # its state gone too: a 404 that still says why
    gone = _page(superuser_client, name)
    assert gone.status_code == 404 and b"deleted" in gone.content, gone.content[:300]


def test_the_admin_s_endpoint_list_shows_state_last_success_and_failure_from_redis(
    superuser_client, endpoint, django_assert_max_num_queries
):
    repo = get_repository()
    repo.connection.hset(
        repo.keys.dest(endpoint.destination),
        mapping={"last_success_at": "1700000000", "last_failure_at": "1700000300", "consecutive": "3"},
    )
    others = [webhooks.create_endpoint("customer-42", URL + f"/{i}").endpoint for i in range(3)]
    page = superuser_client.get("/admin/outbox/endpoint/?disabled__exact=0&q=main")
    text = page.content.decode()
    assert page.status_code == 200
    assert "2023-11-14 22:13:20 UTC" in text and "2023-11-14 22:18:20 UTC" in text
    assert "failing" in text and f"/admin/outbox/message/destinations/{endpoint.destination}/" in text
    assert str(others[0].pk) not in text  # the search by uid left them out
    every = superuser_client.get(f"/admin/outbox/endpoint/?application__id__exact={endpoint.application_id}")
    assert every.status_code == 200 and every.content.count(b"never") >= 6  # 3 rows x 2 columns
    assert superuser_client.get("/admin/outbox/endpoint/?disabled__exact=1").status_code == 200


def test_alerts_name_the_application_and_the_endpoint(endpoint):
    from outbox.alerts import Alert, endpoint_label

    label = endpoint_label(endpoint.destination)
    alert = Alert("destination.opened", endpoint.destination, time.time(), 1, time.time(), {}, label)
    subject = alert.subject()
    assert endpoint.destination in subject and "main" in subject and "93.184.215.14" in subject
    assert "customer-42 (ACME)" in subject
    data = alert.webhook_payload()["data"]
    assert data["endpoint"] == {
        "id": str(endpoint.pk),
        "uid": "main",
        "url_host": "93.184.215.14",
        "application": {"uid": "customer-42", "name": "ACME"},
    }
    assert "Application: customer-42 (ACME)" in alert.email_text()
    assert endpoint_label("orders") is None and endpoint_label("endpoint:" + "0" * 32) is None


def test_an_automatic_disable_in_redis_disables_the_endpoint_s_row(endpoint):
    """Without it, the next worker that loads the endpoint would enable it again (its row
    is the source of truth): a 410 Gone or DISABLE_AFTER would last CACHE_TTL seconds."""
    event = DestinationEvent(
        "destination.disabled", endpoint.destination, time.time(), {"reason": "410 Gone"}
    )
    send_destination_events([event])
    row = Endpoint.objects.get(pk=endpoint.pk)
    assert row.disabled and row.disabled_reason == "410 Gone"
    assert webhooks.subscribed("customer-42", "order.paid") == []
    # an endpoint disabled on purpose keeps its own reason
    send_destination_events([DestinationEvent("destination.disabled", endpoint.destination, time.time(), {})])
    assert Endpoint.objects.get(pk=endpoint.pk).disabled_reason == "410 Gone"
    send_destination_events([DestinationEvent("destination.enabled", endpoint.destination, time.time(), {})])
    assert not Endpoint.objects.get(pk=endpoint.pk).disabled


def test_deleting_an_application_erases_its_endpoints_deliveries_captured_rows_and_state(endpoint):
    repo = get_repository()
    name = endpoint.destination
    stored = outbox.publish("order.paid", {"a": 1}, application="customer-42", ordering_key="o-1")
    other_app = webhooks.create_application("other")
    kept = webhooks.create_endpoint(other_app, URL).endpoint
    with transaction.atomic():
        outbox.publish("order.paid", {"a": 2}, application="customer-42", ordering_key="o-1")
        outbox.publish("order.paid", {"b": 1}, application="other")
        assert CapturedMessage.objects.filter(destination=name).count() == 1
        webhooks.delete_application("customer-42")
    assert not Application.objects.filter(uid="customer-42").exists()
    assert not Endpoint.objects.filter(pk=endpoint.pk).exists()
    assert not CapturedMessage.objects.filter(destination=name).exists()
    assert not OrderingSequence.objects.filter(destination=name).exists()
    with pytest.raises(outbox.MessageNotFound):
        outbox.get(stored.deliveries[0].id)  # deleted, with its attempt records
    assert name not in repo.destinations() and not repo.connection.exists(repo.keys.dest(name))
    assert Endpoint.objects.filter(pk=kept.pk).exists()  # another application's: untouched
    assert repo.counts(kept.destination)["pending"] == 1


def test_redis_down_after_the_delete_leaves_state_that_the_sweep_removes(endpoint, monkeypatch, caplog):
    repo = get_repository()
    name = endpoint.destination
    stored = outbox.publish("order.paid", {"a": 1}, application="customer-42")

    def down(*args, **kwargs):
        raise RedisConnectionError("Connection refused")

    with monkeypatch.context() as m:
        m.setattr(webhooks.controls, "disable", down)
        webhooks.delete_application("customer-42")  # the database commits; Redis is "down"
    assert not Endpoint.objects.filter(pk=endpoint.pk).exists()
    assert "sweep_deleted_endpoints" in caplog.text
    assert outbox.get(stored.deliveries[0].id).status == "pending"  # left in Redis
    assert name in repo.destinations()

    assert webhooks.sweep_deleted_endpoints() == [name]
    with pytest.raises(outbox.MessageNotFound):
        outbox.get(stored.deliveries[0].id)
    assert name not in repo.destinations() and not repo.connection.exists(repo.keys.dest(name))
    assert webhooks.sweep_deleted_endpoints() == []  # idempotent


def test_the_sweep_keeps_live_endpoints_and_settings_destinations(endpoint):
    outbox.publish("order.paid", {"a": 1}, application="customer-42")
    outbox.send("mem", {"x": 1})
    assert webhooks.sweep_deleted_endpoints() == []
    assert get_repository().counts(endpoint.destination)["pending"] == 1


def test_the_console_lists_endpoints_paginated_failing_first(
    superuser_client, endpoint, monkeypatch, django_assert_max_num_queries
):
    from outbox.admin_views import endpoints as page_module

    monkeypatch.setattr(page_module, "PER_PAGE", 3)
    monkeypatch.setattr(page_module, "ON_DASHBOARD", 2)
    more = [webhooks.create_endpoint("customer-42", URL + f"/{i}", uid=f"e{i}").endpoint for i in range(4)]
    repo = get_repository()
    failing = more[2]
    repo.connection.hset(repo.keys.dest(failing.destination), mapping={"consecutive": "5"})
    webhooks.disable_endpoint(more[3], reason="customer asked")
    outbox.publish("order.paid", {"a": 1}, application="customer-42")  # 4 enabled endpoints: destinations
    first = superuser_client.get("/admin/outbox/message/endpoints/")
    text = first.content.decode()
    assert first.status_code == 200 and 'data-count="5"' in text
    rows = re.findall(r'class="endpoint-row[^"]*" data-destination="([^"]+)" data-state="([^"]+)"', text)
    assert len(rows) == 3
    assert rows[0] == (more[3].destination, "disabled")  # disabled first across pages
    assert ("page=2") in text
    second = superuser_client.get("/admin/outbox/message/endpoints/?page=2")
    assert second.status_code == 200
    both = rows + re.findall(
        r'class="endpoint-row[^"]*" data-destination="([^"]+)" data-state="([^"]+)"', second.content.decode()
    )
    assert {d for d, _ in both} == {e.destination for e in (endpoint, *more)}
    within = [s for d, s in rows]
    trouble = [s in ("disabled", "failing", "open") for s in within]
    assert trouble == sorted(trouble, reverse=True)  # failing first within the page
    filtered = superuser_client.get(
        "/admin/outbox/message/endpoints/?q=e2&state=enabled&application=customer-42"
    )
    assert re.findall(r'data-destination="(endpoint:[0-9a-f]+)"', filtered.content.decode()) == [
        failing.destination
    ]
    with django_assert_max_num_queries(12):
        assert superuser_client.get("/admin/outbox/message/endpoints/?page=2").status_code == 200

    dashboard = superuser_client.get("/admin/outbox/message/").content.decode()
    assert 'id="endpoints-link"' in dashboard and 'id="endpoints-hidden" data-count="2"' in dashboard
    shown = re.findall(r'class="destination-row[^"]*" data-destination="(endpoint:[0-9a-f]+)"', dashboard)
    assert len(shown) == 2 and shown[0] == failing.destination  # failing first


def test_requeue_of_a_delivery_whose_endpoint_is_gone_is_refused(endpoint):
    from outbox.exceptions import EndpointDeleted

    left = outbox.publish("order.paid", {"a": 1}, application="customer-42").deliveries[0].id
    other = outbox.send("mem", {"x": 1}).id
    assert outbox.requeue([left, other]).skipped == 2  # both pending: nothing to requeue, no refusal
    Endpoint.objects.filter(pk=endpoint.pk).delete()  # e.g. in flight when it was deleted
    with pytest.raises(EndpointDeleted, match="deleted") as info:
        outbox.requeue([other, left])
    assert info.value.message_ids == [left] and endpoint.destination in str(info.value)
