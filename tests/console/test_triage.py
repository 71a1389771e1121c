"""Triage in the console (issue 8): list filters by the last HTTP status code and error
class, Retry now, batches (a link to exactly the messages an action acted on), the full
error text. Real Redis, real workers and a real HTTP receiver where delivery matters."""

from __future__ import annotations

import io
import re
import time
from html import unescape

import pytest
from django.core.management import call_command

import outbox
from outbox.store import Change
from outbox.store.reads import queries
from tests.support import hook_settings, settle_due
from tests.support.console import (
    batch_links,
    deliver,
    element_text,
    ids,
    listed_ids,
    make,
    messages_of,
    post,
    statuses,
    text_of,
    u,
)

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


# -- 1. filters by HTTP status code and error class ----------------------------------
def test_list_filters_by_status_code_and_error_class(superuser_client, hook, worker):
    bad_request = deliver(hook, worker, 400, 3)  # permanent: failed at once
    unavailable = deliver(hook, worker, 503, 4)  # retried, then failed
    with hook_settings("http://127.0.0.1:9/hook"):
        refused = outbox.send_many([{"destination": "hook", "body": {"i": i}} for i in range(2)])
        settle_due(worker, refused)
    assert statuses(bad_request + unavailable + refused) == {"failed"}

    base = u("message_list") + "?status=failed&destination=hook"
    html = text_of(superuser_client.get(base + "&status_code=503"))
    assert set(listed_ids(html)) == ids(unavailable)
    assert 'data-total="4"' in html and 'data-exact="false"' not in html
    html = text_of(superuser_client.get(base + "&status_code=400"))
    assert set(listed_ids(html)) == ids(bad_request)
    html = text_of(superuser_client.get(base + "&error_class=http"))
    assert set(listed_ids(html)) == ids(bad_request + unavailable)
    html = text_of(superuser_client.get(base + "&error_class=ConnectError"))
    assert set(listed_ids(html)) == ids(refused)
    # combined with each other and without a status
    html = text_of(superuser_client.get(u("message_list") + "?status_code=503&error_class=http"))
    assert set(listed_ids(html)) == ids(unavailable)
    # each row links its code and class to the list filtered by them
    assert 'data-status-code="503"' in html and 'data-error-class="http"' in html
    link = re.search(r'class="error-code" href="([^"]+)"', html).group(1)
    assert "status_code=503" in unescape(link)


def test_a_bad_status_code_is_a_bad_request(superuser_client, repo):
    make(repo, 2, "failed")
    response = superuser_client.get(u("message_list") + "?status=failed&status_code=abc")
    assert response.status_code == 400
    assert "is not a number from 100 to 599; ignored." in text_of(response)
    assert len(listed_ids(text_of(response))) == 2


def test_requeue_the_503s_not_the_400s(superuser_client, hook, worker):
    bad_request = deliver(hook, worker, 400, 3)
    unavailable = deliver(hook, worker, 503, 5)
    data = {
        "action": "requeue",
        "select_across": "1",
        "status": "failed",
        "destination": "hook",
        "status_code": "503",
    }
    html = text_of(post(superuser_client, data))
    assert element_text(html, "action-count") == "5"
    assert "HTTP status 503" in html
    response = post(superuser_client, data, True)
    assert statuses(unavailable) == {"pending"} and statuses(bad_request) == {"failed"}
    assert any("5 requeued" in m for m in messages_of(response))

    hook.respond(200)
    settle_due(worker, unavailable)
    assert statuses(unavailable) == {"succeeded"}
    assert statuses(bad_request) == {"failed"}


def test_a_page_scans_a_bounded_number_and_says_so(superuser_client, repo, monkeypatch, worker):
    make(repo, 8, "failed")  # make() records last_status_code 500
    monkeypatch.setattr(queries, "SCAN_LIMIT", 5)
    html = text_of(superuser_client.get(u("message_list") + "?status=failed&status_code=500"))
    assert "only the first 5 of 8 messages were checked: 5 of them match" in html
    assert 'data-exact="false"' in html
    # an action on all matching checks every one (its size unknown: in the background)
    make(repo, 2, "cancelled")
    data = {"action": "delete", "select_across": "1", "status_code": "500", "status": "failed"}
    assert "at least" in text_of(post(superuser_client, data))
    response = post(superuser_client, data, True)
    assert "/action/" in response["Location"]
    worker()
    assert repo.count("failed") == 0 and repo.count("cancelled") == 2


