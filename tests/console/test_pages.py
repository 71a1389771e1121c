"""The console's pages through the Django test client, against the real test Redis."""

from __future__ import annotations

import json
import time

import pytest

import outbox
from outbox.admin_views.formatting import BODY_PREVIEW_BYTES
from outbox.conf import outbox_settings
from outbox.records import STATUSES
from tests.support.console import element_text, listed_ids, make, staff, text_of, u

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


# -- admin index and access ---------------------------------------------------------
def test_admin_index_links_the_dashboard(superuser_client):
    html = text_of(superuser_client.get("/admin/"))
    assert "Outbox" in html
    assert f'href="{u("message_changelist")}"' in html
    assert u("message_changelist") == u("dashboard")


def test_anonymous_is_sent_to_login(client, repo):
    for path in (u("dashboard"), u("message_list")):
        response = client.get(path)
        assert response.status_code == 302
        assert "/login/" in response["Location"]


def test_staff_without_view_permission_gets_403(client, django_user_model, repo):
    m = make(repo, 1)[0]
    client.force_login(staff(django_user_model, "nobody"))
    for path in (u("dashboard"), u("message_list"), u("message_detail", m.id), u("message_body", m.id)):
        assert client.get(path).status_code == 403, path
    assert "Outbox" not in text_of(client.get("/admin/"))


def test_viewer_sees_pages_but_no_actions(viewer_client, repo):
    m = make(repo, 3, "failed")[0]
    assert viewer_client.get(u("dashboard")).status_code == 200
    html = text_of(viewer_client.get(u("message_list") + "?status=failed"))
    assert 'id="action-select"' not in html
    assert 'class="action-select"' not in html
    detail = text_of(viewer_client.get(u("message_detail", m.id)))
    assert 'id="detail-requeue"' not in detail


# -- dashboard -----------------------------------------------------------------------
def test_dashboard_counts_per_status_and_destination(superuser_client, repo):
    make(repo, 4, "failed", destination="hook")
    make(repo, 1, "succeeded", destination="hook")
    make(repo, 3, "pending", destination="mem")
    make(repo, 2, "cancelled", destination="mem")
    html = text_of(superuser_client.get(u("dashboard")))
    expected = {
        "pending": 3,
        "sending": 0,
        "retrying": 0,
        "succeeded": 1,
        "failed": 4,
        "cancelled": 2,
        "waiting": 0,
    }
    for status in STATUSES:
        assert element_text(html, f"count-{status}") == str(expected[status])
    assert element_text(html, "count-total") == "10"
    # Dead letters kept from long ago do not make a destination failing: only its recent
    # attempts do (none here), so neither is flagged.
    assert 'class="destination-row" data-destination="hook" data-state="idle"' in html
    assert 'class="destination-row" data-destination="mem" data-state="idle"' in html
    # Count links lead to the filtered list.
    assert f'href="{u("message_list")}?status=failed&amp;destination=hook"' in html


def test_dashboard_queues_workers_and_oldest(superuser_client, repo):
    make(repo, 3)  # three pending messages, one wake-up job queued
    outbox.send("mem", "later", delay=3600)  # due later: no job
    html = text_of(superuser_client.get(u("dashboard")))
    assert '<tr data-queue="outbox">' in html
    row = html.split('<tr data-queue="outbox">')[1].split("</tr>")[0]
    assert '<td class="due">3</td>' in row and '<td class="later">1</td>' in row
    assert '<td class="queued">1</td>' in row
    assert element_text(html, "worker-count") == "0"
    assert "no worker is running" in html
    assert "due " in html.split('id="oldest-pending-wait"')[1].split("</td>")[0]
    assert "none" in html.split('id="oldest-retry-wait"')[1].split("</td>")[0]
    assert element_text(html, "purge-backlog") == "0"


def test_dashboard_shows_the_purge_backlog(superuser_client, repo, settings):
    settings.OUTBOX = {**settings.OUTBOX, "RETENTION": {"succeeded": 60, "cancelled": 0, "failed": None}}
    sent = make(repo, 3)
    outbox.cancel([m.id for m in sent])
    time.sleep(0.01)
    html = text_of(superuser_client.get(u("dashboard")))
    assert element_text(html, "purge-backlog") == "3"


