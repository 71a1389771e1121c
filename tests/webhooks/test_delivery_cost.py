"""Redis commands per delivered message to endpoints against one settings destination
(issue 34: "Redis commands per delivered message within 10 %"), counted on the private
Redis with ``INFO commandstats`` deltas over one in-process delivery run each: counts,
not timings.

The same traffic both ways: N deliveries to one loopback receiver answering after 50 ms
(attempts finish a few at a time, as in the benchmark), spread over ENDPOINTS endpoints
of one application, or sent to the settings destination ``hook``. What an exchange does
once per destination (``lua/health.lua``'s state and counted mark; the claim's indexes
and gate) a single destination shares between the messages of an exchange and endpoints
do not: the bounds below keep the work done to cut it (health.lua's totals and the
minute's counts in its one HSET, the mark read only for an exchange written again) from
silently coming back."""

from __future__ import annotations

import time
from collections import Counter

import pytest

import outbox
from outbox import webhooks
from outbox.conf import outbox_settings
from outbox.delivery import loop as delivery
from outbox.destinations.config import get_destination
from outbox.store.client.connection import is_cluster
from tests.delivery.test_claim_cost import server_calls
from tests.support import assert_index_invariant, hook_settings

pytestmark = pytest.mark.django_db(transaction=True)

N = 200
ENDPOINTS = 40
#: Commands per delivered endpoint message over the settings destination's, at the most.
#: The totals depend on how many attempts end together (the settings destination shares
#: more per exchange the more do: 12 to 18 a message measured on a quiet machine, 23.4 in
#: a loaded CI run, where endpoints took 24.5), so no absolute budget is asserted: the
#: bounds below on the commands that were cut are what fail on the old health.lua; the
#: benchmark measures the target (1.1x).
RATIO = 1.9


def per_message(used: Counter[str]) -> float:
    return (sum(used.values()) - used["run seconds"]) / N


def drain(repo) -> Counter[str]:
    """One delivery run over the N stored messages; the commands Redis ran for it."""
    before = server_calls(repo.connection)
    started = time.monotonic()
    report = delivery.run(outbox_settings.queue_name(None))
    used = server_calls(repo.connection) - before
    used["run seconds"] = round(time.monotonic() - started)
    assert len(report.claimed) == N and repo.count("succeeded") == N, report.as_dict()
    assert_index_invariant(repo)
    return used


def drain_endpoints(repo, base: str) -> Counter[str]:
    """N deliveries over ENDPOINTS endpoints (N / ENDPOINTS events published), drained."""
    webhooks.create_event_type("order.paid")
    webhooks.create_application("acme")
    for i in range(ENDPOINTS):
        webhooks.create_endpoint("acme", f"{base}/ep/{i}")
    for n in range(N // ENDPOINTS):
        assert len(outbox.publish("order.paid", {"n": n}, application="acme").deliveries) == ENDPOINTS
    return drain(repo)


def test_endpoint_deliveries_cost_about_the_commands_of_one_settings_destination(repo, receiver):
    if is_cluster(repo.connection):  # INFO answers for one node of the cluster: not the run's count
        pytest.skip("counted on the single server (the benchmark's)")
    receiver.respond((200, {}, 0.05))
    with hook_settings(receiver.url):
        assert get_destination("hook").max_in_flight_default
        outbox.send_many([{"destination": "hook", "body": {"n": i}} for i in range(N)])
        settings_used = drain(repo)
        repo.connection.flushdb()
        used = drain_endpoints(repo, receiver.base)
    ours, theirs = per_message(used), per_message(settings_used)
    detail = (round(ours, 1), round(theirs, 1), used.most_common(), settings_used.most_common())
    assert ours <= theirs * RATIO, detail
    # lua/health.lua, once per destination and exchange (about once per message here):
    # the state hash's totals go in its one HSET (no HINCRBY, HINCRBYFLOAT each: 3 more a
    # message), and so do the minute's counts, carried there until a later minute's
    # outcomes move them to the minute's hash (2 HINCRBY and an EXPIRE per destination
    # and exchange before): HINCRBYs and an EXPIREAT only for an endpoint whose carried
    # minute passed during the run (its outcome and latency bucket fields, 2 or 3)
    assert used["hincrbyfloat"] == 0, detail
    assert used["hincrby"] <= 3 * ENDPOINTS, detail
    assert used["expireat"] <= ENDPOINTS, detail
    # every EXPIRE left is the per-minute statistics' (one per INCRBY)
    assert used["expire"] <= used["incrby"], detail
    # the run's counted mark: one SET per exchange (every outcome here a success, so one
    # per the statistics' INCRBY; a couple more: the queue's wake flag), not one per
    # destination and exchange (about one per endpoint delivery before) ...
    assert used["set"] <= used["incrby"] + 2, detail
    # ... read only for an exchange written again (none here); the few GETs left are the
    # endpoint cache's version checks, one per VERSION_CHECK (1 s) of the run, so a slower
    # machine makes more (21 in a run at load 8)
    assert used["get"] <= N // 10 + 2 * used["run seconds"], detail
