"""Ordered delivery in the console (issue 23): a message's ordering key, sequence, the
sequence delivered before it and the head it waits behind; the list of one key's
messages; a destination's blocked keys with "requeue head" and "cancel head"; the
``waiting`` status wherever statuses are listed. Real Redis, real workers (a locmem
destination that fails on purpose), the Django test client."""

from __future__ import annotations

import re
import time
from datetime import datetime
from html import unescape
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.staticfiles import finders
from django.test import Client

import outbox
from outbox.admin import MessageAdmin
from outbox.records import STATUSES
from tests.support.console import (
    BLOCKING_ERROR,
    blocked_key,
    element_text,
    listed_ids,
    messages_of,
    staff,
    text_of,
    u,
)

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


def key_list(destination: str, key: str, **more: str) -> str:
    """The URL of the list of one ordering key's messages."""
    return u("message_list") + "?" + urlencode({"destination": destination, "ordering_key": key, **more})


def rows_of(html: str) -> list[dict[str, str]]:
    """The blocked-keys table's rows: their data attributes."""
    return [
        {"key": unescape(k), "head": h, "waiting": w}
        for k, h, w in re.findall(
            r'<tr class="blocked-key" data-key="([^"]*)" data-head="([^"]*)" data-waiting="(\d+)"', html
        )
    ]


def row(html: str, key: str) -> str:
    """The HTML of one row of the blocked-keys table."""
    marker = f'data-key="{key}"'
    assert marker in html, f"no row for {key!r}"
    return html.split(marker)[1].split("</tr>")[0]


def release(client, destination: str, key: str, how: str, confirm: bool = False):
    data = {"key": key, "how": how, **({"post": "yes"} if confirm else {})}
    return client.post(u("release_key", destination), data)


# -- the message detail page ----------------------------------------------------------------
def test_detail_shows_the_key_its_sequence_and_the_head_a_waiting_message_waits_behind(
    superuser_client, worker
):
    head, _, last = blocked_key(worker, "order-42", behind=2)
    html = text_of(superuser_client.get(u("message_detail", last.id)))
    assert element_text(html, "message-order-seq") == "3"
    assert element_text(html, "message-order-prev") == "known when it becomes the head"
    link = re.search(r'id="ordering-key-link" href="([^"]+)"[^>]*>([^<]*)<', html)
    assert link and unescape(link.group(1)) == key_list("mem", "order-42") and link.group(2) == "order-42"
    head_link = re.search(r'id="key-head-link" href="([^"]+)">([^<]*)<', html)
    assert head_link and head_link.group(1) == u("message_detail", head.id) and head_link.group(2) == head.id
    waits = html.split('id="message-key-head"')[1].split("</td>")[0]
    assert "a dead letter: it blocks the key" in waits
    assert f'href="{u("blocked_keys", "mem")}"' in waits

    # the dead letter at the head says it blocks its key, and how many wait behind it
    html = text_of(superuser_client.get(u("message_detail", head.id)))
    assert element_text(html, "message-order-seq") == "1"
    assert element_text(html, "message-order-prev") == "none delivered before it"
    blocks = html.split('id="message-key-head"')[1].split("</td>")[0]
    assert "This dead letter blocks its key: 2 messages wait behind it" in blocks


def test_detail_shows_the_sequence_delivered_before_and_nothing_for_a_message_without_a_key(
    superuser_client, worker
):
    first, second = (outbox.send("mem", {"n": n}, ordering_key="k") for n in range(2))
    worker(simple=True)
    assert outbox.get(second.id).status == "succeeded"
    html = text_of(superuser_client.get(u("message_detail", second.id)))
    assert element_text(html, "message-order-seq") == "2"
    assert element_text(html, "message-order-prev") == "1"
    assert 'id="message-key-head"' not in html  # delivered: it waits behind nothing
    plain = outbox.send("mem", {"plain": True})
    html = text_of(superuser_client.get(u("message_detail", plain.id)))
    assert "message-order-seq" not in html and "ordering-key-link" not in html