def test_dashboard_chart_counts_outcomes_of_real_deliveries(superuser_client, repo, hook, worker):
    hook.respond(200)
    outbox.send_many([{"destination": "hook", "body": {"i": i}} for i in range(3)])
    worker()
    outbox.send("hook", {"fails": True}, max_retries=0)
    hook.respond(400)
    worker()
    html = text_of(superuser_client.get(u("dashboard")))
    assert '<svg id="outcome-chart"' in html
    assert element_text(html, "chart-total-succeeded") == "3"
    assert element_text(html, "chart-total-permanent") == "1"
    assert element_text(html, "chart-total-retryable") == "0"
    assert 'class="series-succeeded"' in html and 'class="series-permanent"' in html
    assert element_text(html, "count-succeeded") == "3"
    assert element_text(html, "count-failed") == "1"
    # An outage still retrying shows on the chart (attempts, not dead letters).
    hook.respond(503)
    outbox.send("hook", {"outage": True}, retry=[3600])
    worker()
    html = text_of(superuser_client.get(u("dashboard")))
    assert element_text(html, "chart-total-retryable") == "1"
    assert element_text(html, "count-retrying") == "1"


# -- message list --------------------------------------------------------------------
def test_list_shows_columns_and_true_count(superuser_client, repo):
    make(repo, 3, "failed", destination="hook")
    html = text_of(superuser_client.get(u("message_list")))
    assert len(listed_ids(html)) == 3
    assert 'data-total="3"' in html
    for label in ("Destination", "Status", "Retries", "Next attempt", "Last error", "Created", "Updated"):
        assert label in html
    assert "3 / 3" in html  # retry count / max retries of hook
    assert "HTTP 500 from receiver" in html


def test_list_filters_by_status_and_destination(superuser_client, repo):
    failed_hook = make(repo, 3, "failed", destination="hook")
    make(repo, 2, "failed", destination="mem")
    make(repo, 4, "pending", destination="hook")
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&destination=hook"))
    assert set(listed_ids(html)) == {m.id for m in failed_hook}
    assert 'data-total="3"' in html
    # Sidebar: status links with counts for the destination; the filter links keep each other.
    assert 'id="status-filter-failed"' in html
    assert "Failed (3)" in html and "Pending (4)" in html
    assert 'data-destination="hook"' in html and 'data-destination="mem"' in html
    html = text_of(superuser_client.get(u("message_list") + "?destination=hook"))
    assert 'data-total="7"' in html


def test_list_filters_by_queue(superuser_client, repo):
    high = make(repo, 2, "failed", priority="high")
    make(repo, 3, "failed")
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&queue=outbox_high"))
    assert set(listed_ids(html)) == {m.id for m in high}
    assert 'data-exact="true"' in html  # the scan covered the whole (small) index


def test_list_bounded_scan_says_so(superuser_client, repo, monkeypatch):
    from outbox.store.reads import queries

    monkeypatch.setattr(queries, "SCAN_LIMIT", 5)
    make(repo, 12, "failed")
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&queue=outbox"))
    assert 'data-exact="false"' in html
    assert "only the first 5 of 12 messages were checked" in html
    assert len(listed_ids(html)) == 5


def test_list_created_range(superuser_client, repo):
    old = make(repo, 2, "failed")
    time.sleep(0.05)
    cut = time.time()
    time.sleep(0.05)
    new = make(repo, 3, "failed")
    html = text_of(superuser_client.get(u("message_list") + f"?created_from={cut}"))
    assert set(listed_ids(html)) == {m.id for m in new}
    # With a status the created range is checked id by id (from the id itself).
    html = text_of(superuser_client.get(u("message_list") + f"?status=failed&created_to={cut}"))
    assert set(listed_ids(html)) == {m.id for m in old}


def test_list_updated_range_on_a_finished_status(superuser_client, repo):
    first = make(repo, 2, "failed")
    time.sleep(0.05)
    cut = time.time()
    make(repo, 3, "failed")
    html = text_of(superuser_client.get(u("message_list") + f"?status=failed&updated_to={cut}"))
    assert set(listed_ids(html)) == {m.id for m in first}
    assert 'data-exact="true"' in html


