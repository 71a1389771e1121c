"""Destination health in the console (issue 8): the dashboard's failing flag, last success
and failing since from recent attempts, the attempts chart by outcome (one destination or
all), the destination page (settings, state, error groups linked to their messages),
pause/resume/disable/enable (``outbox.manage_destination``) and Recover since. Real Redis,
real workers, a real HTTP receiver."""

from __future__ import annotations

import re
import time
from html import unescape

import pytest
from django.contrib.admin.models import LogEntry

import outbox
from outbox.destinations import health
from tests.support import settle_due
from tests.support.console import (
    batch_links,
    deliver,
    element_text,
    ids,
    listed_ids,
    make,
    messages_of,
    staff,
    text_of,
    u,
)

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


def row_of(html: str, name: str) -> str:
    return html.split(f'data-destination="{name}"')[1].split("</tr>")[0]


def manager_client(client, django_user_model):
    client.force_login(staff(django_user_model, "ops", "view_message", "manage_destination"))
    return client


# -- dashboard ---------------------------------------------------------------------------
def test_dashboard_failing_comes_from_recent_attempts_and_clears_on_recovery(superuser_client, hook, worker):
    sent = deliver(hook, worker, 503, 2, max_retries=1)  # 4 failed attempts in a row
    h = health.get_health("hook")
    assert {outbox.get(m.id).status for m in sent} == {"failed"}, [outbox.attempts(m.id) for m in sent]
    assert h.consecutive_failures == 4, h
    html = text_of(superuser_client.get(u("dashboard")))
    assert 'class="destination-row failing" data-destination="hook" data-state="failing"' in html
    row = row_of(html, "hook")
    assert '<td class="last-success">–</td>' in row
    assert "<time" in row.split('class="failing-since"')[1]

    deliver(hook, worker, 200, 1)  # it recovered: the two dead letters stay, the flag goes
    html = text_of(superuser_client.get(u("dashboard")))
    assert 'class="destination-row" data-destination="hook" data-state="healthy"' in html
    row = row_of(html, "hook")
    assert "<time" in row.split('class="last-success"')[1].split("</td>")[0]
    assert '<td class="failing-since">–</td>' in row
    assert 'data-status="failed" data-count="2"' in row
    # the row links to the destination page
    assert f'href="{u("destination", "hook")}" class="destination-page-link"' in row


def test_dashboard_chart_can_be_narrowed_to_one_destination(superuser_client, hook, worker):
    deliver(hook, worker, 503, 1, retry=[3600])  # one retryable attempt to hook
    outbox.send_many([{"destination": "mem", "body": {"i": i}} for i in range(3)])
    worker()
    html = text_of(superuser_client.get(u("dashboard")))
    assert element_text(html, "chart-total-succeeded") == "3"
    assert element_text(html, "chart-total-retryable") == "1"
    html = text_of(superuser_client.get(u("dashboard") + "?chart=hook"))
    assert element_text(html, "chart-total-succeeded") == "0"
    assert element_text(html, "chart-total-retryable") == "1"
    assert "Showing hook only" in html
    html = text_of(superuser_client.get(u("dashboard") + "?chart=mem"))
    assert element_text(html, "chart-total-succeeded") == "3"
    assert element_text(html, "chart-total-retryable") == "0"
    html = text_of(superuser_client.get(u("dashboard") + "?chart=nope"))  # unknown: all of them
    assert element_text(html, "chart-total-succeeded") == "3"


