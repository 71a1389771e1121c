"""Bulk actions through the console: confirmation, execution, permissions, history."""

from __future__ import annotations

import time

import pytest
from django.contrib import admin
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.test import Client

import outbox
from outbox.models import Message as MessageModel
from tests.support.console import element_text, make, messages_of, post, staff, text_of, u

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


def statuses(ids) -> list[str]:
    return [outbox.get(i).status for i in ids]


# -- selected messages ---------------------------------------------------------------
def test_requeue_selected_confirms_then_acts(superuser_client, repo, superuser):
    failed = make(repo, 3, "failed")
    chosen = [failed[0].id, failed[1].id]
    response = post(superuser_client, {"action": "requeue", "_selected_action": chosen})
    assert response.status_code == 200
    html = text_of(response)
    assert element_text(html, "action-count") == "2"
    assert "retry count is reset to 0" in html and "attempt history is kept" in html
    assert 'id="confirm-action"' in html and 'id="cancel-action"' in html
    assert statuses(chosen) == ["failed", "failed"]  # the confirmation changes nothing

    response = post(
        superuser_client, {"action": "requeue", "_selected_action": chosen, "next": u("message_list")}, True
    )
    assert response.status_code == 302 and response["Location"] == u("message_list")
    assert statuses(chosen) == ["pending", "pending"]
    assert outbox.get(failed[2].id).status == "failed"
    assert all(outbox.get(i).retry_count == 0 for i in chosen)
    assert "Requeue 2 selected messages: 2 requeued." in messages_of(response)
    entry = LogEntry.objects.get()
    assert entry.user == superuser
    assert entry.action_flag == CHANGE
    assert entry.content_type.model_class() is MessageModel
    assert entry.get_change_message() == "Requeue 2 selected messages: 2 requeued."


def test_skipped_when_changed_meanwhile(superuser_client, repo):
    failed = make(repo, 3, "failed")
    ids = [m.id for m in failed]
    assert (
        element_text(
            text_of(post(superuser_client, {"action": "requeue", "_selected_action": ids})), "action-count"
        )
        == "3"
    )
    outbox.requeue(ids[0])  # someone else got there first
    response = post(superuser_client, {"action": "requeue", "_selected_action": ids}, True)
    assert "Requeue 3 selected messages: 2 requeued, 1 skipped (in another status or changed meanwhile)." in (
        messages_of(response)
    )


def test_confirmation_counts_only_eligible_selected(superuser_client, repo):
    failed = make(repo, 2, "failed")
    pending = make(repo, 1)
    ids = [failed[0].id, failed[1].id, pending[0].id]
    html = text_of(post(superuser_client, {"action": "requeue", "_selected_action": ids}))
    assert element_text(html, "action-count") == "2"
    assert "the others are not failed, cancelled, succeeded and will be skipped" in html


def test_cancel_and_delete_single_from_the_detail_page(superuser_client, repo):
    m = make(repo, 1)[0]
    detail = u("message_detail", m.id)
    html = text_of(superuser_client.get(detail))
    assert 'id="detail-cancel"' in html
    response = post(superuser_client, {"action": "cancel", "_selected_action": m.id, "next": detail}, True)
    assert response["Location"] == detail
    assert outbox.get(m.id).status == "cancelled"
    assert LogEntry.objects.get().object_id == m.id
    index = text_of(superuser_client.get("/admin/"))  # "Recent actions" links the message
    link = LogEntry.objects.get().get_admin_url()
    assert f'href="{link}"' in index
    assert superuser_client.get(link)["Location"] == detail

    response = post(
        superuser_client, {"action": "delete", "_selected_action": m.id, "next": u("message_list")}, True
    )
    assert superuser_client.get(detail).status_code == 404
    entry = LogEntry.objects.latest("id")
    assert entry.action_flag == DELETION
    assert entry.get_change_message() == f"Delete message {m.id}: 1 deleted."
    assert repo.count() == 0


def test_nothing_selected_or_no_action(superuser_client, repo):
    make(repo, 2, "failed")
    response = post(superuser_client, {"action": "requeue", "next": u("message_list")})
    assert response.status_code == 302
    assert "Items must be selected" in messages_of(response)[0]
    response = post(superuser_client, {"action": "", "_selected_action": "x"})
    assert response.status_code == 302 and "No action selected." in messages_of(response)
    assert repo.counts()["failed"] == 2


def test_next_must_be_local(superuser_client, repo):
    m = make(repo, 1, "failed")[0]
    response = post(
        superuser_client,
        {"action": "requeue", "_selected_action": m.id, "next": "https://evil.example/"},
        True,
    )
    assert response["Location"] == u("message_list")


