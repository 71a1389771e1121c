"""Ordered keys whose messages go by different queues (priorities): a head that leaves
its key wakes the queue of the next message (issue 31, "also check" item 3). Real Redis
(one partition, and 16 partitions on the single server), real RQ workers in this process,
a real HTTP receiver on loopback."""

from __future__ import annotations

import os

import pytest

import outbox
from outbox.store import get_repository
from tests.support import assert_index_invariant, hook_settings


@pytest.fixture(params=[1, 16], ids=["one-partition", "partitioned"])
def parts(request, redis, settings):
    """The outbox on the single test server with 1 or 16 partitions (on the cluster when
    the suite runs there, 16 only: one partition cannot run on a cluster)."""
    if request.param == 1 and os.environ.get("OUTBOX_TEST_CLUSTER"):
        pytest.skip("one partition cannot run on a cluster (the suite runs on one)")
    settings.OUTBOX = {**settings.OUTBOX, "PARTITIONS": request.param}
    get_repository.cache_clear()
    yield get_repository()
    get_repository.cache_clear()


@pytest.mark.parametrize(("first", "then"), [("low", "high"), ("high", "low")])
def test_a_head_delivered_from_one_queue_wakes_the_queue_of_the_next(parts, receiver, worker, first, then):
    """The next message of the key is promoted to pending in its own queue; before the
    fix nobody woke that queue (only the wake check, 1 to 6 s later), so one burst of
    the worker left it pending."""
    with hook_settings(receiver.url, BREAKER=False):
        head = outbox.send("hook", {"n": 0}, ordering_key="k", priority=first)
        nxt = outbox.send("hook", {"n": 1}, ordering_key="k", priority=then)
        assert outbox.get(nxt.id).status == "waiting"
        worker(simple=True)
        assert [outbox.get(m.id).status for m in (head, nxt)] == ["succeeded", "succeeded"]
    assert [r.json()["n"] for r in receiver.requests] == [0, 1]
    assert_index_invariant(parts)


def test_the_heads_of_several_keys_wake_the_queue_of_their_next_messages(parts, receiver, worker):
    """Four heads delivered in one exchange: their next messages, in another queue, are woken."""
    with hook_settings(receiver.url, BREAKER=False, MAX_IN_FLIGHT=16):
        heads = [
            outbox.send("hook", {"k": k, "n": 0}, ordering_key=f"k{k}", priority="low") for k in range(4)
        ]
        nexts = [
            outbox.send("hook", {"k": k, "n": 1}, ordering_key=f"k{k}", priority="high") for k in range(4)
        ]
        worker(simple=True)
        assert {outbox.get(m.id).status for m in heads + nexts} == {"succeeded"}
    assert_index_invariant(parts)