def test_list_iso_time_filter_and_bad_values(superuser_client, repo):
    make(repo, 2)
    html = text_of(superuser_client.get(u("message_list") + "?created_from=2000-01-01T00:00&status=nope"))
    assert len(listed_ids(html)) == 2
    assert "Unknown status" in html
    html = text_of(superuser_client.get(u("message_list") + "?created_from=yesterday-ish"))
    assert "not a time" in html


def test_list_search_by_id_and_idempotency_key(superuser_client, repo):
    make(repo, 3)
    keyed = outbox.send("mem", {"order": 7}, idempotency_key="order-7")
    html = text_of(superuser_client.get(u("message_list") + f"?q={keyed.id}"))
    assert listed_ids(html) == [keyed.id]
    html = text_of(superuser_client.get(u("message_list") + "?q=order-7"))
    assert listed_ids(html) == [keyed.id]
    html = text_of(superuser_client.get(u("message_list") + "?q=no-such-thing"))
    assert listed_ids(html) == []
    assert "0 results" in html


def test_list_sorts_by_the_serving_index(superuser_client, repo):
    messages = []
    for _ in range(3):  # one at a time: messages of one send_many share their created_at
        messages += make(repo, 1, "failed")
        time.sleep(0.002)
    ids = [m.id for m in messages]  # created (and failed) in this order
    html = text_of(superuser_client.get(u("message_list") + "?o=created"))
    assert listed_ids(html) == ids
    html = text_of(superuser_client.get(u("message_list") + "?o=-created"))
    assert listed_ids(html) == ids[::-1]
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&o=updated"))
    assert listed_ids(html) == ids
    assert 'id="sort-updated"' in html and 'aria-sort="ascending"' in html
    assert 'id="sort-created"' not in html  # not served with a status
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&o=created"))
    assert "Sorting by created is not available for failed messages" in html
    assert listed_ids(html) == ids[::-1]  # the default: latest failed first


def test_list_pending_sorted_by_next_attempt(superuser_client, repo):
    later = outbox.send("mem", "later", delay=600)
    sooner = outbox.send("mem", "sooner", delay=60)
    now = outbox.send("mem", "now")
    html = text_of(superuser_client.get(u("message_list") + "?status=pending"))
    assert listed_ids(html) == [now.id, sooner.id, later.id]  # soonest due first by default
    html = text_of(superuser_client.get(u("message_list") + "?status=pending&o=-next_attempt"))
    assert listed_ids(html) == [later.id, sooner.id, now.id]


@pytest.mark.skipif(
    outbox_settings.partitions > 1,
    reason="numbered pages are the list of one partition; with more it pages by Previous/Next "
    "(tests/console/test_partitioned_list.py)",
)
def test_list_pagination(superuser_client, repo):
    messages = make(repo, 120, "failed")
    newest_first = [m.id for m in messages][::-1]
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&p=2"))
    assert listed_ids(html) == newest_first[50:100]
    assert 'data-total="120"' in html
    assert '<span class="this-page" aria-current="page">2</span>' in html
    assert "?status=failed&amp;p=3" in html
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&p=3"))
    assert listed_ids(html) == newest_first[100:]
    html = text_of(
        superuser_client.get(u("message_list") + "?status=failed&p=9")
    )  # past the end: the last page
    assert listed_ids(html) == newest_first[100:] and "this is the last page, 3." in html


def test_list_select_across_control_and_action_menu(superuser_client, repo):
    make(repo, 60, "failed", destination="hook")
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&destination=hook"))
    for element in (
        "action-select",
        "action-go",
        "action-toggle",
        "select-across-link",
        "select-across",
        "result_list",
    ):
        assert f'id="{element}"' in html, element
    assert "Select all 60 matching messages" in html
    # The action form carries the filter for "all matching".
    assert '<input type="hidden" name="status" value="failed">' in html
    assert '<input type="hidden" name="destination" value="hook">' in html
    assert f'action="{u("message_action")}"' in html