def test_bulk_command_filters_by_status_code(repo, hook, worker):
    bad_request = deliver(hook, worker, 400, 2)
    unavailable = deliver(hook, worker, 503, 3)
    out = io.StringIO()
    call_command("outbox_requeue", "--status-code", "503", "--yes", stdout=out, stderr=io.StringIO())
    assert "3 message(s) match: status failed, status code 503." in out.getvalue()
    assert statuses(unavailable) == {"pending"} and statuses(bad_request) == {"failed"}


# -- 2. the full error text ----------------------------------------------------------------
def test_full_error_text_on_hover_and_in_an_expandable_row(superuser_client, repo):
    secret = "s3cr3t-token-value"
    m = outbox.send("mem", {"x": 1}, headers={"Authorization": secret})
    long_error = (
        "<script>alert(1)</script> HTTP 502 from api.example.com: " + "x" * 600 + f" token={secret} END"
    )
    change = Change(
        id=m.id,
        from_statuses=("pending",),
        to="failed",
        score=time.time(),
        set={"last_error": long_error, "last_error_class": "http", "last_status_code": "502"},
    )
    assert repo.transition([change], time.time())[0].applied
    html = text_of(superuser_client.get(u("message_list") + "?status=failed"))
    row = html.split(f'data-message-id="{m.id}"')[1].split("</tr>")[0]
    assert "<script>alert" not in row and "&lt;script&gt;alert(1)&lt;/script&gt;" in row
    assert secret not in html
    title = re.search(r'class="field-last-error" title="([^"]*)"', row).group(1)
    assert title.endswith(" END") and len(unescape(title)) > 600  # whole, not cut at 30 or 500
    details = re.search(
        r'<details class="outbox-error-details"><summary>(.*?)</summary><pre class="outbox-error">(.*?)</pre>',
        row,
        re.S,
    )
    assert details and len(unescape(details.group(1))) <= 120 and unescape(details.group(2)).endswith(" END")


# -- 3. retry now ----------------------------------------------------------------------------
def retrying_later(hook, worker, n: int) -> list:
    """``n`` messages retrying in an hour (one failed attempt each, retry count 1)."""
    hook.respond(503)
    sent = outbox.send_many([{"destination": "hook", "body": {"i": i}, "retry": [3600]} for i in range(n)])
    worker()
    assert statuses(sent) == {"retrying"}
    assert all(outbox.get(m.id).next_attempt_at > time.time() + 1500 for m in sent)  # equal jitter
    return sent


def test_retry_now_all_matching_keeps_the_budget_and_is_due_now(superuser_client, repo, hook, worker):
    waiting = retrying_later(hook, worker, 4)
    before = time.time()
    data = {"action": "retry_now", "select_across": "1", "status": "retrying", "destination": "hook"}
    html = text_of(post(superuser_client, data))
    assert element_text(html, "action-count") == "4"
    assert "retry count is kept" in html
    response = post(superuser_client, data, True)
    assert any("4 made due now" in m for m in messages_of(response))
    for m in waiting:
        got = outbox.get(m.id)
        assert got.status == "retrying" and got.retry_count == 1  # budget kept
        assert got.next_attempt_at <= time.time()
        assert got.next_attempt_at >= before - 11
    due = {
        i: score
        for key in repo.keys.every("due", "outbox")
        for i, score in repo.connection.zrange(key, 0, -1, withscores=True)
    }
    assert all(due[m.id.encode()] <= time.time() for m in waiting)

    hook.respond(200)
    settle_due(worker, waiting)
    assert statuses(waiting) == {"succeeded"}
    assert {outbox.get(m.id).retry_count for m in waiting} == {1}


def test_retry_now_selected_and_skips_others(superuser_client, repo, hook, worker):
    waiting = retrying_later(hook, worker, 3)
    failed = make(repo, 1, "failed")
    chosen = [waiting[0].id, failed[0].id]
    response = post(superuser_client, {"action": "retry_now", "_selected_action": chosen}, True)
    assert any("1 made due now, 1 skipped" in m for m in messages_of(response))
    assert outbox.get(waiting[0].id).next_attempt_at <= time.time()
    assert outbox.get(waiting[1].id).next_attempt_at > time.time() + 1500
    assert outbox.get(failed[0].id).status == "failed"


