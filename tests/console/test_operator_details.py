"""What an operator reads and types in the console's first week (issue 20, item 14, the
console's parts): searching by the id as the list shows it, attempt times precise enough
to see a 0.5 s backoff, and a destination without a circuit breaker not claiming one."""

from __future__ import annotations

import os
import re

import pytest

import outbox
from outbox.records import PARTITION_SUFFIX
from outbox.store.reads import queries
from outbox.templatetags.outbox_admin import id_parts
from tests.support import settle, with_destinations
from tests.support.console import make, text_of, u

pytestmark = pytest.mark.django_db(transaction=True)

ROW_ID = re.compile(r'<th scope="row" class="field-id"><a href="[^"]*/messages/([^/"]+)/"')


def listed(html: str) -> list[str]:
    return ROW_ID.findall(html)


def test_the_list_finds_a_message_by_the_id_it_displays(superuser_client, repo):
    """The list shows ``msg_…6024cb0c`` (the prefix and the end); typed back into the
    search, with or without the prefix and the ellipsis, it finds that message."""
    messages = make(repo, 30, "failed", "mem") + make(repo, 5, "pending", "hook")
    for target in (messages[7], messages[-1]):
        prefix, _, end = id_parts(target.id)
        html = text_of(superuser_client.get(u("message_list")))
        digits = end.split("_p", 1)[0]  # with partitions, the end names the id's: "…4f60b163_p7"
        for typed in (f"{prefix}…{end}", end, f"{prefix}...{end}", f" {end} ", end.upper(), digits):
            response = superuser_client.get(u("message_list"), {"q": typed})
            assert response.status_code == 200, typed
            assert listed(text_of(response)) == [target.id], typed
    assert listed(html)  # the list shows rows (the regex reads it)


def test_a_displayed_id_that_matches_nothing_finds_nothing(superuser_client, repo):
    make(repo, 3, "failed", "mem")
    response = superuser_client.get(u("message_list"), {"q": "msg_…00000000"})
    assert response.status_code == 200 and listed(text_of(response)) == []


def test_attempt_times_on_the_detail_page_show_milliseconds(superuser_client, repo, worker):
    """Two attempts 0.5 s apart (the retry policy's backoff) differ in what the page shows."""
    with with_destinations(
        flaky={"TRANSPORT": "locmem", "MAX_RETRIES": 1, "RETRY": [0.5], "OPTIONS": {"fail_with": "boom"}}
    ):
        message = outbox.send("flaky", {"n": 1})
        settle(worker, [message.id])
        html = text_of(superuser_client.get(u("message_detail", message.id)))
    shown = re.findall(r'<td class="attempt-time"><time datetime="[^"]+">([^<]+)</time>', html)
    assert len(shown) == 2, html
    assert all(re.search(r"\d\d:\d\d:\d\d\.\d{3} ", s) for s in shown), shown
    assert shown[0] != shown[1]
    for label in ("Last attempt", "Next attempt"):
        cell = re.search(rf"<th scope=\"row\">{label}</th><td>(.*?)</td>", html)
        assert cell and (cell.group(1) == "–" or re.search(r"\d\d:\d\d:\d\d\.\d{3} ", cell.group(1))), label


def test_a_destination_without_a_breaker_says_the_breaker_is_off(superuser_client, repo):
    """With ``BREAKER: False``, the state does not say "closed" beside "Settings: none"."""
    with with_destinations(
        nobreaker={"TRANSPORT": "locmem", "BREAKER": False},
        breaker={"TRANSPORT": "locmem", "BREAKER": {"FAILURES": 5}},
    ):
        outbox.send("nobreaker", {"n": 1})
        html = text_of(superuser_client.get(u("destination", "nobreaker")))
        cell = re.search(r'<td id="destination-breaker" data-breaker="([^"]*)">(.*?)</td>', html)
        assert cell is not None, html
        assert cell.group(1) == "off" and "off" in cell.group(2) and "closed" not in cell.group(2), (
            cell.group(0)
        )
        outbox.send("breaker", {"n": 1})
        html = text_of(superuser_client.get(u("destination", "breaker")))
        cell = re.search(r'<td id="destination-breaker" data-breaker="([^"]*)">', html)
        assert cell is not None and cell.group(1) == "closed", html


def test_the_list_finds_messages_by_the_start_of_their_id(superuser_client, repo):
    """A start (``msg_`` and the first hex digits: the creation time) is a time range."""
    messages = make(repo, 5, "failed", "mem")
    target = messages[2]
    hex_digits = PARTITION_SUFFIX.sub("", target.id)  # with partitions the id ends in _p<k>
    response = superuser_client.get(u("message_list"), {"q": hex_digits[:-3]})
    assert listed(text_of(response)) == [target.id]
    common = os.path.commonprefix([m.id for m in messages])
    assert len(common) > len("msg_")
    response = superuser_client.get(u("message_list"), {"q": common})
    assert sorted(listed(text_of(response))) == sorted(m.id for m in messages)


def test_a_search_by_part_of_an_id_that_stops_early_says_so(superuser_client, repo, monkeypatch):
    messages = make(repo, 5, "failed", "mem")
    monkeypatch.setattr(queries, "ID_MATCHES", 2)
    common = os.path.commonprefix([m.id for m in messages])
    response = superuser_client.get(u("message_list"), {"q": common})
    html = text_of(response)
    assert len(listed(html)) == 2
    assert "The search by part of an id stopped after 2 matches" in html
    assert 'data-exact="false"' in html


@pytest.mark.parametrize(
    ("typed", "part"),
    [
        ("msg_…4f60b163", ("msg_", "4f60b163")),
        ("msg_...4f60b163", ("msg_", "4f60b163")),
        ("…4F60B163", ("", "4f60b163")),
        ("4f60b163", ("", "4f60b163")),
        ("msg_01a2017c", ("msg_01a2017c", "")),
        ("msg_01a2…63", ("msg_01a2", "63")),
        ("4f60", None),  # too short an end alone: it would match too many
        ("msg_", None),
        ("msg_" + "a" * 28, None),  # a whole id is looked up as one
        ("order-paid-1001", None),
        ("msg_" + "a" * 20 + "…" + "b" * 9, None),  # longer than an id
        # with partitions an id ends with the partition it names, and so may its end
        ("msg_…4f60b163_p7", ("msg_", "4f60b163_p7")),
        ("4F60B163_P12", ("", "4f60b163_p12")),
        ("4f6_p7", None),  # too short an end alone, however many partition digits
        ("msg_" + "a" * 28 + "_p3", None),  # a whole id
        ("msg_" + "a" * 20 + "…" + "b" * 8 + "_p3", ("msg_" + "a" * 20, "b" * 8 + "_p3")),
    ],
)
def test_the_parts_of_an_id_a_search_understands(typed, part):
    assert queries.id_part(typed) == part
