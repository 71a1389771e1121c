"""Blocked ordering keys in a real browser (issue 23): from the dashboard to a
destination's blocked keys, "Requeue head…", the confirmation, the report; then a worker
delivers the key's messages in order. Playwright drives Debian's Chromium against a live
server (see :mod:`tests.support.browser`); screenshots to ``docs/screenshots/`` with
``OUTBOX_SCREENSHOTS=1``."""

from __future__ import annotations

import pytest

import outbox
from tests.support.browser import TIMEOUT_MS, logged_in_page, prepare, shot
from tests.support.console import BLOCKING_ERROR, blocked_key

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_requeue_the_head_of_a_blocked_key_in_the_browser(
    live_server, worker, repo, django_user_model, tmp_path
):
    executable, screenshots = prepare(django_user_model, tmp_path)
    order_42 = blocked_key(worker, "order-42", behind=2)
    order_43 = blocked_key(worker, "order-43", behind=0)

    with logged_in_page(executable, live_server.url) as (page, errors):
        assert page.locator("#blocked-keys").get_attribute("data-count") == "2"
        page.goto(f"{live_server.url}/admin/outbox/message/messages/{order_42[2].id}/")
        assert page.locator("#key-head-link").inner_text().strip() == order_42[0].id
        shot(page, screenshots, "message-detail-waiting", full_page=False)
        page.click("#ordering-key-link")  # every message of the key, newest first
        page.wait_for_selector("#ordering-key-state", timeout=TIMEOUT_MS)
        listed = page.locator("#result_list tbody tr")
        assert [listed.nth(i).get_attribute("data-message-id") for i in range(listed.count())] == [
            m.id for m in reversed(order_42)
        ]
        shot(page, screenshots, "message-list-ordering-key", full_page=False)
        page.goto(f"{live_server.url}/admin/outbox/message/")
        page.click('.blocked-keys-link[data-destination="mem"]')
        page.wait_for_selector("#blocked-keys", timeout=TIMEOUT_MS)
        rows = page.locator("tr.blocked-key")
        assert [rows.nth(i).get_attribute("data-key") for i in range(rows.count())] == [
            "order-42",
            "order-43",
        ]
        row = page.locator('tr.blocked-key[data-key="order-42"]')
        assert row.locator(".blocked-head-link").inner_text().strip() == order_42[0].id
        assert BLOCKING_ERROR in row.locator(".blocked-error").inner_text()
        assert row.locator(".blocked-key-link").inner_text().strip() == "2 messages"
        shot(page, screenshots, "blocked-keys", full_page=False)

        row.locator("button.release-requeue").click()
        page.wait_for_selector("#confirm-action", timeout=TIMEOUT_MS)
        assert "2 messages wait behind it" in page.locator("#release-waiting").inner_text()
        assert page.locator("#release-head").inner_text().strip() == order_42[0].id
        page.click("#confirm-action")

        page.wait_for_selector("ul.messagelist li.success", timeout=TIMEOUT_MS)
        report = page.locator("ul.messagelist li.success").inner_text()
        assert f"its dead letter {order_42[0].id} requeued" in report, report
        keys = page.locator("tr.blocked-key")
        assert [keys.nth(i).get_attribute("data-key") for i in range(keys.count())] == ["order-43"]

        worker(simple=True)  # mem delivers again: the head, then the two behind it, in order
        page.goto(f"{live_server.url}/admin/outbox/message/messages/{order_42[2].id}/")
        assert page.locator("#message-status").inner_text().strip() == "succeeded"
        assert page.locator("#message-order-prev").inner_text().strip() == "2"
        assert errors == [], errors
    assert [outbox.get(m.id).status for m in order_42] == ["succeeded"] * 3
    assert outbox.get(order_43[0].id).status == "failed"
