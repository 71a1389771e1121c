"""The endpoint registry: bad input refused, secrets encrypted and never shown, a wrong
key loud and harmless, tenant isolation (Hypothesis), the admin's pages and actions."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outbox
from outbox import webhooks
from outbox.exceptions import InvalidEndpoint, MessageTooLarge, UnknownApplication, UnknownEventType
from outbox.models import Endpoint
from tests.support.console import endpoint_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def app():
    webhooks.create_event_type("order.paid")
    return webhooks.create_application("acme")


@pytest.mark.parametrize(
    "url, why",
    [
        ("ftp://example.com/x", "https://"),
        ("https://user:pw@example.com/x", "user name or password"),
        ("https://exa mple.com/", "whitespace"),
        ("https://", "no host"),
        ("https://example.com/" + "a" * 3000, "over"),
        ("https://example.com/#frag", "fragment"),
    ],
)
def test_bad_urls_are_refused_at_registration(app, url, why):
    with pytest.raises(InvalidEndpoint, match=why):
        webhooks.create_endpoint(app, url)
    assert not Endpoint.objects.exists()


def test_the_private_network_guard_runs_at_registration(app, settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "ALLOW_PRIVATE_NETWORKS": False},
    }
    for url in (
        "http://127.0.0.1:8000/hook",
        "http://169.254.169.254/latest",
        "http://[::1]/x",
        "http://10.1.2.3/",
    ):
        with pytest.raises(InvalidEndpoint, match="non-public"):
            webhooks.create_endpoint(app, url)
    webhooks.create_endpoint(app, "https://93.184.215.14/hook")  # a public literal: no lookup
    with pytest.raises(InvalidEndpoint, match="non-public"):
        webhooks.create_endpoint(app, "http://localhost:8000/hook")  # a name, resolved (/etc/hosts)


def test_a_host_that_does_not_resolve_yet_is_registered_with_a_warning(app, settings, caplog):
    """Nothing is known to refuse (a name not yet in DNS, a resolver down): the URL is kept,
    a warning logged, and every delivery's connection is checked by the guard (the
    README's first endpoint, ``https://acme.example/hooks``, was refused before)."""
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "ALLOW_PRIVATE_NETWORKS": False},
    }
    with caplog.at_level("WARNING", logger="outbox"):
        created = webhooks.create_endpoint(app, "https://hooks.nowhere.invalid/in")
    assert created.endpoint.url == "https://hooks.nowhere.invalid/in"
    assert "'hooks.nowhere.invalid' does not resolve now" in caplog.text, caplog.text


def test_unknown_or_archived_event_types_and_unknown_applications_are_refused(app, settings):
    with pytest.raises(UnknownEventType):
        webhooks.create_endpoint(app, "https://93.184.215.14/", filter_types=["nope"])
    with pytest.raises(UnknownEventType):
        outbox.publish("nope", {}, application=app)
    webhooks.update_event_type("order.paid", archived=True)
    with pytest.raises(UnknownEventType, match="archived"):
        outbox.publish("order.paid", {}, application=app)
    with pytest.raises(UnknownApplication, match="no application has uid 'ghost'"):
        outbox.publish("order.paid", {}, application="ghost")
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "ALLOW_UNKNOWN_EVENT_TYPES": True},
    }
    assert outbox.publish("anything.goes", {}, application=app).deliveries == ()


def test_payload_limit_and_bad_secrets(app, settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "MAX_PAYLOAD_BYTES": 100},
    }
    with pytest.raises(MessageTooLarge) as too_large:
        outbox.publish("order.paid", {"x": "y" * 200}, application=app)
    # the error names the limit that applied, not the settings destinations' MAX_BODY_BYTES
    assert "OUTBOX['ENDPOINTS']['MAX_PAYLOAD_BYTES']" in str(too_large.value), str(too_large.value)
    assert too_large.value.field == "payload" and too_large.value.limit == 100
    for secret in ("nope", "whsec_" + "A" * 8, "whsec_***"):
        with pytest.raises(InvalidEndpoint) as info:
            webhooks.create_endpoint(app, "https://93.184.215.14/", secret=secret)
        assert secret not in str(info.value) or secret == "nope"


def test_secrets_are_encrypted_at_rest_and_never_in_repr(app):
    created = webhooks.create_endpoint(app, "https://93.184.215.14/")
    row = Endpoint.objects.get(pk=created.endpoint.pk)
    assert created.secret.startswith("whsec_") and created.secret not in row.secrets
    assert created.secret not in repr(created) and created.secret not in repr(row)
    assert webhooks.endpoint_secret(row) == created.secret