# -- all matching --------------------------------------------------------------------
def test_requeue_all_matching_a_filter(superuser_client, repo):
    hook_failed = make(repo, 60, "failed", destination="hook")
    mem_failed = make(repo, 10, "failed", destination="mem")
    make(repo, 5, "pending", destination="hook")
    data = {"action": "requeue", "select_across": "1", "status": "failed", "destination": "hook"}
    html = text_of(post(superuser_client, data))
    assert element_text(html, "action-count") == "60"
    assert 'value="Yes, requeue 60 messages"' in html
    assert "all messages matching status failed, destination hook" in html
    response = post(superuser_client, data, True)
    assert response.status_code == 302
    assert set(statuses(m.id for m in hook_failed)) == {"pending"}
    assert set(statuses(m.id for m in mem_failed)) == {"failed"}
    assert "Requeue all messages matching status failed, destination hook: 60 requeued." in messages_of(
        response
    )


def test_all_matching_without_status_acts_on_eligible_statuses(superuser_client, repo):
    pending = make(repo, 3, "pending", destination="hook")
    retrying = make(repo, 2, "retrying", destination="hook")
    failed = make(repo, 2, "failed", destination="hook")
    other = make(repo, 2, "pending", destination="mem")
    data = {"action": "cancel", "select_across": "1", "destination": "hook"}
    assert element_text(text_of(post(superuser_client, data)), "action-count") == "5"
    post(superuser_client, data, True)
    assert set(statuses(m.id for m in pending + retrying)) == {"cancelled"}
    assert set(statuses(m.id for m in failed)) == {"failed"}
    assert set(statuses(m.id for m in other)) == {"pending"}


def test_all_matching_leaves_messages_that_match_after_confirmation(superuser_client, repo):
    first = make(repo, 3, "failed")
    html = text_of(post(superuser_client, {"action": "requeue", "select_across": "1", "status": "failed"}))
    as_of = html.split('name="as_of" value="')[1].split('"')[0]
    time.sleep(0.01)
    later = make(repo, 2, "failed")
    post(
        superuser_client,
        {"action": "requeue", "select_across": "1", "status": "failed", "as_of": as_of},
        True,
    )
    assert set(statuses(m.id for m in first)) == {"pending"}
    assert set(statuses(m.id for m in later)) == {"failed"}


def test_all_matching_with_a_queue_filter(superuser_client, repo):
    high = make(repo, 3, "failed", priority="high")
    default = make(repo, 4, "failed")
    post(
        superuser_client,
        {"action": "delete", "select_across": "1", "status": "failed", "queue": "outbox_high"},
        True,
    )
    assert repo.count("failed") == 4
    assert all(repo.get_many([m.id])[0] is None for m in high)
    assert set(statuses(m.id for m in default)) == {"failed"}


def test_invalid_filter_acts_on_nothing(superuser_client, repo):
    make(repo, 3, "failed")
    data = {"action": "delete", "select_across": "1", "status": "failed", "created_from": "soonish"}
    response = post(superuser_client, data, True)
    assert response.status_code == 400
    assert "The filter is not valid, so nothing was changed" in response.content.decode()
    assert repo.count("failed") == 3


def test_select_all_with_a_search_acts_on_the_found_message(superuser_client, repo):
    make(repo, 3, "failed")
    keyed = outbox.send("mem", "x", idempotency_key="abc")
    repo.transition([_to_failed(keyed.id)], time.time())
    post(superuser_client, {"action": "requeue", "select_across": "1", "q": "abc"}, True)
    assert outbox.get(keyed.id).status == "pending"
    assert repo.count("failed") == 3


def _to_failed(message_id):
    from outbox.store import Change

    return Change(id=message_id, from_statuses=("pending",), to="failed", score=time.time())


def test_large_selection_runs_in_the_background(superuser_client, repo, monkeypatch, worker, superuser):
    model_admin = admin.site._registry[MessageModel]
    monkeypatch.setattr(model_admin, "sync_action_limit", 5)
    failed = make(repo, 12, "failed")
    data = {"action": "requeue", "select_across": "1", "status": "failed"}
    assert "runs in the background" in text_of(post(superuser_client, data))
    response = post(superuser_client, data, True)
    assert response.status_code == 302
    status_url = response["Location"]
    assert status_url.startswith(u("message_list").replace("messages/", "action/"))
    html = text_of(superuser_client.get(status_url))
    assert element_text(html, "task-state") == "queued"
    assert '<meta http-equiv="refresh" content="2">' in html
    assert repo.count("failed") == 12  # nothing happened in the request

    worker(simple=True)  # runs the action job (high queue first), then the deliveries

    html = text_of(superuser_client.get(status_url))
    assert element_text(html, "task-state") == "finished"
    assert element_text(html, "task-acted") == "12"
    assert element_text(html, "task-skipped") == "0"
    assert "12 requeued" in element_text(html, "task-report")
    assert 'http-equiv="refresh"' not in html
    assert set(statuses(m.id for m in failed)) == {"succeeded"}
    entries = [e.get_change_message() for e in LogEntry.objects.order_by("id")]
    assert len(entries) == 2
    assert "started in the background (12 messages; job" in entries[0]
    assert entries[1] == "Requeue all messages matching status failed: 12 requeued."
    assert all(e.user == superuser for e in LogEntry.objects.all())


