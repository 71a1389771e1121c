"""The console past LIVE_DESTINATIONS (issue 34, item 6: 10,000 endpoints): the dashboard
reads the destination summary (totals with their age), the settings destinations' rows
and the first endpoints, failing or holding first across every endpoint; the message
list's counts come from the summary too. Here the bounds are made small so that a
handful of destinations cross them."""

from __future__ import annotations

import re

import pytest

import outbox
from outbox.destinations import controls
from outbox.destinations import summary as destination_summary
from outbox.store.reads import summary as summary_store
from tests.support import with_destinations
from tests.support.console import element_text, make, text_of, u

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)


@pytest.fixture
def many(monkeypatch):
    monkeypatch.setattr(destination_summary, "LIVE_DESTINATIONS", 2)
    monkeypatch.setattr("outbox.admin_views.endpoints.ON_DASHBOARD", 2)
    with with_destinations("locmem", a={}, b={}, c={}, d={}):
        yield


def rows(html: str) -> list[str]:
    return re.findall(r'class="destination-row[^"]*" data-destination="([^"]+)"', html)


def test_dashboard_totals_of_a_stated_age_and_the_first_endpoints_failing_first(superuser_client, repo, many):
    from outbox import webhooks

    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    eps = [
        webhooks.create_endpoint("acme", f"https://hooks{i}.example.com/in").endpoint.destination
        for i in range(3)
    ]
    make(repo, 2, "failed", destination="a")
    make(repo, 1, "succeeded", destination="d")
    outbox.publish("order.paid", {"n": 1}, application="acme")  # one pending delivery per endpoint
    controls.pause(eps[2], reason="maintenance")
    html = text_of(superuser_client.get(u("dashboard")))
    assert element_text(html, "count-total") == "6"
    assert 'id="summary-age"' in html
    # every settings destination, then 2 endpoints (ON_DASHBOARD): the held one first
    shown = rows(html)
    assert shown[:7] == ["hook", "mem", "poison", "a", "b", "c", "d"]
    assert shown[7:] == [eps[2], sorted(eps[:2])[0]]
    assert 'id="endpoints-hidden" data-count="1"' in html

    # The totals are the summary's, as of when it was made (shown), until it is made again.
    make(repo, 1, "pending", destination="d")
    assert element_text(text_of(superuser_client.get(u("dashboard"))), "count-total") == "6"
    made = destination_summary.refresh(repo)
    assert made.counts["pending"] == 4 and made.failing == 1 and made.endpoint_destinations == 3
    assert element_text(text_of(superuser_client.get(u("dashboard"))), "count-total") == "7"


def test_message_list_counts_every_destination_from_the_summary(superuser_client, repo, many):
    make(repo, 2, "failed", destination="a")
    html = text_of(superuser_client.get(u("message_list")))
    assert "The counts by status are of" in html
    assert summary_store.read(repo) is not None
    # one destination's counts are read now
    html = text_of(superuser_client.get(u("message_list") + "?destination=a"))
    assert "The counts by status are of" not in html


def test_a_missing_or_stale_summary_is_made_by_the_page(repo, many):
    make(repo, 1, "pending", destination="a")
    assert summary_store.read(repo) is None
    first = destination_summary.current(repo)
    assert first.counts["pending"] == 1
    assert destination_summary.current(repo).at == first.at  # fresh: read, not made again
    assert destination_summary.refresh_if_old(summary_store.MAX_AGE, repo) is None
    assert destination_summary.refresh_if_old(0.0, repo) is not None
