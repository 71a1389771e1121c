"""The Prometheus endpoint, scraped after real deliveries by a real worker to a real receiver.

The exposition is parsed with prometheus_client's own parser, so names, types, labels
and values are checked as Prometheus would read them.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import outbox
from outbox.destinations import controls
from outbox.metrics import METRICS, OutboxCollector, register, unregister
from outbox.metrics.collector import DESTINATION_STATES
from outbox.sending import intake
from outbox.sending.validation import SendArguments, build_message
from tests.support import redis_down, settle, with_destinations
from tests.support.console import blocked_key

pytestmark = pytest.mark.urls("tests.metrics_urls")

TOKEN = "scrape-token-0123456789abcdef"


def parse(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Exposition text -> sample name -> sorted labels -> value."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def families(text: str) -> dict[str, str]:
    """Exposition text -> family name -> type."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def scrape(client, **headers) -> str:
    response = client.get("/outbox/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def send_overdue(destination: str, body, seconds: float) -> outbox.Message:
    """A message whose first attempt was due ``seconds`` ago (written as send() writes it)."""
    message = build_message(SendArguments(destination, body), time.time() - seconds)
    intake.store([message], repeat=False)
    return message


@pytest.fixture
def scraper(client, settings):
    """A test client that sends the scrape job's bearer token (no database needed, so
    ``send()`` writes to Redis at once instead of waiting for a test transaction)."""
    settings.OUTBOX = {**settings.OUTBOX, "METRICS_TOKEN": TOKEN}
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return client


def test_scrape_after_real_deliveries(hook, worker, scraper):
    controls.pause("mem", reason="maintenance")
    held = outbox.send("mem", {"held": True})  # the worker parks it: mem is paused
    settle(worker, [outbox.send("hook", {"n": n}).id for n in range(2)])  # delivered
    hook.respond(500)
    settle(worker, [outbox.send("hook", {"n": 3}).id])  # 1 + 3 retries, then a dead letter
    outbox.send("mem", {"later": True}, delay=3600)  # scheduled in the default queue
    send_overdue("mem", {"late": True}, 30)  # due for 30 s, no worker runs
    outbox.send("mem", {"urgent": True}, priority="high")  # due now in outbox_high

    text = scrape(scraper)
    samples, types = parse(text), families(text)
    assert {name: types[name] for name in METRICS} == {name: spec.type for name, spec in METRICS.items()}
    messages = samples["outbox_messages"]
    assert messages[(("destination", "hook"), ("status", "succeeded"))] == 2
    assert messages[(("destination", "hook"), ("status", "failed"))] == 1
    assert messages[(("destination", "hook"), ("status", "pending"))] == 0
    assert messages[(("destination", "mem"), ("status", "pending"))] == 4  # 3 due or scheduled, 1 parked
    assert outbox.get(held.id).status == "pending"
    assert messages[(("destination", "poison"), ("status", "pending"))] == 0  # configured, no messages
    assert {dict(k)["status"] for k in messages} == {
        "pending",
        "sending",
        "retrying",
        "succeeded",
        "failed",
        "cancelled",
        "waiting",
    }
    assert samples["outbox_ordering_keys_blocked"] == {
        (("destination", "hook"),): 0,
        (("destination", "mem"),): 0,
        (("destination", "poison"),): 0,
    }
    assert samples["outbox_queue_due"] == {
        (("queue", "outbox_high"),): 1,
        (("queue", "outbox"),): 1,
        (("queue", "outbox_low"),): 0,
    }
    assert samples["outbox_queue_scheduled"][(("queue", "outbox"),)] == 1
    oldest = samples["outbox_oldest_due_age_seconds"]
    assert 30 <= oldest[(("queue", "outbox"),)] < 40
    assert 0 <= oldest[(("queue", "outbox_high"),)] < 10
    assert oldest[(("queue", "outbox_low"),)] == 0
    assert samples["outbox_up"] == {(): 1}
    assert 0 < samples["outbox_scrape_duration_seconds"][()] < 5

    # destination health (outbox.destinations.health): 2 succeeded, then 4 failed attempts (1 + 3 retries)
    attempts = samples["outbox_attempts_total"]
    assert {dict(k)["outcome"]: v for k, v in attempts.items() if dict(k)["destination"] == "hook"} == {
        "succeeded": 2,
        "retryable": 4,
        "permanent": 0,
    }
    assert attempts[(("destination", "mem"), ("outcome", "succeeded"))] == 0
    buckets = {
        dict(k)["le"]: v
        for k, v in samples["outbox_attempt_duration_seconds_bucket"].items()
        if dict(k)["destination"] == "hook"
    }
    assert buckets["+Inf"] == 6 and buckets["0.001"] <= buckets["0.064"] <= buckets["+Inf"]
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    assert samples["outbox_attempt_duration_seconds_count"][(("destination", "hook"),)] == 6
    assert 0 < samples["outbox_attempt_duration_seconds_sum"][(("destination", "hook"),)] < 6 * 5
    state = samples["outbox_destination_state"]
    current = {d: dict(k)["state"] for k, v in state.items() if v == 1 for d in [dict(k)["destination"]]}
    assert current == {"hook": "failing", "mem": "paused", "poison": "idle"}
    assert len(state) == 3 * len(DESTINATION_STATES)  # every state listed, 0 but the current one
    assert samples["outbox_destination_consecutive_failures"][(("destination", "hook"),)] == 4
    assert samples["outbox_destination_parked"] == {
        (("destination", "hook"),): 0,
        (("destination", "mem"),): 1,
        (("destination", "poison"),): 0,
    }


def test_blocked_ordering_keys_and_waiting_messages_per_destination(scraper, worker):
    blocked_key(worker, "k1", behind=2)
    blocked_key(worker, "k2", behind=1)
    outbox.send("mem", {"n": 0}, ordering_key="free")  # at the head: pending, not blocked
    samples = parse(scrape(scraper))
    assert samples["outbox_ordering_keys_blocked"][(("destination", "mem"),)] == 2
    assert samples["outbox_ordering_keys_blocked"][(("destination", "hook"),)] == 0
    messages = samples["outbox_messages"]
    assert messages[(("destination", "mem"), ("status", "waiting"))] == 3
    assert messages[(("destination", "mem"), ("status", "failed"))] == 2
    outbox.release_key("mem", "k1", "cancel")
    samples = parse(scrape(scraper))
    assert samples["outbox_ordering_keys_blocked"][(("destination", "mem"),)] == 1
    assert samples["outbox_messages"][(("destination", "mem"), ("status", "waiting"))] == 2


def test_a_destination_no_longer_configured_is_still_counted(scraper, worker):
    blocked_key(worker, "k1", behind=1, destination="gone")
    with with_destinations("locmem", gone={}):
        outbox.send("gone", "x")
    samples = parse(scrape(scraper))
    assert samples["outbox_messages"][(("destination", "gone"), ("status", "pending"))] == 1
    assert samples["outbox_messages"][(("destination", "gone"), ("status", "waiting"))] == 1
    assert samples["outbox_ordering_keys_blocked"][(("destination", "gone"),)] == 1


def test_redis_unreachable_is_outbox_up_0_not_an_error(scraper):
    with redis_down():
        text = scrape(scraper)
    samples = parse(text)
    assert samples["outbox_up"] == {(): 0}
    assert "outbox_messages" not in samples and "outbox_queue_due" not in samples


def test_a_bearer_token_lets_a_scraper_in(client, settings):
    settings.OUTBOX = {**settings.OUTBOX, "METRICS_TOKEN": ["old-token-xyz", TOKEN]}
    assert parse(scrape(client, HTTP_AUTHORIZATION=f"Bearer {TOKEN}"))["outbox_up"] == {(): 1}
    assert parse(scrape(client, HTTP_AUTHORIZATION="bearer old-token-xyz"))["outbox_up"] == {(): 1}
    refused = client.get("/outbox/metrics", HTTP_AUTHORIZATION="Bearer wrong")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert b"outbox_" not in refused.content


def test_a_wrong_token_setting_is_a_clear_error(client, settings):
    from django.core.exceptions import ImproperlyConfigured

    settings.OUTBOX = {**settings.OUTBOX, "METRICS_TOKEN": ""}
    with pytest.raises(ImproperlyConfigured, match="METRICS_TOKEN"):
        client.get("/outbox/metrics")


def test_anonymous_requests_are_refused(client):
    response = client.get("/outbox/metrics")
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")
    # no token configured: no bearer value opens it
    assert client.get("/outbox/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


@pytest.mark.django_db
def test_logged_in_users_without_staff_status_are_refused(client, django_user_model):
    user = django_user_model.objects.create_user("plain", password="pw-plain-123")
    client.force_login(user)
    assert client.get("/outbox/metrics").status_code == 403


def test_openmetrics_when_the_scraper_asks_for_it(scraper):
    response = scraper.get("/outbox/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


def test_only_get_and_head(scraper):
    assert scraper.head("/outbox/metrics").status_code == 200
    assert scraper.post("/outbox/metrics").status_code == 405


def test_register_is_idempotent_and_reads_nothing_until_scraped(caplog):
    registry = CollectorRegistry(auto_describe=True)  # as prometheus_client.REGISTRY
    with redis_down():  # registering must not read Redis
        first = register(registry)
    assert not [r for r in caplog.records if "outbox metrics" in r.getMessage()]
    assert register(registry) is first and isinstance(first, OutboxCollector)
    outbox.send("mem", "x")
    samples = parse(generate_latest(registry).decode())
    assert samples["outbox_messages"][(("destination", "mem"), ("status", "pending"))] == 1
    assert unregister(registry) is True and unregister(registry) is False
    assert "outbox_messages" not in parse(generate_latest(registry).decode())


def test_a_scrape_costs_the_same_whatever_the_number_of_messages(scraper, redis):
    def commands_per_scrape() -> int:
        before = redis.info("stats")["total_commands_processed"]
        scrape(scraper)
        return redis.info("stats")["total_commands_processed"] - before

    outbox.send("mem", "first")
    few = commands_per_scrape()
    outbox.send_many([{"destination": "mem", "body": n} for n in range(500)])
    outbox.send_many([{"destination": "hook", "body": n, "delay": 60} for n in range(500)])
    outbox.send_many([{"destination": "mem", "body": n, "ordering_key": f"k{n % 50}"} for n in range(200)])
    assert commands_per_scrape() == few


def test_django_prometheus_metrics_carry_the_outbox_metrics(client, settings):
    """django-prometheus's /metrics serves prometheus_client.REGISTRY: with
    OUTBOX["METRICS_REGISTER"] the app registers the collector there when Django starts."""
    from django.apps import apps
    from prometheus_client import REGISTRY

    settings.OUTBOX = {**settings.OUTBOX, "METRICS_REGISTER": True}
    apps.get_app_config("outbox").ready()  # what Django runs at start-up
    try:
        apps.get_app_config("outbox").ready()  # twice: still one collector
        outbox.send("mem", "x")
        response = client.get("/metrics")
        assert response.status_code == 200
        samples = parse(response.content.decode())
        assert samples["outbox_messages"][(("destination", "mem"), ("status", "pending"))] == 1
        assert samples["outbox_up"] == {(): 1}
    finally:
        unregister(REGISTRY)


@pytest.mark.django_db
def test_staff_users_may_look_in_a_browser(admin_client):
    assert parse(scrape(admin_client))["outbox_up"] == {(): 1}


CORE_WITHOUT_EXTRAS_SCRIPT = """
import sys


class Absent:
    \"\"\"Makes the extras' packages unimportable, as on a machine without them.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Absent())
import django

django.setup()
import outbox.admin, outbox.api, outbox.delivery, outbox.destinations.health, outbox.tracing, outbox.delivery.worker  # noqa
import outbox.transports.webhook  # noqa
import outbox
from outbox.conf import outbox_settings
from outbox.delivery.loop import run

m = outbox.send("mem", "x")  # TRACING is on by default: without the API it does nothing
run("outbox")
print(outbox_settings.TRACING, outbox.get(m.id).status, outbox.get(m.id).headers)
try:
    import outbox.metrics  # noqa
except ImportError as exc:
    print(exc)
"""


def test_the_core_runs_without_the_metrics_and_otel_extras(redis):
    """In a fresh process where prometheus_client and opentelemetry cannot be imported,
    the outbox imports, sends and delivers; outbox.metrics says which extra it needs."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    out = subprocess.run(
        [sys.executable, "-c", CORE_WITHOUT_EXTRAS_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == [
        "True succeeded {}",
        "outbox.metrics needs prometheus_client: pip install 'django-redis-outbox[metrics]'",
    ]


@pytest.mark.django_db(transaction=True)
def test_endpoints_are_added_up_under_one_label_unless_asked(scraper, settings, repo):
    """Endpoints registered at runtime: no destination label per endpoint by default (the
    number of series would grow with a project's customers), their counts added up under
    destination="endpoint:*" with their age; OUTBOX["METRICS_ENDPOINT_LABELS"] gives one
    label per endpoint."""
    from outbox import webhooks

    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    names = [
        webhooks.create_endpoint("acme", f"https://hooks{i}.example.com/in").endpoint.destination
        for i in range(3)
    ]
    outbox.publish("order.paid", {"n": 1}, application="acme")
    outbox.publish("order.paid", {"n": 2}, application="acme")
    samples = parse(scrape(scraper))
    messages = samples["outbox_messages"]
    assert messages[(("destination", "endpoint:*"), ("status", "pending"))] == 6
    assert not any(dict(labels)["destination"] in names for labels in messages)
    assert samples["outbox_endpoint_counts_age_seconds"][()] == 0.0  # counted at scrape time
    assert not any(
        dict(labels).get("destination", "").startswith("endpoint:")
        for labels in samples["outbox_destination_state"]
    )

    settings.OUTBOX = {**settings.OUTBOX, "METRICS_ENDPOINT_LABELS": True}
    messages = parse(scrape(scraper))["outbox_messages"]
    for name in names:
        assert messages[(("destination", name), ("status", "pending"))] == 2
    assert (("destination", "endpoint:*"), ("status", "pending")) not in messages