# -- the destination page ----------------------------------------------------------------
def test_destination_page_shows_settings_state_and_error_groups(superuser_client, hook, worker):
    unavailable = deliver(hook, worker, 503, 2, max_retries=1)  # 4 attempts: 503 http
    bad_request = deliver(hook, worker, 400, 3)  # 3 attempts: 400 http, permanent
    host = hook.url.split("/")[2]
    html = text_of(superuser_client.get(u("destination", "hook")))
    assert element_text(html, "destination-host") == host
    assert "webhook" in html.split('id="destination-transport"')[1].split("</td>")[0]
    assert 'data-state="failing"' in html  # 7 failures in a row
    assert element_text(html, "parked-count") == "0"
    assert "0.0%" in html.split('id="success-rate"')[1][:60]
    groups = re.findall(
        r'class="error-group" data-status-code="(\d*)" data-error-class="([^"]*)" data-count="(\d+)"', html
    )
    assert groups == [("503", "http", "4"), ("400", "http", "3")]
    assert f"(host {host})" in html  # the latest error names the host
    links = [unescape(h) for h in re.findall(r'class="error-group-link" href="([^"]+)"', html)]
    assert set(listed_ids(text_of(superuser_client.get(links[0])))) == ids(unavailable)
    assert set(listed_ids(text_of(superuser_client.get(links[1])))) == ids(bad_request)


def test_unknown_destination_is_404(superuser_client, repo):
    assert superuser_client.get(u("destination", "nope")).status_code == 404


def test_read_only_users_see_no_buttons_and_cannot_pause(viewer_client, repo):
    html = text_of(viewer_client.get(u("destination", "hook")))
    assert 'id="state-action-pause"' not in html and 'id="recover-form"' not in html
    data = {"action": "pause", "post": "yes"}
    assert viewer_client.post(u("destination_action", "hook"), data).status_code == 403
    assert health.get_health("hook").admin == "active"


def test_pause_needs_confirmation_then_parks_and_resume_puts_back(client, django_user_model, worker):
    ops = manager_client(client, django_user_model)
    html = text_of(ops.get(u("destination", "mem")))
    assert 'id="state-action-pause"' in html and 'id="state-action-resume"' not in html
    response = ops.post(u("destination_action", "mem"), {"action": "pause"})
    assert response.status_code == 200 and 'id="confirm-action"' in text_of(response)
    assert health.get_health("mem").admin == "active"  # the confirmation changes nothing

    response = ops.post(
        u("destination_action", "mem"), {"action": "pause", "reason": "maintenance", "post": "yes"}
    )
    assert response.status_code == 302 and response["Location"] == u("destination", "mem")
    assert health.get_health("mem").admin == "paused"
    html = text_of(ops.get(u("destination", "mem")))
    assert 'data-state="paused"' in html and "maintenance" in html
    assert 'id="state-action-resume"' in html
    assert LogEntry.objects.get().get_change_message() == "Destination mem paused (maintenance)."

    sent = outbox.send_many([{"destination": "mem", "body": {"i": i}} for i in range(3)])
    worker()
    assert {outbox.get(m.id).status for m in sent} != {"succeeded"}
    assert element_text(text_of(ops.get(u("destination", "mem"))), "parked-count") == "3"

    response = ops.post(u("destination_action", "mem"), {"action": "resume", "post": "yes"})
    assert "3 parked messages put back" in messages_of(ops.get(response["Location"]))[0]
    settle_due(worker, sent)
    assert {outbox.get(m.id).status for m in sent} == {"succeeded"}


def test_disable_and_enable(client, django_user_model):
    ops = manager_client(client, django_user_model)
    ops.post(u("destination_action", "hook"), {"action": "disable", "reason": "gone", "post": "yes"})
    h = health.get_health("hook")
    assert (h.admin, h.state) == ("disabled", "disabled")
    html = text_of(ops.get(u("destination", "hook")))
    assert 'id="state-action-enable"' in html and 'id="state-action-pause"' not in html
    ops.post(u("destination_action", "hook"), {"action": "enable", "post": "yes"})
    assert health.get_health("hook").admin == "active"


def test_bad_destination_action_and_get_refused(client, django_user_model):
    ops = manager_client(client, django_user_model)
    assert ops.post(u("destination_action", "hook"), {"action": "explode"}).status_code == 400
    assert ops.get(u("destination_action", "hook")).status_code == 405
    assert ops.post(u("destination_action", "nope"), {"action": "pause"}).status_code == 404


