"""End to end in a real browser: Playwright drives Debian's Chromium against a live server.

A user logs in, opens the failed messages of one destination, selects all matching
(more than a page), requeues them, confirms, reads the report, and sees the counts
change; once the receiver answers 200 and a worker runs, they are succeeded.

Chromium: ``OUTBOX_CHROMIUM`` if set, else ``/usr/bin/chromium`` (Debian's ``chromium``
package; ``scripts/test`` installs it on CI), else ``chromium`` on PATH. Playwright's
own browser downloads are not used. Without Chromium (or the ``playwright`` package)
the test is skipped with the reason, except when ``CI`` is set: then it fails, so CI
cannot pass without running it.

Screenshots are written to ``docs/screenshots/`` when ``OUTBOX_SCREENSHOTS=1``
(``OUTBOX_SCREENSHOTS=1 pytest tests/console/test_browser.py``), else to a temporary directory.
"""

from __future__ import annotations

import re

import pytest
from django.test import override_settings

import outbox
from tests.support import with_destinations
from tests.support.browser import TIMEOUT_MS, logged_in_page, prepare, shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOOK_FAILED = 60  # more than a page (list_per_page = 50), so "select all matching" is needed
HOOK_SUCCEEDED = 20
MEM_FAILED = 8
MEM_ERROR = "SMTP 451 4.3.0 Mail server temporarily rejected message"
SCRIPT = "<script>alert('xss')</script>"


def outbox_config(hook_url: str) -> override_settings:
    """The test settings with ``hook`` pointed at the receiver and ``mem`` always failing."""
    return with_destinations(
        hook={"TRANSPORT": "webhook", "OPTIONS": {"url": hook_url, "timeout": 5}},
        mem={"TRANSPORT": "locmem", "MAX_RETRIES": 2, "OPTIONS": {"fail_with": MEM_ERROR}},
    )


def order(n: int) -> dict:
    return {
        "destination": "hook",
        "body": {
            "event": "order.paid",
            "order": 1000 + n,
            "total": "49.90",
            "currency": "EUR",
            "customer": {"id": n, "email": f"c{n}@example.com"},
        },
        "headers": {"Authorization": "Bearer sk_live_not_shown", "X-Tenant": "acme"},
        "idempotency_key": f"order-paid-{1000 + n}",
    }


def text(page, selector: str) -> str:
    return page.locator(selector).inner_text(timeout=TIMEOUT_MS).strip()