# -- the list of one key ----------------------------------------------------------------------
def test_the_key_filter_lists_every_message_of_the_key_newest_first_in_pages(
    superuser_client, worker, monkeypatch
):
    a = [outbox.send("mem", {"n": n}, ordering_key="A") for n in range(3)]
    worker(simple=True)  # settled ones are listed too
    a.append(outbox.send("mem", {"n": 3}, ordering_key="A"))
    outbox.send("mem", {"n": 0}, ordering_key="B")
    outbox.send("mem", {"plain": True})
    response = superuser_client.get(key_list("mem", "A"))
    assert response.status_code == 200
    html = text_of(response)
    assert listed_ids(html) == [m.id for m in reversed(a)]
    assert 'data-total="4"' in html
    assert "Messages of ordering key A to mem" in html
    assert re.search(r'<a class="status-filter" id="status-filter-all"[^>]*href="([^"]+)"', html)
    # a filter link in the sidebar leaves the key's list
    status_link = re.search(r'id="status-filter-failed" data-status="failed" href="([^"]+)"', html)
    assert status_link and "ordering_key" not in unescape(status_link.group(1))

    monkeypatch.setattr(MessageAdmin, "list_per_page", 3)  # pages by number, also with partitions
    html = text_of(superuser_client.get(key_list("mem", "A")))
    assert listed_ids(html) == [m.id for m in reversed(a)][:3]
    page_two = re.search(r'<a href="([^"]+)" class="end">2</a>', html)
    assert page_two, "no link to page 2"
    html = text_of(superuser_client.get(u("message_list") + unescape(page_two.group(1))))
    assert listed_ids(html) == [a[0].id]


def test_the_key_list_says_the_head_and_whether_the_key_is_blocked(superuser_client, worker):
    head, *_ = blocked_key(worker, "k1", behind=1)
    html = text_of(superuser_client.get(key_list("mem", "k1")))
    state = html.split('id="ordering-key-state"')[1].split("</p>")[0]
    assert head.id in state and "blocks the key" in state
    assert f'href="{u("blocked_keys", "mem")}"' in state


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"ordering_key": "A"}, "The ordering key filter needs a destination"),
        ({"destination": "mem", "ordering_key": "bad\x00key"}, "is not an ordering key"),
        ({"destination": "mem", "ordering_key": "line\nbreak"}, "is not an ordering key"),
        ({"destination": "mem", "ordering_key": "x" * 201}, "is not an ordering key"),
        ({"destination": "mem", "ordering_key": "<script>" * 2000}, "is not an ordering key"),
    ],
)
def test_a_bad_ordering_key_is_a_clear_400_showing_the_rest(superuser_client, worker, params, error):
    a = outbox.send("mem", {"n": 0}, ordering_key="A")
    response = superuser_client.get(u("message_list") + "?" + urlencode(params))
    assert response.status_code == 400
    html = text_of(response)
    assert error in unescape(html)
    assert "<script><script>" not in html  # escaped, and cut
    assert a.id in listed_ids(html)  # the filter was ignored: the rest still shows


def test_the_key_list_applies_no_other_filter_and_says_so(superuser_client, worker):
    a = [outbox.send("mem", {"n": n}, ordering_key="A") for n in range(2)]
    response = superuser_client.get(key_list("mem", "A", status="pending", error_class="timeout"))
    assert response.status_code == 400
    html = unescape(text_of(response))
    assert "The list of one ordering key shows every message of the key" in html
    assert "status, error class" in html
    assert listed_ids(html) == [a[1].id, a[0].id]  # the waiting one too: status is not applied


def test_keys_with_spaces_or_of_an_unknown_destination_are_fine(superuser_client, worker):
    spaced = outbox.send("mem", {"n": 0}, ordering_key=" ordre 42 é ")
    response = superuser_client.get(key_list("mem", " ordre 42 é "))
    assert response.status_code == 200 and listed_ids(text_of(response)) == [spaced.id]
    response = superuser_client.get(key_list("nope", "A"))
    assert response.status_code == 200 and listed_ids(text_of(response)) == []
    assert "No messages match this filter" in text_of(response)


def test_all_matching_of_a_key_list_cannot_act_on_more_than_the_key(superuser_client, worker):
    """The key's list offers no "select all matching"; a forged POST of it is refused
    (it would act on every message of the destination)."""
    a = [outbox.send("mem", {"n": n}, ordering_key="A") for n in range(60)]
    other = outbox.send("mem", {"plain": True})
    html = text_of(superuser_client.get(key_list("mem", "A")))
    assert 'id="select-across-link"' not in html
    data = {
        "action": "cancel",
        "select_across": "1",
        "destination": "mem",
        "ordering_key": "A",
        "post": "yes",
    }
    response = superuser_client.post(u("message_action"), data)
    assert response.status_code == 400
    assert "ordering key" in unescape(text_of(response))
    assert outbox.get(other.id).status == "pending" and outbox.get(a[0].id).status == "pending"


