"""The registry's Python API at its boundary (found by an outside check): an object read
before a delete does not bring the row back, a refused change is not saved by a later
call, and values of the wrong type or out of range are refused naming their field with
nothing written, never coerced or raised as a TypeError, IntegrityError or OverflowError."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

import outbox
from outbox import webhooks
from outbox.exceptions import InvalidEndpoint, InvalidMessage, UnknownApplication, UnknownEventType
from outbox.models import Application, Endpoint, EventType

pytestmark = pytest.mark.django_db

URL = "https://93.184.215.14/hook"


@pytest.fixture
def app():
    webhooks.create_event_type("order.paid")
    return webhooks.create_application("acme")


@pytest.fixture
def endpoint(app):
    return webhooks.create_endpoint(app, URL).endpoint


def _rows():
    return (
        list(Application.objects.values_list("uid", "name", "metadata", "max_endpoints")),
        list(Endpoint.objects.values_list("url", "description", "rate_limit", "max_concurrency", "disabled")),
        list(EventType.objects.values_list("name", "schema", "example", "archived")),
    )


def test_an_object_read_before_a_delete_does_not_bring_the_row_back(app, endpoint):
    stale = Endpoint.objects.get(pk=endpoint.pk)
    webhooks.delete_endpoint(endpoint.pk)
    for call in (
        lambda: webhooks.update_endpoint(stale, description="back"),
        lambda: webhooks.disable_endpoint(stale),
        lambda: webhooks.enable_endpoint(stale),
        lambda: webhooks.send_test_event(stale),
        lambda: webhooks.rotate_secret(stale),
        lambda: webhooks.delete_endpoint(Endpoint()),
    ):
        with pytest.raises(InvalidEndpoint):
            call()
    assert not Endpoint.objects.exists()
    old_app = Application.objects.get(uid="acme")
    webhooks.delete_application("acme")
    for call in (
        lambda: webhooks.update_application(old_app, name="x"),
        lambda: outbox.publish("order.paid", {}, application=old_app),
        lambda: webhooks.create_endpoint(old_app, URL),
        lambda: outbox.publish("order.paid", {}, application=Application(uid="never")),
        lambda: webhooks.delete_application(Application()),
    ):
        with pytest.raises(UnknownApplication):
            call()
    assert not Application.objects.exists()


def test_a_refused_change_is_not_saved_by_a_later_call(app, endpoint):
    obj = Endpoint.objects.get(pk=endpoint.pk)
    with pytest.raises(InvalidEndpoint):
        webhooks.update_endpoint(obj, description="REFUSED", channels=[1])
    webhooks.disable_endpoint(obj)
    assert Endpoint.objects.get(pk=endpoint.pk).description == ""
    with pytest.raises(InvalidEndpoint):
        webhooks.update_application(app, name="REFUSED", max_endpoints=-1)
    webhooks.update_application(app, metadata={"k": 1})
    assert Application.objects.get(pk=app.pk).name == ""


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"rate_limit": {"RATE": 5}}, "rate_limit"),
        ({"rate_limit": "9" * 50 + "/s"}, "rate_limit"),
        ({"max_concurrency": 2**63}, "max_concurrency"),
        ({"metadata": {"a": float("nan")}}, "metadata"),
        ({"metadata": {"a": b"x"}}, "metadata"),
        ({"metadata": {1: "x"}}, "metadata"),
        ({"metadata": {"a": (1, 2)}}, "metadata"),
        ({"filter_types": [["order.paid"]]}, "filter_types"),
        ({"channels": [["a"]]}, "channels"),
        ({"channels": [{"a": 1}]}, "channels"),
        ({"secret": "whsec_x"}, "secret"),
        ({"disabled_reason": "x"}, "disabled_reason"),
    ],
)
def test_an_endpoint_change_of_the_wrong_type_is_refused_naming_its_field(app, endpoint, changes, field):
    before = _rows()
    with pytest.raises(InvalidEndpoint) as refused:
        webhooks.update_endpoint(endpoint.pk, **changes)
    assert refused.value.field == field
    assert _rows() == before
    webhooks.disable_endpoint(endpoint.pk)  # still changeable


@pytest.mark.parametrize("disabled", ["no", "false", 1])
def test_disabled_must_be_a_bool(app, disabled):
    with pytest.raises(InvalidEndpoint, match="disabled"):
        webhooks.create_endpoint(app, URL, disabled=disabled)
    assert not Endpoint.objects.exists()


@pytest.mark.parametrize("reason", [123, b"x", ["x"], "x" * 201, "a\x00b"])
def test_a_disable_reason_must_be_printable_text(endpoint, reason):
    with pytest.raises(InvalidEndpoint, match="reason"):
        webhooks.disable_endpoint(endpoint.pk, reason=reason)
    assert not Endpoint.objects.get(pk=endpoint.pk).disabled


@pytest.mark.parametrize(
    "overlap", ["abc", "10", True, [1], float("inf"), float("nan"), 1e12, -1, timedelta(days=31)]
)
def test_a_rotation_overlap_is_seconds_within_30_days(endpoint, overlap):
    before = webhooks.endpoint_secret(endpoint.pk)
    with pytest.raises(InvalidEndpoint) as refused:
        webhooks.rotate_secret(endpoint.pk, overlap=overlap)
    assert refused.value.field == "overlap"
    assert webhooks.endpoint_secret(endpoint.pk) == before
    webhooks.rotate_secret(endpoint.pk, overlap=timedelta(hours=1))


def test_applications_and_event_types_refuse_values_json_or_the_column_cannot_hold(app):
    before = _rows()
    for call, field in (
        (lambda: webhooks.create_application("m", metadata={"a": math.nan}), "metadata"),
        (lambda: webhooks.create_application("m", metadata={1: "x"}), "metadata"),
        (lambda: webhooks.create_application("m", max_endpoints=2**63), "max_endpoints"),
        (lambda: webhooks.create_application(" "), "uid"),
        (lambda: webhooks.create_application("m", name="a\x00b"), "name"),
        (lambda: webhooks.update_application(app, max_endpoints=2**31), "max_endpoints"),
        (lambda: webhooks.create_event_type("t.x", example=b"raw"), "example"),
        (lambda: webhooks.create_event_type("t.x", schema={"a": {1, 2}}), "schema"),
        (lambda: webhooks.update_event_type("order.paid", archived="false"), "archived"),
        (lambda: webhooks.update_event_type("order.paid", name="renamed"), "name"),
    ):
        with pytest.raises(InvalidEndpoint) as refused:
            call()
        assert refused.value.field == field
    assert _rows() == before


def test_test_events_and_subscribed_check_their_arguments_as_publish_does(app, endpoint):
    for event_type in ("a\r\nX-Injected: y", 123, ["x"]):
        with pytest.raises(InvalidEndpoint):
            webhooks.send_test_event(endpoint.pk, event_type=event_type)
    with pytest.raises(UnknownEventType):
        webhooks.send_test_event(endpoint.pk, event_type="unknown.type")
    for channels in ("ab", {"a": 1}, None, [["a"]]):
        if channels is None:
            assert webhooks.subscribed(app, "order.paid", channels) == [endpoint]  # None: no channels
            continue
        with pytest.raises(InvalidEndpoint):
            webhooks.subscribed(app, "order.paid", channels)
    with pytest.raises(InvalidEndpoint):
        outbox.publish("order.paid", {}, application=app, channels=[["a"]])
    with pytest.raises(InvalidEndpoint):
        webhooks.subscribed(app, 123)


def test_a_payload_error_names_the_payload(app):
    with pytest.raises(InvalidMessage) as refused:
        outbox.publish("order.paid", object(), application=app)
    assert refused.value.field == "payload"
