"""A change of an endpoint whose on-commit step was lost (the process that committed it
died, or Redis did not answer then) reaches Redis through the workers: each copy a
worker loads is checked against the endpoint's state as the claim's gate read it
(``Claim.states``), with no read of its own (docs/webhooks.md, "How workers learn of
changes"). The loss is played here by ``QuerySet.update()``, which announces nothing,
and by forgetting this process's copies, as a worker that never held one."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

import outbox
from outbox import webhooks
from outbox.destinations.config import endpoint_cache
from outbox.destinations.endpoints import limits_of
from outbox.models import Endpoint
from outbox.store import endpoint_versions, get_repository
from outbox.store.client.connection import get_connection, is_cluster
from tests.support.http import receiving
from tests.support.messages import run_worker

pytestmark = pytest.mark.django_db(transaction=True)


def _endpoint(rx, path: str = "/e"):
    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    return webhooks.create_endpoint("acme", rx.base + path).endpoint


def _lost(endpoint, **row) -> None:
    """The row changed and nothing told: no announcement, no Redis write."""
    assert Endpoint.objects.filter(pk=endpoint.pk).update(**row) == 1
    endpoint_cache.clear()  # a worker (and a publisher) that held no copy


def test_an_enable_whose_on_commit_step_was_lost_is_applied_when_a_delivery_meets_the_gate():
    """The endpoint's deliveries are parked (disabled in Redis) and its row enabled with the
    step that puts them back lost: the claim's gate parks the next delivery too, and
    reports the endpoint disabled; the worker loads its row, enables it and puts every
    parked delivery back. Before, a worker only checked the endpoints a claim took (or
    their application's others), so an endpoint alone in its application waited forever."""
    with receiving() as rx:
        endpoint = _endpoint(rx)
        first = outbox.publish("order.paid", {"n": 1}, application="acme")
        webhooks.disable_endpoint(endpoint)
        run_worker(simple=True)
        assert rx.requests == [] and outbox.get(first.deliveries[0].id).status == "pending"  # parked
        _lost(endpoint, disabled=False, disabled_reason="")
        second = outbox.publish("order.paid", {"n": 2}, application="acme")
        assert len(second.deliveries) == 1  # the row is the source of truth: enabled
        run_worker(simple=True)  # parks the second, learns the row, puts both back
        run_worker(simple=True)
        assert sorted(r.json()["n"] for r in rx.requests) == [1, 2]
    assert endpoint_versions.admin_state(get_repository(), endpoint.destination)[0] == "active"


def test_a_disable_whose_on_commit_step_was_lost_parks_what_the_claim_took():
    with receiving() as rx:
        endpoint = _endpoint(rx)
        published = outbox.publish("order.paid", {"n": 1}, application="acme")
        _lost(endpoint, disabled=True, disabled_reason="customer asked")
        run_worker(simple=True)
        assert rx.requests == []
    assert endpoint_versions.admin_state(get_repository(), endpoint.destination)[:2] == (
        "disabled",
        "customer asked",
    )
    assert outbox.get(published.deliveries[0].id).status in ("pending", "retrying")  # parked, waiting


def test_limits_whose_on_commit_step_was_lost_are_written_when_a_claim_meets_the_endpoint():
    with receiving() as rx:
        endpoint = _endpoint(rx)
        outbox.publish("order.paid", {"n": 1}, application="acme")
        _lost(endpoint, rate_limit="5/s", max_concurrency=2)
        assert endpoint_versions.admin_state(get_repository(), endpoint.destination)[2] is None
        run_worker(simple=True)
        assert len(rx.requests) == 1
    assert json.loads(endpoint_versions.admin_state(get_repository(), endpoint.destination)[2]) == limits_of(
        "5/s", 2
    )


def _client_commands(during) -> Counter[str]:
    """The commands clients (not scripts) sent the private Redis while ``during()`` ran, by
    name (MONITOR: each line says whether a script made it)."""
    conn = get_connection()
    seen: Counter[str] = Counter()
    started = threading.Event()
    stop = threading.Event()

    def watch() -> None:
        with conn.monitor() as monitor:
            started.set()
            for line in monitor.listen():
                if line.get("client_type") != "lua":
                    seen[line["command"].split()[0].lower()] += 1
                    if "outbox:test:stop" in line["command"] and stop.is_set():
                        return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    started.wait(5)
    time.sleep(0.1)
    during()
    stop.set()
    conn.get("outbox:test:stop")
    thread.join(10)
    return seen


def test_the_endpoints_a_worker_loads_are_checked_without_a_read_of_their_own(receiver):
    """20 endpoints of one application, each with a delivery: the worker's claims report
    each endpoint's state as their gate read it, so loading the endpoints reads nothing
    from Redis (before, one HMGET of each endpoint's state hash per load: at 2 deliveries
    an endpoint, half a command per delivery)."""
    if is_cluster(get_connection()):
        pytest.skip("MONITOR answers for one node of the cluster")
    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    endpoints = [webhooks.create_endpoint("acme", f"{receiver.base}/e/{i}").endpoint for i in range(20)]
    outbox.publish("order.paid", {"n": 1}, application="acme")
    _lost(endpoints[7], rate_limit="100/s")  # and each copy is checked: this one's limit is written
    seen = _client_commands(lambda: run_worker(simple=True))
    assert len(receiver.requests) == 20
    assert seen["hmget"] == 0, seen
    stored = endpoint_versions.admin_state(get_repository(), endpoints[7].destination)[2]
    assert json.loads(stored) == limits_of("100/s", None)


def test_a_newer_copy_drops_the_pending_check_of_an_older_one(settings):
    """A copy loaded with its application's others waits for a claim to report its state
    before it is checked. A newer copy of that endpoint (the old one expired) is checked
    with its own row, and the older copy's check is dropped: made later against the
    state the newer row explains, the older row (enabled) enabled again an endpoint
    disabled meanwhile (in Redis and in its row, the announcement lost)."""
    settings.OUTBOX = {
        **settings.OUTBOX,
        "ENDPOINTS": {**settings.OUTBOX.get("ENDPOINTS", {}), "CACHE_TTL": 0},
    }
    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    met = webhooks.create_endpoint("acme", "https://93.184.215.14/a").endpoint
    other = webhooks.create_endpoint("acme", "https://93.184.215.14/b").endpoint
    endpoint_cache.clear()
    endpoint_cache.preload(
        [met.destination], {met.destination: ("active", "", None)}
    )  # `other` with it, unchecked
    repo = get_repository()
    repo.destination_action(other.destination, "disable", time.time(), "410 Gone")  # a worker elsewhere ...
    Endpoint.objects.filter(pk=other.pk).update(
        disabled=True, disabled_reason="410 Gone"
    )  # ... announced nothing
    endpoint_cache.preload([], {other.destination: endpoint_versions.admin_state(repo, other.destination)})
    assert endpoint_versions.admin_state(repo, other.destination)[:2] == ("disabled", "410 Gone")