def test_requeue_all_failed_of_a_destination_in_the_browser(
    live_server, receiver, worker, repo, django_user_model, tmp_path
):
    """Log in, failed list of ``hook``, select all 60 matching, requeue, confirm; counts change."""
    executable, screenshots = prepare(django_user_model, tmp_path)

    with outbox_config(receiver.url):
        # Real deliveries: some succeed, then the receiver fails and retries run out.
        receiver.respond(200)
        outbox.send_many([order(n) for n in range(HOOK_SUCCEEDED)])
        worker(simple=True)
        receiver.respond(500)
        failed = outbox.send_many([order(n) for n in range(HOOK_SUCCEEDED, HOOK_SUCCEEDED + HOOK_FAILED)])
        hostile = outbox.send("mem", {"note": SCRIPT})  # must render as text, never run
        outbox.send_many([{"destination": "mem", "body": {"mail": n}} for n in range(MEM_FAILED - 1)])
        worker(simple=True)
        assert (repo.count("failed", "hook"), repo.count("failed", "mem")) == (HOOK_FAILED, MEM_FAILED)
        assert len(outbox.attempts(failed[0].id)) == 4  # first try + 3 retries, all HTTP 500

        base = live_server.url
        dialogs: list[str] = []
        with logged_in_page(executable, base, dialogs=dialogs) as (page, errors):
            assert text(page, "#count-failed") == str(HOOK_FAILED + MEM_FAILED)
            assert page.locator('tr.destination-row.failing[data-destination="hook"]').count() == 1
            shot(page, screenshots, "dashboard")

            # The failed list, then only the hook destination's.
            page.click("#nav-failed")
            page.click('a.destination-filter[data-destination="hook"]')
            page.wait_for_url(re.compile(r"destination=hook"))
            assert "status=failed" in page.url
            assert page.locator("#result-count").get_attribute("data-total") == str(HOOK_FAILED)
            assert page.locator("#result_list tbody tr").count() == 50
            assert "HTTP 500" in text(page, "#result_list tbody tr:first-child td.field-last-error")
            shot(page, screenshots, "message-list-failed", full_page=False)

            # Select the page, then all matching, choose requeue, Go.
            page.check("#action-toggle")
            page.click("#select-across-link")
            assert page.locator("#select-across").input_value() == "1"
            assert page.locator("#select-across-note").is_visible()
            page.select_option("#action-select", "requeue")
            page.click("#action-go")
            page.wait_for_selector("#confirm-action")
            assert page.locator("#action-count").get_attribute("data-count") == str(HOOK_FAILED)
            assert "retry count is reset to 0" in text(page, "#content-main")
            shot(page, screenshots, "confirm-requeue")
            assert repo.count("failed", "hook") == HOOK_FAILED  # confirming is a separate step

            # Confirm: back on the list, with the report and the new counts.
            page.click("#confirm-action")
            page.wait_for_selector("ul.messagelist li")
            report = text(page, "ul.messagelist li")
            assert f"{HOOK_FAILED} requeued" in report, report
            assert "skipped" not in report
            assert page.locator("#result-count").get_attribute("data-total") == "0"
            assert text(page, "#status-filter-failed") == "Failed (0)"
            assert text(page, "#status-filter-pending") == f"Pending ({HOOK_FAILED})"
            shot(page, screenshots, "after-requeue", full_page=False)
            assert repo.count("pending", "hook") == HOOK_FAILED
            assert repo.count("failed", "mem") == MEM_FAILED  # another destination: untouched

            # The receiver recovers and a worker delivers them: reload and see them succeeded.
            receiver.respond(200)
            worker(simple=True)
            page.reload()
            assert text(page, "#status-filter-succeeded") == f"Succeeded ({HOOK_SUCCEEDED + HOOK_FAILED})"
            assert text(page, "#status-filter-pending") == "Pending (0)"
            page.click("#nav-dashboard")
            assert text(page, "#count-failed") == str(MEM_FAILED)
            assert text(page, "#count-succeeded") == str(HOOK_SUCCEEDED + HOOK_FAILED)
            # hook recovered: a last success, no current run of failures (its window of the
            # last 5 minutes still holds the 240 failed attempts, so it may still be flagged).
            assert page.locator('tr[data-destination="hook"] td.last-success time').count() == 1
            assert text(page, 'tr[data-destination="hook"] td.failing-since') == "–"
            assert page.locator('tr.destination-row.failing[data-destination="mem"]').count() == 1

            # A requeued message: why it failed, attempt by attempt, then its success.
            page.goto(f"{base}/admin/outbox/message/messages/{failed[0].id}/")
            assert text(page, "#message-status") == "succeeded"
            outcomes = page.locator("#attempts tbody tr td:nth-child(3)").all_inner_texts()
            assert outcomes == ["succeeded", "failed", "retrying", "retrying", "retrying"]
            hosts = page.locator("#attempts tbody tr td.attempt-host").all_inner_texts()
            assert set(hosts) == {receiver.url.split("/")[2]}
            codes = page.locator("#attempts tbody tr td:nth-child(5)").all_inner_texts()
            assert codes == ["200", "500", "500", "500", "500"]
            assert "sk_live_not_shown" not in page.content()  # the Authorization header is masked
            shot(page, screenshots, "message-detail")

            # A body with markup is shown as text: no script runs (no dialog).
            page.goto(f"{base}/admin/outbox/message/messages/{hostile.id}/")
            assert SCRIPT in text(page, "#body")
            assert page.locator("#body script").count() == 0

            # A still-failed message of the other destination, with its action buttons.
            mem_id = next(i for i in repo.filter("failed", "mem", limit=2) if i != hostile.id)
            page.goto(f"{base}/admin/outbox/message/messages/{mem_id}/")
            assert MEM_ERROR in text(page, "#resend-record")
            assert page.locator("#detail-requeue").is_visible()
            shot(page, screenshots, "message-detail-failed")

            assert dialogs == [] and errors == [], (dialogs, errors)

    from django.contrib.admin.models import LogEntry

    (entry,) = LogEntry.objects.all()
    assert entry.user.username == "ada"
    assert f"{HOOK_FAILED} requeued" in entry.get_change_message()


