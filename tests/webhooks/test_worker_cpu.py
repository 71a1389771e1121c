"""What a worker does per endpoint it meets stays per endpoint in flight or per load, not
per endpoint met nor per setting re-read (issue 34's delivery rate against one settings
destination; docs/benchmarks.md, "Issue 34"):

* the run's count of attempts in flight per destination keeps only destinations with
  one (``WorkerRun.caps`` walked every endpoint the run had met, each claim);
* an endpoint's destination is built from the settings read once
  (``endpoint_template``), with its own limits, and follows a settings change;
* an endpoint's configuration is read as the columns it needs (no model instance),
  the same through ``load`` and ``load_many``;
* a webhook URL's "no whitespace nor control character" check, done on the whole
  string, refuses what the per-character check refused.
"""

from __future__ import annotations

import pytest

import outbox
from outbox import webhooks
from outbox.conf import outbox_settings
from outbox.delivery import loop as delivery
from outbox.destinations import endpoints
from outbox.destinations.config import endpoint_cache, get_destination
from outbox.destinations.limits import RateLimit
from outbox.transports.webhook import _http_url

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINTS = 12
URL = "https://93.184.215.14/hook"


def test_a_run_counts_in_flight_only_the_destinations_with_an_attempt_in_flight(repo, receiver, monkeypatch):
    """Deliveries over 12 endpoints, answered after 50 ms (they end apart): at every
    claim, each destination the run counts has an attempt in flight, and none is left at
    the end. Before, an endpoint stayed in the count at 0 once its attempts ended, and
    every claim's caps walked them all."""
    receiver.respond((200, {}, 0.05))
    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    for i in range(ENDPOINTS):
        webhooks.create_endpoint("acme", f"{receiver.base}/ep/{i}")
    for n in range(3):
        outbox.publish("order.paid", {"n": n}, application="acme")
    seen: list[dict[str, int]] = []
    runs: list[delivery.WorkerRun] = []
    caps = delivery.WorkerRun.caps

    def watched(self: delivery.WorkerRun) -> dict[str, int]:
        seen.append(dict(self.per_destination))
        if not runs:
            runs.append(self)
        return caps(self)

    monkeypatch.setattr(delivery.WorkerRun, "caps", watched)
    report = delivery.run(outbox_settings.queue_name(None))
    assert len(report.claimed) == 3 * ENDPOINTS and repo.count("succeeded") == 3 * ENDPOINTS
    assert len(seen) > 2
    assert all(n > 0 for counts in seen for n in counts.values()), seen
    assert not runs[0].per_destination


def test_an_endpoint_s_destination_has_its_own_limits_and_follows_the_settings(settings):
    app = webhooks.create_application("acme")
    limited = webhooks.create_endpoint(app, URL, rate_limit="5/s", max_concurrency=2).endpoint
    plain = webhooks.create_endpoint(app, URL + "/2").endpoint
    endpoint_cache.clear()
    one, two = get_destination(limited.destination), get_destination(plain.destination)
    assert (one.name, two.name) == (limited.destination, plain.destination)
    assert one.rate_limit == RateLimit.parse("5/s", "x") and one.max_concurrency == 2
    assert two.rate_limit is None and two.max_concurrency is None
    assert one.options["url"] == URL and two.options["url"] == URL + "/2"
    assert one.max_retries == two.max_retries == 3  # OUTBOX["ENDPOINTS"]["MAX_RETRIES"]
    assert one.breaker is None  # OUTBOX["BREAKER"]: False in the tests
    assert one.ordering == "block"
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ORDERING": "skip",
        "BREAKER": {"FAILURES": 7},
        "ENDPOINTS": {**settings.OUTBOX["ENDPOINTS"], "MAX_RETRIES": 5},
    }
    changed = get_destination(limited.destination)
    assert changed.max_retries == 5 and changed.ordering == "skip"
    assert changed.breaker is not None and changed.breaker.failures == 7
    assert changed.rate_limit == RateLimit.parse("5/s", "x") and changed.max_concurrency == 2


def test_load_and_load_many_read_the_same_configuration_in_one_query_each(django_assert_num_queries):
    webhooks.create_event_type("order.paid")
    app = webhooks.create_application("acme")
    created = webhooks.create_endpoint(
        app,
        URL,
        uid="shop-1",
        headers={"X-Tenant": "42"},
        rate_limit="10/s",
        max_concurrency=3,
        filter_types=["order.paid"],
        metadata={"plan": "pro"},
    )
    off = webhooks.disable_endpoint(webhooks.create_endpoint(app, URL + "/off").endpoint)
    names = [created.endpoint.destination, off.destination]
    with django_assert_num_queries(1):
        one = endpoints.load(names[0])
    with django_assert_num_queries(1):
        many = endpoints.load_many(names)
    assert many[names[0]] == one
    assert one is not None
    assert (one.application, one.uid, one.url, dict(one.headers)) == (
        "acme",
        "shop-1",
        URL,
        {"X-Tenant": "42"},
    )
    assert one.secrets == (created.secret,)
    assert (one.rate_limit, one.max_concurrency, one.disabled) == ("10/s", 3, False)
    gone = many[off.destination]
    assert gone.disabled and gone.disabled_reason == "manual"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/a b",
        "https://example.com/a\tb",
        "https://example.com/a\nb",
        "https://example.com/a\rb",
        "https://example.com/a\x00b",
        "https://example.com/a\x7fb",
        "https://example.com/a\u00a0b",  # no-break space
        "https://example.com/a\u2028b",  # line separator
        "https://example.com/a\u200bb",  # zero-width space (a format character)
        "https://example.com/a\x1cb",  # file separator: whitespace to str.isspace
    ],
)
def test_urls_with_whitespace_or_control_characters_are_refused(url):
    assert not _http_url(url)
    assert _http_url(url.replace(url[len("https://example.com/a")], "-"))