def test_a_wrong_key_fails_loudly_in_check_and_the_deliveries_wait(app, settings, caplog):
    from outbox.checks import check_endpoint_secrets
    from outbox.destinations.config import endpoint_cache, get_transport
    from outbox.exceptions import EndpointUnavailable
    from outbox.store import get_repository

    created = webhooks.create_endpoint(app, "https://93.184.215.14/")
    assert check_endpoint_secrets(databases=["default"]) == []
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "SECRET_KEYS": [Fernet.generate_key().decode()]},
    }
    (error,) = check_endpoint_secrets(databases=["default"])
    assert error.id == "outbox.E013" and created.secret not in error.msg
    endpoint_cache.clear()
    with pytest.raises(EndpointUnavailable):
        get_transport(created.endpoint.destination)
    assert "cannot be used" in caplog.text and created.secret not in caplog.text
    admin, reason = get_repository().connection.hmget(
        get_repository().keys.dest(created.endpoint.destination), "admin", "admin_reason"
    )
    assert admin == b"paused" and b"decrypted" in reason  # its deliveries park, not dead-letter


def test_a_settings_destination_cannot_take_an_endpoint_name(settings):
    from outbox.destinations.config import configuration_errors

    settings.OUTBOX = {
        **settings.OUTBOX,
        "DESTINATIONS": {**settings.OUTBOX["DESTINATIONS"], "endpoint:x": {"TRANSPORT": "locmem"}},
    }
    assert any("reserved" in e for e in configuration_errors())


def test_endpoints_add_nothing_per_endpoint_to_the_scripts_config():
    from outbox.destinations.config import breaker_config_json, clear_cache, limits_json

    clear_cache()
    before = (breaker_config_json(), limits_json())
    app = webhooks.create_application("many")
    for _ in range(20):
        webhooks.create_endpoint(app, "https://93.184.215.14/", rate_limit="5/s", max_concurrency=2)
    clear_cache()
    assert (breaker_config_json(), limits_json()) == before


names = st.text(alphabet="abcxyz.:-_", min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    types=st.lists(names, min_size=1, max_size=4, unique=True),
    a_eps=st.lists(
        st.tuples(st.lists(names, max_size=2), st.lists(names, max_size=2), st.one_of(st.none(), names)),
        min_size=1,
        max_size=3,
    ),
    b_eps=st.lists(
        st.tuples(st.lists(names, max_size=2), st.lists(names, max_size=2), st.one_of(st.none(), names)),
        min_size=1,
        max_size=3,
    ),
    event=st.tuples(names, st.lists(names, max_size=3)),
    uids=st.tuples(names, names),
)
def test_a_publish_to_one_application_never_reaches_another_s_endpoints(
    settings, types, a_eps, b_eps, event, uids
):
    """Tenant isolation: whatever the filters, channels, uids and names (the same uid for
    endpoints of both, event types of the same names), a publish to A creates deliveries
    to A's endpoints only."""
    from django.db import transaction

    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "ALLOW_UNKNOWN_EVENT_TYPES": True},
    }
    a_uid, b_uid = uids if uids[0] != uids[1] else (uids[0], uids[1] + "b")
    with transaction.atomic():
        a = webhooks.create_application(a_uid)
        b = webhooks.create_application(b_uid)
        mine, theirs = set(), set()
        for app, eps, into in ((a, a_eps, mine), (b, b_eps, theirs)):
            for n, (ftypes, channels, uid) in enumerate(eps):
                ep = webhooks.create_endpoint(
                    app,
                    "https://93.184.215.14/",
                    filter_types=ftypes,
                    channels=channels,
                    uid=f"{uid}{n}" if uid else None,
                ).endpoint
                into.add(ep.destination)
        published = outbox.publish(event[0], {"e": 1}, application=a_uid, channels=event[1])
        assert {d.destination for d in published.deliveries} <= mine
        assert not {d.destination for d in published.deliveries} & theirs
        transaction.set_rollback(True)


def test_admin_lists_filters_and_acts_on_endpoints(superuser_client, app):
    created = webhooks.create_endpoint(app, "https://93.184.215.14/hook", uid="main")
    page = superuser_client.get("/admin/outbox/endpoint/?q=93.184&disabled__exact=0")
    assert page.status_code == 200 and b"main" in page.content
    assert created.secret.encode() not in page.content
    change = superuser_client.get(f"/admin/outbox/endpoint/{created.endpoint.pk}/change/")
    assert change.status_code == 200 and created.secret.encode() not in change.content
    for action in ("disable", "enable", "rotate_secret", "send_test_event"):
        response = superuser_client.post(
            "/admin/outbox/endpoint/", {"action": action, "_selected_action": [str(created.endpoint.pk)]}
        )
        # rotate answers with the page that shows the new secret; the others redirect
        assert response.status_code == (200 if action == "rotate_secret" else 302), action
    from django.contrib.admin.models import LogEntry

    assert not any(created.secret in (e.change_message or "") for e in LogEntry.objects.all())
    added = superuser_client.post("/admin/outbox/endpoint/add/", endpoint_form(app, "http://127.0.0.1:1/x"))
    assert added.status_code == 200  # the page that shows its secret, once
    assert Endpoint.objects.count() == 2