def test_background_status_of_unknown_job_is_404(superuser_client, repo):
    assert superuser_client.get(u("message_action_status", "nope")).status_code == 404


# -- permissions and CSRF ------------------------------------------------------------
@pytest.mark.parametrize("action", ["requeue", "cancel", "delete"])
def test_viewer_cannot_act_even_by_posting(viewer_client, repo, action):
    failed = make(repo, 2, "failed")
    pending = make(repo, 2)
    ids = [m.id for m in failed + pending]
    before = repo.counts()
    for confirm in (False, True):
        assert post(viewer_client, {"action": action, "_selected_action": ids}, confirm).status_code == 403
        assert post(viewer_client, {"action": action, "select_across": "1"}, confirm).status_code == 403
    assert repo.counts() == before
    assert not LogEntry.objects.exists()


def test_each_action_needs_its_own_permission(client, django_user_model, repo):
    failed = make(repo, 2, "failed")
    client.force_login(staff(django_user_model, "requeuer", "view_message", "requeue_message"))
    html = text_of(client.get(u("message_list") + "?status=failed"))
    assert '<option value="requeue">' in html
    assert '<option value="delete">' not in html and '<option value="cancel">' not in html
    detail = text_of(client.get(u("message_detail", failed[0].id)))
    assert 'id="detail-requeue"' in detail and 'id="detail-delete"' not in detail
    assert post(client, {"action": "delete", "_selected_action": failed[0].id}, True).status_code == 403
    assert post(client, {"action": "requeue", "_selected_action": failed[0].id}, True).status_code == 302
    assert statuses([failed[0].id, failed[1].id]) == ["pending", "failed"]


def test_action_needs_view_permission_too(client, django_user_model, repo):
    m = make(repo, 1, "failed")[0]
    client.force_login(staff(django_user_model, "blind", "requeue_message"))
    assert post(client, {"action": "requeue", "_selected_action": m.id}, True).status_code == 403
    assert outbox.get(m.id).status == "failed"


def test_anonymous_post_is_refused(client, repo):
    m = make(repo, 1, "failed")[0]
    response = post(client, {"action": "requeue", "_selected_action": m.id}, True)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert outbox.get(m.id).status == "failed"


def test_posts_need_a_csrf_token(superuser, repo):
    m = make(repo, 1, "failed")[0]
    client = Client(enforce_csrf_checks=True)
    client.force_login(superuser)
    assert post(client, {"action": "requeue", "_selected_action": m.id}, True).status_code == 403
    assert outbox.get(m.id).status == "failed"
    # With the token from the confirmation page it goes through.
    html = text_of(client.get(u("message_detail", m.id)))
    token = html.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
    data = {"action": "requeue", "_selected_action": m.id, "csrfmiddlewaretoken": token}
    assert post(client, data, True).status_code == 302
    assert outbox.get(m.id).status == "pending"


# -- the whole story -----------------------------------------------------------------
def test_failed_messages_requeued_from_the_console_are_delivered(superuser_client, repo, hook, worker):
    hook.respond(500)
    sent = outbox.send_many([{"destination": "hook", "body": {"order": i}} for i in range(5)])
    worker()
    assert set(statuses(m.id for m in sent)) == {"failed"}
    assert all(outbox.get(m.id).retry_count == 3 for m in sent)
    attempts_before = len(outbox.attempts(sent[0].id))

    html = text_of(superuser_client.get(u("message_list") + "?status=failed&destination=hook"))
    assert 'data-total="5"' in html
    data = {"action": "requeue", "select_across": "1", "status": "failed", "destination": "hook"}
    assert element_text(text_of(post(superuser_client, data)), "action-count") == "5"
    post(superuser_client, data, True)
    assert all(outbox.get(m.id).retry_count == 0 for m in sent)

    hook.respond(200)
    worker()
    assert set(statuses(m.id for m in sent)) == {"succeeded"}
    assert len(outbox.attempts(sent[0].id)) == attempts_before + 1  # history kept
    html = text_of(superuser_client.get(u("dashboard")))
    assert element_text(html, "count-succeeded") == "5"
    assert element_text(html, "count-failed") == "0"