# -- detail and body -----------------------------------------------------------------
def test_detail_shows_records_masked_headers_and_escaped_body(superuser_client, repo):
    m = outbox.send(
        "hook",
        "<script>alert(1)</script>",
        content_type="text/html",
        headers={
            "Authorization": "Bearer sekrit",
            "X-Api-Key": "k123",
            "X-Trace": "trace-1",
            "Cookie": "s=1",
        },
        idempotency_key="key-1",
    )
    html = text_of(superuser_client.get(u("message_detail", m.id)))
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "sekrit" not in html and "k123" not in html and "s=1" not in html
    assert "trace-1" in html
    assert 'id="message-record"' in html and 'id="resend-record"' in html
    assert "key-1" in html
    assert element_text(html, "message-status") == "pending"
    assert 'id="detail-cancel"' in html and 'id="detail-delete"' in html
    assert 'id="detail-requeue"' not in html  # pending cannot be requeued


def test_xss_in_every_field_is_escaped(superuser_client, repo):
    evil = "<img src=x onerror=alert(1)>"
    m = outbox.send("mem", {"x": evil}, headers={"X-Evil": evil}, idempotency_key="k<b>")
    make(repo, 0)
    for path in (
        u("message_detail", m.id),
        u("message_list"),
        u("message_list") + "?q=" + evil,
        u("dashboard"),
    ):
        html = text_of(superuser_client.get(path))
        assert evil not in html, path
        assert "<b>" not in html


def test_detail_pretty_prints_json(superuser_client, repo):
    m = outbox.send("mem", {"b": [1, 2], "a": "é"})
    html = text_of(superuser_client.get(u("message_detail", m.id)))
    pretty = json.dumps({"b": [1, 2], "a": "é"}, indent=2, ensure_ascii=False).replace('"', "&quot;")
    assert pretty in html
    assert "JSON, pretty-printed" in html


def test_detail_truncates_large_bodies_and_download_serves_all(superuser_client, repo):
    body = "x" * (BODY_PREVIEW_BYTES + 1000)
    m = outbox.send("mem", body, content_type="text/plain")
    html = text_of(superuser_client.get(u("message_detail", m.id)))
    assert "only its first part is shown" in html
    assert "x" * (BODY_PREVIEW_BYTES + 1) not in html
    response = superuser_client.get(u("message_body", m.id))
    assert response.status_code == 200
    assert response.content == body.encode()
    assert response["Content-Type"] == "text/plain"
    assert response["Content-Disposition"] == f'attachment; filename="{m.id}.txt"'
    assert response["X-Content-Type-Options"] == "nosniff"


def test_detail_attempt_history_from_real_deliveries(superuser_client, repo, hook, worker):
    hook.respond(500, 500, 500, 500)
    m = outbox.send("hook", {"order": 1})
    worker()
    assert outbox.get(m.id).status == "failed"
    html = text_of(superuser_client.get(u("message_detail", m.id)))
    assert 'id="attempts"' in html
    assert html.count('<tr class="attempt outcome-') == 4  # 1 attempt + 3 retries
    assert "outcome-retrying" in html and "outcome-failed" in html
    assert "<td>500</td>" in html
    assert (
        element_text(html, "message-retries") == "3 / 3"
    )  # retry_count counts retries; a dead letter has spent them all
    assert 'id="detail-requeue"' in html and 'id="detail-delete"' in html


def test_detail_404_for_unknown_message(superuser_client, repo):
    assert superuser_client.get(u("message_detail", "msg_nope")).status_code == 404
    assert superuser_client.get(u("message_body", "msg_nope")).status_code == 404


# -- GET never changes state ---------------------------------------------------------
def _snapshot(conn) -> dict:
    return {key: conn.dump(key) for key in sorted(conn.keys("*"))}


def test_get_pages_change_nothing(superuser_client, repo, redis):
    failed = make(repo, 3, "failed", destination="hook")
    make(repo, 2, "retrying")
    make(repo, 2, "sending")
    before = _snapshot(redis)
    paths = [
        u("dashboard"),
        u("message_list"),
        u("message_list") + "?status=failed&destination=hook&queue=outbox&created_from=1h",
        u("message_list") + "?status=retrying&o=-next_attempt&updated_from=1h",
        u("message_list") + f"?q={failed[0].id}",
        u("message_detail", failed[0].id),
        u("message_body", failed[0].id),
    ]
    for path in paths:
        assert superuser_client.get(path).status_code == 200, path
    # The action URL refuses GET outright.
    assert superuser_client.get(u("message_action") + "?action=delete&select_across=1").status_code == 405
    assert _snapshot(redis) == before