def test_destination_page_pause_and_auto_refresh_in_the_browser(
    live_server, receiver, worker, repo, django_user_model, tmp_path
):
    """The destination page: its error groups, Pause -> confirm -> paused shown; the
    auto-refresh toggle reloads the list, is remembered, and waits while rows are checked."""
    executable, screenshots = prepare(django_user_model, tmp_path)

    with outbox_config(receiver.url):
        receiver.respond(503)
        outbox.send_many([order(n) for n in range(5)])
        worker(simple=True)
        assert repo.count("failed", "hook") == 5

        base = live_server.url
        with logged_in_page(executable, base) as (page, errors):
            # From the dashboard to the destination page.
            page.click('tr[data-destination="hook"] a.destination-page-link')
            page.wait_for_selector("#destination-state")
            assert page.locator("#destination-state").get_attribute("data-state") == "failing"
            group = page.locator("tr.error-group").first
            assert group.get_attribute("data-status-code") == "503"
            assert group.get_attribute("data-count") == "20"  # 5 messages x 4 attempts
            shot(page, screenshots, "destination-failing")

            # Pause: a confirmation, then the state shows paused.
            page.click("#state-action-pause")
            page.wait_for_selector("#confirm-action")
            page.fill("#destination-reason", "receiver maintenance")
            page.click("#confirm-action")
            page.wait_for_selector("ul.messagelist li")
            assert "Destination hook paused (receiver maintenance)." in text(page, "ul.messagelist li")
            assert page.locator("#destination-state").get_attribute("data-state") == "paused"
            assert page.locator("#state-action-resume").is_visible()

            # Auto-refresh on the list: off by default; on, it reloads; remembered.
            page.goto(f"{base}/admin/outbox/message/messages/?status=failed")
            assert not page.locator("#auto-refresh").is_checked()
            page.evaluate("document.getElementById('auto-refresh').setAttribute('data-seconds', '0.5')")
            page.evaluate("window.__marker = 1")
            page.check("#auto-refresh")
            page.wait_for_function("window.__marker === undefined")  # reloaded
            page.wait_for_selector("#auto-refresh")
            assert page.locator("#auto-refresh").is_checked()  # remembered in localStorage
            assert page.evaluate("localStorage.getItem('outbox.autoRefresh')") == "on"

            # While rows are checked, it waits; once they are not, it reloads again.
            page.check("#result_list tbody tr:first-child input.action-select")
            page.evaluate("document.getElementById('auto-refresh').setAttribute('data-seconds', '0.3')")
            page.uncheck("#auto-refresh")
            page.check("#auto-refresh")  # rescheduled with the short period
            page.evaluate("window.__marker = 2")
            page.wait_for_timeout(1500)
            assert page.evaluate("window.__marker") == 2
            assert "paused" in text(page, "#auto-refresh-state")
            page.uncheck("#result_list tbody tr:first-child input.action-select")
            page.evaluate("document.activeElement.blur()")
            page.wait_for_function("window.__marker === undefined")  # reloaded
            page.wait_for_selector("#auto-refresh")
            page.uncheck("#auto-refresh")
            assert page.evaluate("localStorage.getItem('outbox.autoRefresh')") == "off"
            assert errors == [], errors
