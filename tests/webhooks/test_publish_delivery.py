"""Webhooks for customers end to end: applications with several endpoints (type filters,
channels), events published, a real worker, real receivers on loopback, each verifying
with its own secret (the standardwebhooks library) and getting exactly its events."""

from __future__ import annotations

import json
import time

import pytest
from standardwebhooks import Webhook

import outbox
from outbox import webhooks
from tests.support.http import receiving
from tests.support.messages import run_worker

pytestmark = pytest.mark.django_db(transaction=True)

TYPES = ("order.paid", "order.refunded", "user.created", "invoice.sent")


def _catalogue():
    for name in TYPES:
        webhooks.create_event_type(name, description=name, example={"type": name})


def _verify(received, secret):
    """The payload, verified with ``secret`` as a receiver would (raises if it fails)."""
    return Webhook(secret).verify(received.body, received.headers)


def test_each_receiver_gets_exactly_its_events_signed_with_its_own_secret():
    _catalogue()
    plan = {  # application -> endpoint uid -> (filter_types, channels)
        "acme": {"all": ([], []), "paid": (["order.paid"], []), "eu": ([], ["eu"])},
        "globex": {
            "users": (["user.created"], []),
            "money": (["order.paid", "order.refunded"], ["us", "eu"]),
        },
        "initech": {"all": ([], [])},
    }
    events = [
        ("acme", "order.paid", []),
        ("acme", "user.created", ["eu"]),
        ("acme", "invoice.sent", ["us"]),
        ("globex", "order.paid", ["us"]),
        ("globex", "order.refunded", []),
        ("globex", "user.created", []),
        ("initech", "order.paid", ["eu"]),
    ]
    with receiving() as rx:
        secrets, expected, by_path = {}, {}, {}
        for app_uid, endpoints in plan.items():
            webhooks.create_application(app_uid, name=app_uid.title())
            for uid, (types, channels) in endpoints.items():
                path = f"/{app_uid}/{uid}"
                created = webhooks.create_endpoint(
                    app_uid, rx.base + path, uid=uid, filter_types=types, channels=channels
                )
                secrets[path] = created.secret
                expected[path] = set()
                by_path[path] = (types, channels)
        published = []
        for n, (app_uid, event_type, channels) in enumerate(events):
            event = outbox.publish(event_type, {"n": n}, application=app_uid, channels=channels)
            published.append(event)
            for path, (types, ep_channels) in by_path.items():
                mine = path.startswith(f"/{app_uid}/")
                if (
                    mine
                    and (not types or event_type in types)
                    and (not ep_channels or set(ep_channels) & set(channels))
                ):
                    expected[path].add(event.id)
            assert {d.destination for d in event.deliveries} == {
                e.destination for e in webhooks.subscribed(app_uid, event_type, channels)
            }
        run_worker(simple=True)
        got: dict[str, set[str]] = {p: set() for p in expected}
        for r in rx.requests:
            payload = _verify(r, secrets[r.path])  # its own secret verifies it
            for other, secret in secrets.items():  # and no other endpoint's does
                if other != r.path:
                    with pytest.raises(Exception):  # noqa: B017 - WebhookVerificationError
                        Webhook(secret).verify(r.body, r.headers)
            assert r.headers["webhook-id"] == r.headers["outbox-event-id"]
            assert r.headers["outbox-event-type"] == events[payload["n"]][1]
            got[r.path].add(r.headers["webhook-id"])
    assert got == expected
    assert sum(len(v) for v in expected.values()) == len(rx.requests)  # no repeats
    assert all(outbox.get(d.id).status == "succeeded" for e in published for d in e.deliveries)