# -- recover since -------------------------------------------------------------------------
def test_recover_since_requeues_only_the_dead_letters_failed_since(superuser_client, repo, hook, worker):
    older = make(repo, 3, "failed", destination="hook")
    time.sleep(0.05)
    since = time.time()
    time.sleep(0.05)
    newer = make(repo, 4, "failed", destination="hook")
    other = make(repo, 2, "failed", destination="mem")
    data = {"since": repr(since)}
    html = text_of(superuser_client.post(u("destination_recover", "hook"), data))
    assert element_text(html, "recover-count") == "4"
    as_of = html.split('name="as_of" value="')[1].split('"')[0]
    response = superuser_client.post(
        u("destination_recover", "hook"), {**data, "as_of": as_of, "post": "yes"}
    )
    assert response.status_code == 302
    assert {outbox.get(m.id).status for m in newer} == {"pending"}
    assert {outbox.get(m.id).status for m in older + other} == {"failed"}
    (link,) = batch_links(response)
    assert set(listed_ids(text_of(superuser_client.get(link)))) == ids(newer)
    hook.respond(200)
    settle_due(worker, newer)
    assert {outbox.get(m.id).status for m in newer} == {"succeeded"}


def test_recover_since_defaults_to_failing_since(superuser_client, repo, hook, worker):
    older = make(repo, 2, "failed", destination="hook")  # dead letters from before the outage
    time.sleep(0.05)
    outage = deliver(hook, worker, 503, 2, max_retries=1)
    assert health.get_health("hook").failing_since is not None
    html = text_of(superuser_client.get(u("destination", "hook")))
    assert 'id="recover-form"' in html and "when it started failing" in html
    html = text_of(superuser_client.post(u("destination_recover", "hook"), {}))
    assert element_text(html, "recover-count") == "2"
    response = superuser_client.post(u("destination_recover", "hook"), {"post": "yes"})
    assert {outbox.get(m.id).status for m in outage} == {"pending"}
    assert {outbox.get(m.id).status for m in older} == {"failed"}
    assert any("2 requeued" in m for m in messages_of(response))


def test_recover_since_after_recovery_defaults_to_when_the_last_outage_started(
    superuser_client, repo, hook, worker
):
    """Once the destination delivers again (failing since cleared), the default still
    reaches back to the start of the outage, not to its last failure (which would find
    no dead letter of it)."""
    older = make(repo, 2, "failed", destination="hook")
    time.sleep(0.05)
    outage = deliver(hook, worker, 503, 3, max_retries=0)
    time.sleep(0.05)
    deliver(hook, worker, 200, 1)
    h = health.get_health("hook")
    assert h.failing_since is None and h.last_failing_since is not None
    assert "when its last outage started" in text_of(superuser_client.get(u("destination", "hook")))
    html = text_of(superuser_client.post(u("destination_recover", "hook"), {}))
    assert element_text(html, "recover-count") == "3"
    superuser_client.post(u("destination_recover", "hook"), {"post": "yes"})
    assert {outbox.get(m.id).status for m in outage} == {"pending"}
    assert {outbox.get(m.id).status for m in older} == {"failed"}


def test_recover_needs_the_requeue_permission(client, django_user_model, repo):
    make(repo, 1, "failed", destination="hook")
    ops = manager_client(client, django_user_model)
    assert 'id="recover-form"' not in text_of(ops.get(u("destination", "hook")))
    assert ops.post(u("destination_recover", "hook"), {"post": "yes", "since": "0"}).status_code == 403
    assert repo.count("failed") == 1


def test_recover_since_a_bad_time_changes_nothing(superuser_client, repo):
    make(repo, 1, "failed", destination="hook")
    response = superuser_client.post(u("destination_recover", "hook"), {"since": "soonish", "post": "yes"})
    assert response.status_code == 400
    assert repo.count("failed") == 1


def test_a_destination_no_longer_configured_has_a_page_without_actions(superuser_client, repo, settings):
    make(repo, 2, "failed", destination="mem")
    settings.OUTBOX = {**settings.OUTBOX, "DESTINATIONS": {"hook": settings.OUTBOX["DESTINATIONS"]["hook"]}}
    html = text_of(superuser_client.get(u("destination", "mem")))
    assert "any more: its messages cannot be delivered" in html
    assert 'id="state-actions"' not in html and 'id="recover-form"' not in html
    assert 'data-status="failed" data-count="2"' in html