# -- the blocked keys of a destination -------------------------------------------------------
def test_blocked_keys_lists_each_key_with_its_dead_letter_and_what_waits(superuser_client, worker):
    before = time.time()
    k1 = blocked_key(worker, "k1", behind=2)
    k2 = blocked_key(worker, "k 2 <é>", behind=0)
    outbox.send("mem", {"plain": True}, ordering_key="free")  # not blocked
    response = superuser_client.get(u("blocked_keys", "mem"))
    assert response.status_code == 200
    html = text_of(response)
    assert rows_of(html) == [
        {"key": "k1", "head": k1[0].id, "waiting": "2"},  # the longest blocked first
        {"key": "k 2 <é>", "head": k2[0].id, "waiting": "0"},
    ]
    first = row(html, "k1")
    assert f'href="{u("message_detail", k1[0].id)}" class="blocked-head-link"' in first
    assert BLOCKING_ERROR in first
    assert re.search(r'class="blocked-retries">0 / 3<', first)
    since = re.search(r'class="blocked-since"><time datetime="([^"]+)"', first)
    assert since and before - 1 <= datetime.fromisoformat(since.group(1)).timestamp() <= time.time()
    waits = re.search(r'class="blocked-key-link" href="([^"]+)"', first)
    assert waits and unescape(waits.group(1)) == key_list("mem", "k1")
    assert "&lt;é&gt;" in row(html, "k 2 &lt;é&gt;")  # escaped
    assert element_text(html, "blocked-key-total") == "2"


def test_blocked_keys_are_linked_from_the_destination_page_and_the_dashboard(superuser_client, worker):
    blocked_key(worker, "k1", behind=1)
    blocked_key(worker, "k2", behind=1)
    blocked_key(worker, "h1", behind=0, destination="poison")
    html = text_of(superuser_client.get(u("destination", "mem")))
    assert re.search(r'id="blocked-key-count" data-count="2"', html)
    assert f'id="blocked-keys-link" href="{u("blocked_keys", "mem")}"' in html
    html = text_of(superuser_client.get(u("dashboard")))
    assert re.search(r'id="blocked-keys" data-count="3"', html)
    links = dict(re.findall(r'class="blocked-keys-link" data-destination="([^"]+)" href="([^"]+)"', html)[:2])
    assert links == {"mem": u("blocked_keys", "mem"), "poison": u("blocked_keys", "poison")}
    row_html = html.split('data-destination="mem" data-state=')[1].split("</tr>")[0]
    assert "2 blocked keys" in row_html
    assert element_text(html, "count-waiting") == "2"


def test_no_blocked_key_and_an_unknown_destination(superuser_client, repo):
    html = text_of(superuser_client.get(u("blocked_keys", "mem")))
    assert "No ordering key of mem is blocked" in html
    assert superuser_client.get(u("blocked_keys", "nope")).status_code == 404
    html = text_of(superuser_client.get(u("dashboard")))
    assert re.search(r'id="blocked-keys" data-count="0"', html)


def test_requeue_head_is_confirmed_then_the_key_is_delivered_in_order(superuser_client, worker):
    sent = blocked_key(worker, "k1", behind=2)
    response = release(superuser_client, "mem", "k1", "requeue")
    assert response.status_code == 200
    html = unescape(text_of(response))
    assert "Requeue the dead letter at the head of ordering key <code>k1</code> of mem" in html
    assert sent[0].id in html and "2 messages wait behind it" in html
    assert [b.key for b in outbox.blocked_keys("mem")] == ["k1"]  # nothing changed yet

    response = release(superuser_client, "mem", "k1", "requeue", confirm=True)
    assert response.status_code == 302 and response["Location"] == u("blocked_keys", "mem")
    assert messages_of(response) == [
        f"Ordering key k1 of mem released: its dead letter {sent[0].id} requeued; "
        "2 messages waiting behind it follow in order."
    ]
    assert outbox.blocked_keys("mem") == []
    assert LogEntry.objects.get().change_message == messages_of(response)[0]
    worker(simple=True)  # mem delivers again (the default locmem destination)
    assert [outbox.get(m.id).status for m in sent] == ["succeeded"] * 3
    assert [outbox.get(m.id).order_prev for m in sent] == [None, 1, 2]


def test_cancel_head_lets_the_next_message_go(superuser_client, worker):
    sent = blocked_key(worker, "k1", behind=1)
    response = release(superuser_client, "mem", "k1", "cancel", confirm=True)
    assert response.status_code == 302
    assert messages_of(response)[0].startswith(
        f"Ordering key k1 of mem released: its dead letter {sent[0].id} cancelled"
    )
    assert [outbox.get(m.id).status for m in sent] == ["cancelled", "pending"]