def test_a_rotated_secret_verifies_during_the_overlap_and_the_new_one_too():
    _catalogue()
    with receiving() as rx:
        webhooks.create_application("acme")
        created = webhooks.create_endpoint("acme", rx.url)
        old = created.secret
        new = webhooks.rotate_secret(created.endpoint, overlap=3600)
        assert new != old and webhooks.endpoint_secret(created.endpoint) == new
        outbox.publish("order.paid", {"a": 1}, application="acme")
        run_worker(simple=True)
        (r,) = rx.requests
        assert len(r.headers["webhook-signature"].split()) == 2
        assert _verify(r, old) == {"a": 1}
        assert _verify(r, new) == {"a": 1}
        # with no overlap the current secret stops signing at once (within the workers'
        # bound); the one rotated out before keeps its own overlap
        newest = webhooks.rotate_secret(created.endpoint, overlap=0)
        time.sleep(0.2)  # VERSION_CHECK in the test settings: 0.1 s
        outbox.publish("order.paid", {"a": 2}, application="acme")
        run_worker(simple=True)
        r2 = rx.requests[-1]
        assert len(r2.headers["webhook-signature"].split()) == 2  # newest + old
        assert _verify(r2, newest) == {"a": 2}
        assert _verify(r2, old) == {"a": 2}
        with pytest.raises(Exception):  # noqa: B017
            _verify(r2, new)


def test_idempotent_publish_returns_the_same_event_and_deliveries():
    _catalogue()
    webhooks.create_application("acme")
    with receiving() as rx:
        webhooks.create_endpoint("acme", rx.url)
        webhooks.create_endpoint("acme", rx.url + "2")
        first = outbox.publish("order.paid", {"a": 1}, application="acme", idempotency_key="k1")
        again = outbox.publish("order.paid", {"a": 1}, application="acme", idempotency_key="k1")
        assert again.id == first.id
        assert [d.id for d in again.deliveries] == [d.id for d in first.deliveries]
        other = webhooks.create_application("globex")
        webhooks.create_endpoint(other, rx.url)
        third = outbox.publish("order.paid", {"a": 1}, application="globex", idempotency_key="k1")
        assert third.id != first.id  # keys are per application
        run_worker(simple=True)
    assert len(rx.requests) == 3


def test_ordering_key_is_per_endpoint():
    _catalogue()
    webhooks.create_application("acme")
    with receiving() as rx:
        a = webhooks.create_endpoint("acme", rx.base + "/a").endpoint
        b = webhooks.create_endpoint("acme", rx.base + "/b").endpoint
        for n in range(3):
            outbox.publish("order.paid", {"n": n}, application="acme", ordering_key="order-1")
        run_worker(simple=True)
    for path in ("/a", "/b"):
        seen = [json.loads(r.body)["n"] for r in rx.requests if r.path == path]
        assert seen == [0, 1, 2]
        seqs = [int(r.headers["outbox-ordering-sequence"]) for r in rx.requests if r.path == path]
        assert seqs == [1, 2, 3]  # each endpoint's own sequence
    assert a.destination != b.destination


def test_publish_inside_a_transaction_reaches_an_endpoint_created_in_it_and_a_rollback_sends_nothing():
    from django.db import transaction

    _catalogue()
    with receiving() as rx:
        with transaction.atomic():
            webhooks.create_application("acme")
            webhooks.create_endpoint("acme", rx.url)
            event = outbox.publish("order.paid", {"a": 1}, application="acme")
            assert len(event.deliveries) == 1
        with pytest.raises(RuntimeError), transaction.atomic():
            outbox.publish("order.paid", {"a": 2}, application="acme")
            raise RuntimeError
        run_worker(simple=True)
    assert [r.json() for r in rx.requests] == [{"a": 1}]


def test_a_disabled_endpoint_gets_nothing_new_and_its_waiting_deliveries_go_when_enabled():
    _catalogue()
    webhooks.create_application("acme")
    with receiving() as rx:
        endpoint = webhooks.create_endpoint("acme", rx.url).endpoint
        waiting = outbox.publish("order.paid", {"a": 1}, application="acme")
        webhooks.disable_endpoint(endpoint, reason="customer asked")
        assert outbox.publish("order.paid", {"a": 2}, application="acme").deliveries == ()
        run_worker(simple=True)
        assert rx.requests == []
        assert outbox.get(waiting.deliveries[0].id).status == "pending"  # parked, no retry charged
        webhooks.enable_endpoint(endpoint)
        run_worker(simple=True)
    assert [r.json() for r in rx.requests] == [{"a": 1}]


