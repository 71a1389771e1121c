"""The admin's webhook pages from outside (found by a browser check): bad input is a form
error, never a 500; a secret is shown on the page that made it and nowhere else (not in
the messages cookie or the session); rotating and reading a secret need
``outbox.view_endpoint_secret``; an endpoint's application cannot be changed; and the
state of an endpoint enabled again after failures does not claim a success."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.fernet import Fernet
from django.contrib.admin.models import LogEntry
from django.contrib.sessions.models import Session

import outbox
from outbox import webhooks
from outbox.destinations import health
from outbox.models import Application, Endpoint, EventType
from tests.support.console import endpoint_form, staff
from tests.support.http import receiving
from tests.support.messages import run_worker

pytestmark = pytest.mark.django_db

URL = "https://93.184.215.14/hook"
ADD = "/admin/outbox/endpoint/add/"
LIST = "/admin/outbox/endpoint/"


def _form(app: Application, **over) -> dict:
    return endpoint_form(app, URL, **over)


@pytest.fixture
def app():
    webhooks.create_event_type("order.paid")
    return webhooks.create_application("acme")


def _stored_anywhere(response, client, secret: str) -> list[str]:
    """Where ``secret`` was kept beyond the page: the messages cookie, a session row."""
    found = []
    for name, morsel in response.cookies.items():
        value = morsel.value
        if secret in value:
            found.append(f"cookie {name}")
        for part in value.split(":")[:1]:  # signed cookie storage: base64 of the JSON first
            try:
                if secret in base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode(errors="ignore"):
                    found.append(f"cookie {name} (decoded)")
            except ValueError:
                pass
    for session in Session.objects.all():
        if secret in json.dumps(session.get_decoded()):
            found.append(f"session {session.session_key}")
    return found


def test_an_application_at_its_cap_is_a_form_error_not_a_500(superuser_client, app):
    webhooks.update_application(app, max_endpoints=1)
    webhooks.create_endpoint(app, URL)
    response = superuser_client.post(ADD, _form(app))
    assert response.status_code == 200, response.status_code
    assert "max_endpoints" in response.content.decode()
    assert Endpoint.objects.count() == 1


@pytest.mark.parametrize("metadata", ["[1, 2]", '"text"'])
def test_metadata_that_is_not_an_object_is_a_form_error(superuser_client, app, metadata):
    response = superuser_client.post(ADD, _form(app, metadata=metadata))
    assert response.status_code == 200 and "metadata must be a dict" in response.content.decode()
    assert not Endpoint.objects.exists()
    created = webhooks.create_endpoint(app, URL)
    change = f"{LIST}{created.endpoint.pk}/change/"
    response = superuser_client.post(change, _form(app, metadata=metadata))
    assert response.status_code == 200 and "metadata must be a dict" in response.content.decode()
    assert Endpoint.objects.get().metadata == {}


def test_channels_or_types_that_are_not_a_list_are_a_form_error(superuser_client, app):
    for field in ("channels", "filter_types"):
        response = superuser_client.post(ADD, _form(app, **{field: '{"a": 1}'}))
        assert response.status_code == 200 and "must be a list" in response.content.decode(), field
    assert not Endpoint.objects.exists()
    with pytest.raises(webhooks.InvalidEndpoint):
        webhooks.create_endpoint(app, URL, channels={"eu": 1})


def test_an_event_type_with_a_bad_name_is_a_form_error(superuser_client):
    response = superuser_client.post("/admin/outbox/eventtype/add/", {"name": "bad name!", "description": ""})
    assert response.status_code == 200 and "letters, digits" in response.content.decode()
    assert not EventType.objects.exists()


def test_an_application_with_a_bad_uid_or_metadata_is_a_form_error(superuser_client):
    for data in (
        {"uid": "tab\tuid", "name": "", "metadata": "{}"},
        {"uid": "ok", "name": "", "metadata": "[1]"},
    ):
        response = superuser_client.post("/admin/outbox/application/add/", data)
        assert response.status_code == 200, (data, response.status_code)
    assert not Application.objects.exists()


def test_an_endpoints_application_cannot_be_changed(superuser_client, app):
    other = webhooks.create_application("globex")
    created = webhooks.create_endpoint(app, URL)
    change = f"{LIST}{created.endpoint.pk}/change/"
    page = superuser_client.get(change).content.decode()
    assert 'name="application"' not in page  # read-only: shown, not a field
    superuser_client.post(change, {**_form(other), "description": "moved?"})
    row = Endpoint.objects.get()
    assert row.application_id == app.pk and row.description == "moved?"


def test_a_created_secret_is_on_its_page_only(superuser_client, app):
    response = superuser_client.post(ADD, _form(app))
    assert response.status_code == 200, response.status_code  # the page that shows it, not a redirect
    secret = webhooks.endpoint_secret(Endpoint.objects.get())
    assert secret in response.content.decode()
    assert (
        response.headers["Cache-Control"].startswith("no-store")
        or "no-store" in response.headers["Cache-Control"]
    )
    assert _stored_anywhere(response, superuser_client, secret) == []
    assert not any(secret in (e.change_message or "") for e in LogEntry.objects.all())


def test_rotation_needs_the_secret_permission_and_shows_the_new_secret_on_its_page(
    client, django_user_model, app
):
    created = webhooks.create_endpoint(app, URL)
    before = webhooks.endpoint_secret(created.endpoint)
    support = staff(django_user_model, "support", "view_endpoint", "change_endpoint")
    client.force_login(support)
    assert 'value="rotate_secret"' not in client.get(LIST).content.decode()  # not offered
    client.post(LIST, {"action": "rotate_secret", "_selected_action": [str(created.endpoint.pk)]})
    assert webhooks.endpoint_secret(created.endpoint) == before  # refused: nobody could see the new one
    secops = staff(django_user_model, "secops", "view_endpoint", "change_endpoint", "view_endpoint_secret")
    client.force_login(secops)
    response = client.post(LIST, {"action": "rotate_secret", "_selected_action": [str(created.endpoint.pk)]})
    new = webhooks.endpoint_secret(created.endpoint)
    assert new != before and response.status_code == 200 and new in response.content.decode()
    assert "no-store" in response.headers["Cache-Control"]
    assert _stored_anywhere(response, client, new) == []
    rotated = LogEntry.objects.filter(object_id=str(created.endpoint.pk), user=secops)
    assert rotated.exists() and all(new not in (e.change_message or "") for e in rotated)


def test_the_current_secret_is_shown_to_a_user_holding_the_permission_on_a_post(
    client, django_user_model, app
):
    created = webhooks.create_endpoint(app, URL)
    show = f"{LIST}{created.endpoint.pk}/secret/"
    support = staff(django_user_model, "support", "view_endpoint", "change_endpoint")
    client.force_login(support)
    assert client.post(show).status_code == 403
    assert show not in client.get(f"{LIST}{created.endpoint.pk}/change/").content.decode()  # no link
    secops = staff(django_user_model, "secops", "view_endpoint", "view_endpoint_secret")
    client.force_login(secops)
    assert show in client.get(f"{LIST}{created.endpoint.pk}/change/").content.decode()
    page = client.get(show)
    assert page.status_code == 200 and created.secret not in page.content.decode()  # a button, not the secret
    shown = client.post(show)
    assert shown.status_code == 200 and created.secret in shown.content.decode()
    assert "no-store" in shown.headers["Cache-Control"]
    viewed = LogEntry.objects.get(object_id=str(created.endpoint.pk), user=secops)
    assert created.secret not in viewed.change_message


def test_rotating_a_secret_no_key_decrypts_is_a_message_not_a_500(superuser_client, app, settings):
    created = webhooks.create_endpoint(app, URL)
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "SECRET_KEYS": [Fernet.generate_key().decode()]},
    }
    response = superuser_client.post(
        LIST, {"action": "rotate_secret", "_selected_action": [str(created.endpoint.pk)]}, follow=True
    )
    assert response.status_code == 200
    assert "SECRET_KEYS" in response.content.decode()


def test_secret_sets_do_not_show_their_secrets_in_a_repr(app):
    from outbox.destinations.secrets import SecretSet

    created = webhooks.create_endpoint(app, URL)
    assert created.secret not in repr(SecretSet(created.secret))


@pytest.mark.django_db(transaction=True)
def test_an_endpoint_enabled_again_after_failures_is_not_said_to_have_succeeded(app):
    """Enabling starts a new failure run (``lua/admin.lua``): its state must still not
    claim a success it never had; its next success makes it healthy."""
    with receiving() as rx:
        rx.respond(*[400] * 3)
        created = webhooks.create_endpoint(app, rx.url)
        name = created.endpoint.destination
        for n in range(3):
            outbox.publish("order.paid", {"n": n}, application=app)
        run_worker(simple=True)
        webhooks.disable_endpoint(created.endpoint)
        webhooks.enable_endpoint(created.endpoint)
        h = health.get_health(name)
        state = health.destination_state(h)
        assert h.last_success_at is None and h.window.attempts == 3, h
        assert state.name != "healthy" and "succeeded" not in state.reason, state
        rx.respond(200)
        outbox.publish("order.paid", {"n": 4}, application=app)
        run_worker(simple=True)
        assert health.destination_state(health.get_health(name)).name == "healthy"


def test_an_endpoints_uid_limits_and_json_are_form_errors_on_their_fields(superuser_client, app):
    webhooks.create_endpoint(app, URL, uid="taken")
    other = webhooks.create_endpoint(app, URL, uid="mine").endpoint
    for data, field in (
        (_form(app, uid="a\x01"), "uid"),
        (_form(app, uid="taken"), "uid"),
        (_form(app, max_concurrency="0"), "max_concurrency"),
        (_form(app, metadata='{"a": NaN}'), "metadata"),
        (_form(app, channels='[["a"]]'), "channels"),
        (_form(app, filter_types='[["order.paid"]]'), "filter_types"),
    ):
        response = superuser_client.post(ADD, data)
        assert response.status_code == 200 and f'id="id_{field}_error"' in response.content.decode(), (
            data,
            response.status_code,
        )
    change = superuser_client.post(f"{LIST}{other.pk}/change/", _form(app, uid="taken"))
    assert change.status_code == 200 and 'id="id_uid_error"' in change.content.decode()
    assert Endpoint.objects.count() == 2 and Endpoint.objects.get(pk=other.pk).uid == "mine"


def test_json_an_application_or_event_type_cannot_hold_is_a_form_error(superuser_client):
    for url, data in (
        ("/admin/outbox/application/add/", {"uid": "m", "name": "", "metadata": '{"a": Infinity}'}),
        ("/admin/outbox/eventtype/add/", {"name": "t.x", "description": "", "example": "NaN"}),
        ("/admin/outbox/eventtype/add/", {"name": "t.y", "description": "", "schema": '{"a": NaN}'}),
    ):
        response = superuser_client.post(url, data)
        assert response.status_code == 200 and "errorlist" in response.content.decode(), (url, data)
    assert not Application.objects.exists() and not EventType.objects.exists()
