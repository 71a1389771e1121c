"""Model events (issue 34, item 7): ``<app>.<model>.created/updated/deleted`` published
to the row's application only when its transaction commits: committed, rolled back, a
savepoint rolled back inside a committed transaction; deletes through a queryset; bulk
operations that send no signal publish nothing. Delivered by a real worker to a real
receiver that verifies each with its endpoint's secret, in order per row."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from standardwebhooks import Webhook

from outbox import model_events, webhooks
from outbox.models import EventType
from tests.support.http import receiving
from tests.support.messages import run_worker

pytestmark = pytest.mark.django_db(transaction=True)


def to_acme(group: Group) -> str | None:
    """The application a group belongs to: none for names starting with "internal"."""
    return None if group.name.startswith("internal") else "acme"


@pytest.fixture
def group_events(settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "MODEL_EVENTS": {"auth.Group": {"APPLICATION": to_acme, "FIELDS": ["id", "name"]}},
    }
    assert model_events.register_event_types() == [
        "auth.group.created",
        "auth.group.updated",
        "auth.group.deleted",
    ]
    yield
    settings.OUTBOX = {**settings.OUTBOX, "MODEL_EVENTS": {}}


@pytest.fixture
def endpoint(group_events):
    with receiving() as rx:
        webhooks.create_application("acme")
        created = webhooks.create_endpoint("acme", rx.url)
        yield rx, created.secret


def received(rx, secret) -> list[tuple[str, str, str]]:
    out = []
    for r in rx.requests:
        payload = Webhook(secret).verify(r.body, r.headers)
        out.append((r.headers["outbox-event-type"], payload["action"], payload["data"]["name"]))
    return out


def test_created_updated_deleted_reach_the_endpoint_in_order_when_committed(endpoint):
    rx, secret = endpoint
    with transaction.atomic():
        group = Group.objects.create(name="editors")
        group.name = "authors"
        group.save()
    Group.objects.filter(pk=group.pk).delete()  # a queryset's delete sends post_delete per row
    run_worker(simple=True)
    assert received(rx, secret) == [
        ("auth.group.created", "created", "editors"),
        ("auth.group.updated", "updated", "authors"),
        ("auth.group.deleted", "deleted", "authors"),
    ]
    first = rx.requests[0]
    assert first.headers["outbox-ordering-key"] == f"auth.group:{group.pk}"
    assert Webhook(secret).verify(first.body, first.headers) == {
        "model": "auth.group",
        "action": "created",
        "pk": group.pk,
        "data": {"id": group.pk, "name": "editors"},
    }


def test_nothing_is_published_when_the_transaction_rolls_back(endpoint):
    rx, _ = endpoint
    with pytest.raises(RuntimeError), transaction.atomic():
        Group.objects.create(name="ghost")
        raise RuntimeError("rolled back")
    assert not Group.objects.exists()
    run_worker(simple=True)
    assert rx.requests == []


def test_a_rolled_back_savepoint_takes_its_events_with_it(endpoint):
    rx, secret = endpoint
    with transaction.atomic():
        Group.objects.create(name="kept")
        try:
            with transaction.atomic():  # a savepoint
                Group.objects.create(name="undone")
                raise RuntimeError("savepoint rolled back")
        except RuntimeError:
            pass
    run_worker(simple=True)
    assert [name for _, _, name in received(rx, secret)] == ["kept"]


def test_rows_of_no_application_and_bulk_operations_publish_nothing(endpoint):
    rx, secret = endpoint
    Group.objects.create(name="internal-ops")  # APPLICATION returned None
    Group.objects.bulk_create([Group(name="bulk")])  # no post_save: documented
    Group.objects.filter(name="bulk").update(name="bulk2")  # no post_save: documented
    Group.objects.create(name="visible")
    run_worker(simple=True)
    assert [name for _, _, name in received(rx, secret)] == ["visible"]


def test_only_the_configured_actions_are_published(endpoint, settings):
    rx, secret = endpoint
    settings.OUTBOX = {
        **settings.OUTBOX,
        "MODEL_EVENTS": {"auth.Group": {"APPLICATION": to_acme, "EVENTS": ["deleted"]}},
    }
    group = Group.objects.create(name="quiet")
    group.delete()
    run_worker(simple=True)
    assert [(t, name) for t, _, name in received(rx, secret)] == [("auth.group.deleted", "quiet")]


def test_an_archived_event_type_refuses_the_change_with_it(endpoint):
    EventType.objects.filter(name="auth.group.created").update(archived=True)
    with pytest.raises(Exception, match="archived"), transaction.atomic():
        Group.objects.create(name="refused")
    assert not Group.objects.exists()  # the change rolled back with the refused event


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"FIELDS": ["id"]}, "APPLICATION"),
        ({"APPLICATION": "no.such.callable"}, "does not import"),
        ({"APPLICATION": to_acme, "FIELDS": ["nope"]}, "unknown"),
        ({"APPLICATION": to_acme, "EVENTS": ["renamed"]}, "EVENTS"),
        ({"APPLICATION": to_acme, "SERIALIZER": to_acme, "FIELDS": ["id"]}, "not both"),
        ({"APPLICATION": to_acme, "COLOUR": "red"}, "unknown option"),
    ],
)
def test_a_misconfiguration_names_the_model_and_the_option(options, message):
    with pytest.raises(ImproperlyConfigured, match=message) as raised:
        model_events.parse({"auth.Group": options})
    assert "auth.Group" in str(raised.value)


def test_an_unknown_model_is_refused():
    with pytest.raises(ImproperlyConfigured, match="no such model"):
        model_events.parse({"shop.Nothing": {"APPLICATION": to_acme}})