def test_deleting_an_endpoint_deletes_its_deliveries_and_its_state():
    from outbox.store import get_repository

    _catalogue()
    webhooks.create_application("acme")
    with receiving() as rx:
        rx.respond(503)
        endpoint = webhooks.create_endpoint("acme", rx.url).endpoint
        event = outbox.publish("order.paid", {"a": 1}, application="acme")
        run_worker(simple=True)
        repo = get_repository()
        assert endpoint.destination in repo.destinations()
        name = endpoint.destination
        webhooks.delete_endpoint(endpoint)
    with pytest.raises(outbox.MessageNotFound):
        outbox.get(event.deliveries[0].id)
    assert name not in repo.destinations()
    assert not repo.connection.exists(repo.keys.dest(name))


def test_event_ids_are_base32_random_without_a_key_and_derived_as_before_with_one():
    """Without a key: ``evt_`` + 26 characters of the base32 alphabet, every one different.
    With a key: the base32 of SHA-256(application pk, NUL, key), as every earlier version
    derived it, so processes of two versions running side by side during an upgrade
    give a repeated publish the same event id."""
    import base64
    import hashlib
    import string

    app = webhooks.create_application("ids")
    alphabet = set(string.ascii_lowercase + "234567")
    ids = {webhooks.event_id(app, None) for _ in range(2000)}
    assert len(ids) == 2000
    assert all(i.startswith("evt_") and len(i) == 30 and set(i[4:]) <= alphabet for i in ids)
    # every character of the alphabet turns up in every position (uniform bytes, not hex)
    assert all({i[4 + pos] for i in ids} == alphabet for pos in range(26))
    digest = hashlib.sha256(f"{app.pk}\x00order-7".encode()).digest()
    assert webhooks.event_id(app, "order-7") == "evt_" + base64.b32encode(digest).decode().lower()[:26]


def test_an_endpoint_refused_by_the_private_network_guard_names_the_endpoints_setting(settings):
    """A delivery the guard refuses (its receiver on loopback, the endpoints' private
    networks not allowed) is a dead letter at once; its error says how to allow it for
    endpoints, not a settings destination's OPTIONS, which an endpoint has none of."""
    _catalogue()
    webhooks.create_application("acme")
    with receiving() as rx:
        webhooks.create_endpoint("acme", rx.url)  # registered while private networks are allowed
        settings.OUTBOX = {
            **settings.OUTBOX,
            "BLOCK_PRIVATE_NETWORKS": True,
            "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "ALLOW_PRIVATE_NETWORKS": False},
        }
        event = outbox.publish("order.paid", {"a": 1}, application="acme")
        run_worker(simple=True)
        assert rx.requests == []
    got = outbox.get(event.deliveries[0].id)
    assert (got.status, got.retry_count) == ("failed", 0), (got.status, got.last_error)
    assert "OUTBOX['ENDPOINTS']['ALLOW_PRIVATE_NETWORKS']" in got.last_error, got.last_error
    assert "OPTIONS" not in got.last_error, got.last_error


def test_a_text_or_bytes_event_verifies_as_the_guide_says():
    """docs/webhooks.md: an event published as text or bytes is signed over its bytes;
    ``verify(body, headers, json_parse=False)`` accepts it (``verify`` alone parses JSON)."""
    _catalogue()
    webhooks.create_application("acme")
    with receiving() as rx:
        secret = webhooks.create_endpoint("acme", rx.url).secret
        outbox.publish("order.paid", "plain text, not JSON", application="acme")
        outbox.publish("order.paid", "bytes: é".encode(), application="acme")
        run_worker(simple=True)
    assert sorted(r.body for r in rx.requests) == sorted([b"plain text, not JSON", "bytes: é".encode()])
    for r in rx.requests:
        assert Webhook(secret).verify(r.body, r.headers, json_parse=False) is None
        with pytest.raises(ValueError):  # JSONDecodeError: the default parses the body
            Webhook(secret).verify(r.body, r.headers)