def test_retry_now_needs_the_requeue_permission(viewer_client, repo, hook, worker):
    waiting = retrying_later(hook, worker, 1)
    response = post(viewer_client, {"action": "retry_now", "_selected_action": [waiting[0].id]}, True)
    assert response.status_code == 403
    assert outbox.get(waiting[0].id).next_attempt_at > time.time() + 1500


def test_retry_now_command(repo, hook, worker):
    waiting = retrying_later(hook, worker, 3)
    out = io.StringIO()
    call_command("outbox_requeue", "--retry-now", "--yes", stdout=out, stderr=io.StringIO())
    assert "3 message(s) match: status retrying." in out.getvalue()
    assert "3 made due now." in out.getvalue()
    assert all(outbox.get(m.id).next_attempt_at <= time.time() for m in waiting)
    assert {outbox.get(m.id).retry_count for m in waiting} == {1}
    token = re.search(r"Batch ([A-Za-z0-9_-]+):", out.getvalue()).group(1)
    assert {i.decode() for i in repo.connection.zrange(repo.keys.batch(token), 0, -1)} == ids(waiting)


# -- 4. batches: exactly the messages acted on -----------------------------------------------
def test_the_report_links_to_exactly_the_messages_acted_on(superuser_client, repo):
    failed = make(repo, 6, "failed")
    pending = make(repo, 2, "pending")
    chosen = [m.id for m in failed[:4]] + [pending[0].id]  # the pending one is skipped
    response = post(superuser_client, {"action": "requeue", "_selected_action": chosen}, True)
    (link,) = batch_links(response)
    token = link.split("batch=")[1]
    ttl = repo.connection.ttl(repo.keys.batch(token))
    assert 23 * 3600 < ttl <= 24 * 3600
    html = text_of(superuser_client.get(link))
    assert listed_ids(html) == chosen[:4]  # in the order they were acted on
    assert element_text(html, "result-count") == "4 messages"
    assert f"of batch {token}" in html
    # the other filters narrow a batch
    make(repo, 1, "failed")
    html = text_of(superuser_client.get(link + "&status=failed"))
    assert listed_ids(html) == []
    html = text_of(superuser_client.get(link + "&status=pending"))
    assert set(listed_ids(html)) == set(chosen[:4])


def test_an_action_on_all_matching_a_batch(superuser_client, repo):
    failed = make(repo, 5, "failed")
    response = post(
        superuser_client, {"action": "requeue", "_selected_action": [m.id for m in failed[:3]]}, True
    )
    token = batch_links(response)[0].split("batch=")[1]
    other = make(repo, 2, "pending")
    data = {"action": "cancel", "select_across": "1", "batch": token}
    assert element_text(text_of(post(superuser_client, data)), "action-count") == "3"
    response = post(superuser_client, data, True)
    assert statuses(failed[:3]) == {"cancelled"} and statuses(other) == {"pending"}
    assert statuses(failed[3:]) == {"failed"}
    # and that one's batch is its own
    token2 = batch_links(response)[0].split("batch=")[1]
    assert token2 != token
    assert set(listed_ids(text_of(superuser_client.get(u("message_list") + "?batch=" + token2)))) == ids(
        failed[:3]
    )


def test_all_matching_actions_record_their_batch(superuser_client, repo):
    failed = make(repo, 30, "failed", destination="hook")
    make(repo, 3, "failed", destination="mem")
    data = {"action": "requeue", "select_across": "1", "status": "failed", "destination": "hook"}
    response = post(superuser_client, data, True)
    (link,) = batch_links(response)
    assert "Show the 30 messages requeued" in str(list(response.wsgi_request._messages)[0])
    html = text_of(superuser_client.get(link))
    assert element_text(html, "result-count") == "30 messages"
    assert set(listed_ids(html)) == ids(failed)


