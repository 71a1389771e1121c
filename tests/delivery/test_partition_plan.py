"""Which partitions a run's claims ask (outbox/delivery/partitions.py), and a run over
partitions: a destination's cap is shared among the partitions asked, and its due
messages are claimed in whichever partition they are."""

from __future__ import annotations

import time

import pytest

import outbox
from outbox.delivery.partitions import PartitionPlan
from tests.support import assert_index_invariant, with_destinations


def known(plan: PartitionPlan, now: float, due: dict[int, float | None] | None = None) -> None:
    """What a run's first claim tells ``plan``: every partition has a message due at
    ``now``, unless ``due`` says otherwise (None: nothing due)."""
    for k in range(plan.partitions):
        plan.note(k, (due or {}).get(k, now), None, now)


def test_a_run_s_first_claim_asks_every_partition_for_none():
    """It learns where due work waits, and since when, before it takes any."""
    plan = PartitionPlan(16)
    asks = plan.asks(32, {"a": 16}, time.time(), 0.5)
    assert sorted(x.partition for x in asks) == list(range(16)) and {x.limit for x in asks} == {0}
    assert PartitionPlan(1).asks(32, {"a": 16}, time.time(), 0.5)[0].limit == 32  # one: as always


def test_shares_add_up_to_the_run_s_wants_and_caps():
    plan = PartitionPlan(16)
    now = time.time()
    known(plan, now)
    asks = plan.asks(32, {"a": 16, "b": 1}, now, 0.5)
    assert len(asks) == 16 and sum(a.limit for a in asks) == 32
    assert sum(a.caps["a"] for a in asks) == 16 and sum(a.caps["b"] for a in asks) == 1


def test_the_partitions_with_the_oldest_due_work_get_the_shares():
    plan = PartitionPlan(16)
    now = time.time()
    known(plan, now, {k: (now - k if k in (3, 9) else None) for k in range(16)})
    asks = plan.asks(1, {"a": 1}, now + 0.01, 0.5)
    assert [(x.partition, x.limit) for x in asks] == [(9, 1), (3, 0)]


def test_the_oldest_due_work_goes_first_when_what_was_learnt_is_stale():
    """Partitions last asked more than REPOLL seconds ago are asked again (new work may
    have come), but those known to hold due work still go oldest first: on a loaded
    machine the claim after a run's first one came 0.1 s late, the partitions were asked
    in rotation order and the oldest message of the queue was not the first delivered."""
    from outbox.delivery.partitions import REPOLL

    plan = PartitionPlan(16)
    now = time.time()
    known(plan, now, {k: (now - 20 + k if k in (4, 13) else None) for k in range(16)})
    plan.turn = 2  # the rotation would start at partition 3
    asks = plan.asks(1, {"a": 1}, now + 2 * REPOLL, 0.5)
    assert [(x.partition, x.limit) for x in asks][:2] == [(4, 1), (13, 0)]
    assert sorted(x.partition for x in asks) == list(range(16))  # the others asked again


def test_partitions_beyond_what_the_run_wants_are_asked_for_none():
    """A run wanting fewer messages than there are partitions to ask asks the others for
    none: their claims report when their earliest message is due."""
    plan = PartitionPlan(16)
    now = time.time()
    known(plan, now)
    asks = plan.asks(1, {"a": 1}, now + 1, 0.5)  # every partition asked a while ago
    assert sorted(x.partition for x in asks) == list(range(16))
    assert [x.limit for x in asks] == [1] + [0] * 15 and asks[0].caps == {"a": 1}


def test_a_cap_below_the_partitions_asked_goes_first_where_its_messages_were_skipped():
    """A cap of 1 over 16 partitions gives 15 of them a share of 0: a partition whose
    claim skipped that destination's due messages at its share gets it next."""
    plan = PartitionPlan(16)
    now = time.time()
    known(plan, now)
    asks = plan.asks(32, {"a": 1, "b": 4}, now, 0.5)
    (given,) = [x.partition for x in asks if x.caps["a"]]
    skipped = next(x.partition for x in reversed(asks) if x.partition != given)
    for ask in asks:  # every partition answers; `skipped` has a due message of "a"
        held = ask.partition == skipped
        plan.note(ask.partition, now if held else None, None, now, ["a"] if held else [])
    again = plan.asks(1, {"a": 1, "b": 4}, now + 0.01, 0.5)
    assert [(x.partition, x.caps["a"]) for x in again] == [(skipped, 1)]
    # ... also when the run asks every partition again: its share goes there first
    later = plan.asks(32, {"a": 1, "b": 4}, now + 1, 0.5)
    assert [x.partition for x in later if x.caps["a"]] == [skipped]
    assert sum(x.caps["b"] for x in later) == 4


def test_one_slot_takes_the_oldest_due_message_of_any_partition(repo, monkeypatch):
    """With one slot (the locmem transport's MAX_IN_FLIGHT of 1), a run delivers the
    messages oldest first, in whichever partitions they are (docs/testing.md: the locmem
    outbox lists them oldest first; docs/destinations.md: what waited behind a breaker
    goes oldest first)."""
    from outbox.delivery import run
    from outbox.transports import locmem

    parts = repo.keys.partitions
    sent = []
    for i in range(max(6, parts)):  # one per partition, the oldest in 0, the others in reverse
        monkeypatch.setattr("outbox.api.random_partition", lambda p, i=i: -i % parts)
        sent += outbox.send_many([{"destination": "mem", "body": {"i": i}}])
    locmem.outbox.clear()
    assert sorted(run("outbox").claimed) == sorted(m.id for m in sent)
    assert [m.id for m in locmem.outbox] == [m.id for m in sent]


@pytest.mark.parametrize("limit", ["MAX_IN_FLIGHT", "CONCURRENCY"])
def test_one_run_delivers_a_message_from_any_partition_with_one_slot(repo, monkeypatch, settings, limit):
    """A message in each partition in turn, with one slot for it (its destination's
    MAX_IN_FLIGHT, or the worker's CONCURRENCY): one run delivers it. At 16 partitions a
    run once ended at its first claim when that gave its one slot to another partition:
    the burst worker then woke run after run, each ending the same way (MAX_IN_FLIGHT),
    or the run saw nothing due and the message waited for the wake check, which woke a
    run that did the same (CONCURRENCY)."""
    from outbox.delivery import run

    if limit == "CONCURRENCY":
        settings.OUTBOX = {**settings.OUTBOX, "CONCURRENCY": 1}
    with with_destinations("locmem", one={"MAX_IN_FLIGHT": 1}):
        for k in repo.keys.partition_numbers():
            monkeypatch.setattr("outbox.api.random_partition", lambda p, k=k: k)
            (m,) = outbox.send_many([{"destination": "one", "body": {"k": k}}])
            assert repo.keys.of(m.id) == repo.keys.partition(k)
            assert run("outbox").claimed == [m.id], f"partition {k}"
            assert outbox.get(m.id).status == "succeeded"
    assert_index_invariant(repo)
