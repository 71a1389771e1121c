"""The admin's Applications and Endpoints pages in a real browser (issue 34, item 8):
an application and an endpoint created through the admin's forms, the secret shown once,
rotated, the endpoint disabled, a test event sent, the list's health columns and the
link to its console page. Playwright drives Debian's Chromium against a live server
(:mod:`tests.support.browser`: skipped with the reason when Chromium is missing, failed
on CI)."""

from __future__ import annotations

import re

import pytest

from outbox import webhooks
from outbox.models import Application, Endpoint
from tests.support.browser import TIMEOUT_MS, logged_in_page, prepare, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

URL = "https://93.184.215.14/hooks/acme"
SECRET = re.compile(r"whsec_[A-Za-z0-9+/=]{20,}")


def _message(page) -> str:
    page.wait_for_selector("ul.messagelist li", timeout=TIMEOUT_MS)
    return page.locator("ul.messagelist").inner_text()


def _act(page, base: str, endpoint: Endpoint, action: str) -> None:
    page.goto(f"{base}/admin/outbox/endpoint/")
    page.check(f'input[name="_selected_action"][value="{endpoint.pk}"]')
    page.select_option('select[name="action"]', action)
    page.click('button[name="index"]')


def _shown_secret(page) -> str:
    """The secret on the page that shows it (never in a message: its cookie would keep it)."""
    page.wait_for_selector("#endpoint-secret-1", timeout=TIMEOUT_MS)
    assert page.locator("ul.messagelist").count() == 0 or not SECRET.findall(
        page.locator("ul.messagelist").inner_text()
    )
    return page.locator("#endpoint-secret-1").inner_text()


def _no_secret_in_cookies(page, *secrets: str) -> None:
    for cookie in page.context.cookies():
        for secret in secrets:
            assert secret not in cookie["value"], cookie["name"]


def test_applications_and_endpoints_in_the_admin(live_server, django_user_model, tmp_path, monkeypatch):
    executable, screenshots = prepare(django_user_model, tmp_path)
    # The test reads the database between pages, inside Playwright's sync API (an event
    # loop of its own in this thread): Django's guard against the ORM in async code does
    # not apply to it.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    webhooks.create_event_type("order.paid", example={"order": 7})
    base = live_server.url
    with logged_in_page(executable, base) as (page, errors):
        page.goto(f"{base}/admin/outbox/application/add/")
        page.fill("#id_uid", "customer-42")
        page.fill("#id_name", "ACME")
        page.click('input[name="_save"]')
        page.wait_for_selector("ul.messagelist li.success", timeout=TIMEOUT_MS)
        app = Application.objects.get(uid="customer-42")

        page.goto(f"{base}/admin/outbox/endpoint/add/")
        page.select_option("#id_application", str(app.pk))
        page.fill("#id_uid", "main")
        page.fill("#id_url", URL)
        page.fill("#id_filter_types", '["order.paid"]')
        page.click('input[name="_save"]')
        secret = _shown_secret(page)  # shown this once, on the page the save answers with
        endpoint = Endpoint.objects.get(uid="main")
        assert webhooks.endpoint_secret(endpoint) == secret
        shot(page, screenshots, "admin-endpoint-created", full_page=False)
        _no_secret_in_cookies(page, secret)

        page.goto(f"{base}/admin/outbox/endpoint/{endpoint.pk}/change/")
        assert secret not in page.content()  # never again
        page.goto(f"{base}/admin/outbox/endpoint/")
        assert secret not in page.content()
        row = page.locator("#result_list tbody tr").first
        assert "never" in row.inner_text() and "enabled" in row.inner_text()

        _act(page, base, endpoint, "rotate_secret")
        new = _shown_secret(page)
        assert new != secret and webhooks.endpoint_secret(endpoint) == new
        _no_secret_in_cookies(page, secret, new)

        page.goto(f"{base}/admin/outbox/endpoint/{endpoint.pk}/change/")
        page.click("text=show it")  # the secret page: a button first, the secret after a POST
        page.click("#show-secret")
        assert _shown_secret(page) == new and secret in page.content()  # the old one still signs
        _no_secret_in_cookies(page, secret, new)

        _act(page, base, endpoint, "send_test_event")
        assert "1 test event(s) sent: evt_" in _message(page)
        _act(page, base, endpoint, "disable")
        assert "1 endpoint(s) disabled" in _message(page)
        assert Endpoint.objects.get(pk=endpoint.pk).disabled

        page.goto(f"{base}/admin/outbox/endpoint/?disabled__exact=1")
        assert "disabled (disabled in the admin by ada)" in page.locator("#result_list").inner_text()
        shot(page, screenshots, "admin-endpoint-list", full_page=False)
        page.click("#result_list tbody tr a:text('deliveries')")
        page.wait_for_selector("#endpoint-application", timeout=TIMEOUT_MS)
        assert "customer-42" in page.locator("#endpoint-application").inner_text()
        assert page.locator("#destination-state").get_attribute("data-state") == "disabled"
        assert page.locator(".destination-count[data-status='pending']").get_attribute("data-count") == "1"
        for value in (secret, new):
            assert value not in page.content()
        assert errors == []
    from django.contrib.admin.models import LogEntry

    assert not any(
        v in (e.change_message or "") + e.object_repr for e in LogEntry.objects.all() for v in (secret, new)
    )