def test_unknown_or_bad_batch(superuser_client, repo):
    make(repo, 2, "failed")
    html = text_of(superuser_client.get(u("message_list") + "?batch=abcdefghijkl"))
    assert listed_ids(html) == [] and "holds no messages: it expired" in html
    response = superuser_client.get(u("message_list") + "?batch=../../x")
    assert response.status_code == 400 and "is not a batch token" in text_of(response)


def test_a_delete_keeps_no_batch(superuser_client, repo):
    failed = make(repo, 2, "failed")
    response = post(superuser_client, {"action": "delete", "_selected_action": [m.id for m in failed]}, True)
    assert batch_links(response) == []
    assert any("2 deleted" in m for m in messages_of(response))


def test_background_action_links_its_batch(superuser_client, repo, monkeypatch, worker):
    from django.contrib import admin

    from outbox.models import Message as MessageModel

    failed = make(repo, 12, "failed")
    monkeypatch.setattr(admin.site._registry[MessageModel], "sync_action_limit", 5)
    response = post(superuser_client, {"action": "requeue", "select_across": "1", "status": "failed"}, True)
    status_url = response["Location"]
    worker()
    html = text_of(superuser_client.get(status_url))
    link = unescape(re.search(r'href="([^"]+)" id="task-batch"', html).group(1))
    assert set(listed_ids(text_of(superuser_client.get(link)))) == ids(failed)


# -- 6. the host each attempt went to ---------------------------------------------------------
def test_detail_names_the_host_of_each_attempt(superuser_client, hook, worker):
    host = hook.url.split("/")[2]  # 127.0.0.1:<port>
    (m,) = deliver(hook, worker, 503, 1)
    attempts = outbox.attempts(m.id)
    assert len(attempts) == 4 and {a.host for a in attempts} == {host}
    assert outbox.get(m.id).last_error.endswith(f"(host {host})")
    html = text_of(superuser_client.get(u("message_detail", m.id)))
    assert html.count(f'<td class="attempt-host">{host}</td>') == 4
    assert f"HTTP 503 Service Unavailable: nope (host {host})" in html
    assert '<td id="message-error-class">http</td>' in html
    assert f'href="{u("destination", "hook")}" id="destination-page-link"' in html


def test_a_connection_error_names_the_host(superuser_client, worker):
    with hook_settings("http://127.0.0.1:9/hook"):
        m = outbox.send("hook", {"x": 1}, max_retries=0)
        worker()
    got = outbox.get(m.id)
    assert got.status == "failed" and got.last_error_class == "ConnectError"
    assert got.last_error.startswith("ConnectError: ") and got.last_error.endswith("(host 127.0.0.1:9)")
    assert outbox.attempts(m.id)[0].host == "127.0.0.1:9"


def test_url_host_hides_credentials():
    from outbox.transports.webhook import url_host

    assert url_host("https://user:pw@api.example.com/x") == "api.example.com"
    assert url_host("http://api.example.com:8080/x") == "api.example.com:8080"
    assert url_host("http://[::1]:8000/") == "[::1]:8000"


def test_the_confirm_summary_has_no_stray_space_before_its_full_stop(superuser_client, repo):
    """Issue 30, item 9: "12 can be requeued ." when every selected message can be."""
    failed = make(repo, 2, "failed")
    html = text_of(post(superuser_client, {"action": "requeue", "_selected_action": [m.id for m in failed]}))
    summary = " ".join(re.sub(r"<[^>]+>", " ", html.split('class="outbox-confirm-summary"', 1)[1]).split())
    assert "can be requeued." in summary, summary[:200]
    assert " ." not in summary.split("requeued", 1)[1][:3]


def test_the_failed_list_says_where_the_parked_messages_are(superuser_client, repo, hook, worker):
    """Issue 30, item 7: with the default breaker a failing destination's messages park
    rather than fail; the Failed list said "0" and nothing else."""
    from outbox.destinations import controls

    controls.pause("hook")
    sent = [outbox.send("hook", {"n": n}) for n in range(3)]
    worker(simple=True)
    assert {outbox.get(m.id).status for m in sent} == {"pending"}
    html = text_of(superuser_client.get(u("message_list") + "?status=failed"))
    assert "3 more messages are not failed but parked (hook: 3)" in unescape(html)
    mine = text_of(superuser_client.get(u("message_list") + "?status=failed&destination=mem"))
    assert "not failed but parked" not in mine  # another destination's parked are not its own