def test_a_key_released_meanwhile_is_a_warning_and_bad_posts_change_nothing(superuser_client, worker):
    sent = blocked_key(worker, "k1", behind=1)
    outbox.release_key("mem", "k1", "cancel")  # someone else was faster
    response = release(superuser_client, "mem", "k1", "requeue", confirm=True)
    assert response.status_code == 302
    assert messages_of(response) == ["Ordering key k1 of mem is not blocked (any more); nothing was changed."]
    assert outbox.get(sent[0].id).status == "cancelled"
    again = blocked_key(worker, "k2", behind=0)
    for data, status in (
        ({"key": "k2", "how": "delete", "post": "yes"}, 400),
        ({"key": "bad\x00key", "how": "requeue", "post": "yes"}, 400),
        ({"key": "", "how": "requeue", "post": "yes"}, 400),
    ):
        response = superuser_client.post(u("release_key", "mem"), data)
        assert response.status_code == status, (data, response.status_code)
    assert superuser_client.post(u("release_key", "nope"), {"key": "k2", "how": "requeue"}).status_code == 404
    assert superuser_client.get(u("release_key", "mem")).status_code == 405
    assert outbox.get(again[0].id).status == "failed"


def test_release_needs_its_permission_and_csrf(client, django_user_model, worker):
    sent = blocked_key(worker, "k1", behind=1)
    client.force_login(staff(django_user_model, "viewer", "view_message"))
    html = text_of(client.get(u("blocked_keys", "mem")))
    assert "release-requeue" not in html and "release-cancel" not in html
    assert release(client, "mem", "k1", "requeue", confirm=True).status_code == 403
    client.force_login(staff(django_user_model, "requeuer", "view_message", "requeue_message"))
    html = text_of(client.get(u("blocked_keys", "mem")))
    assert "release-requeue" in html and "release-cancel" not in html
    assert release(client, "mem", "k1", "cancel", confirm=True).status_code == 403
    assert outbox.get(sent[0].id).status == "failed"

    checked = Client(enforce_csrf_checks=True)
    checked.force_login(django_user_model.objects.get(username="requeuer"))
    assert release(checked, "mem", "k1", "requeue", confirm=True).status_code == 403  # no CSRF token
    assert outbox.get(sent[0].id).status == "failed"
    assert release(client, "mem", "k1", "requeue", confirm=True).status_code == 302
    assert outbox.get(sent[0].id).status == "pending"


# -- the waiting status ----------------------------------------------------------------------
def test_waiting_is_listed_with_every_status(superuser_client, worker):
    assert "waiting" in STATUSES
    head, waiting = (outbox.send("mem", {"n": n}, ordering_key="A") for n in range(2))
    html = text_of(superuser_client.get(u("message_list") + "?destination=mem"))
    assert re.search(r'id="status-filter-waiting" data-status="waiting" href="[^"]+">Waiting \(1\)<', html)
    assert f'<tr data-message-id="{waiting.id}" data-status="waiting">' in html
    assert '<span class="outbox-status status-waiting">waiting</span>' in html
    html = text_of(superuser_client.get(u("message_list") + "?status=waiting"))
    assert listed_ids(html) == [waiting.id]
    assert "Waiting messages" in html
    html = text_of(superuser_client.get(u("dashboard")))
    assert element_text(html, "count-waiting") == "1"
    css = Path(finders.find("outbox/admin.css")).read_text()
    assert ".outbox-status.status-waiting {" in css


def test_the_waiting_list_is_ordered_and_filtered_by_next_attempt_as_its_index_is(superuser_client, worker):
    """The ``waiting`` index is scored by the due time (as pending's): a time filter on
    "updated" is checked per message, not read as the index's score."""
    outbox.send("mem", {"n": 0}, ordering_key="A")
    later = outbox.send("mem", {"n": 1}, ordering_key="A", delay=3600)  # waiting, due in an hour
    now = time.time()
    response = superuser_client.get(
        u("message_list") + "?" + urlencode({"status": "waiting", "updated_to": now})
    )
    assert response.status_code == 200
    assert listed_ids(text_of(response)) == [later.id]
    response = superuser_client.get(u("message_list") + "?status=waiting&o=next_attempt")
    assert response.status_code == 200 and "not available" not in text_of(response)
