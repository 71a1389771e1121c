"""One rule for where an idempotency record lives and where it is looked up, for every
combination of keys, with 16 partitions on the single server and on the real cluster
(issue 30, item 1; ``outbox/store/idempotency.py``): the record of (destination, key) is
in the partition the pair maps to; an ordered message stored in its ordering key's
partition reserves it there first. An idempotency key names one message of its
destination, whatever its ordering key.

Before: three sends with one key and body, with ordering keys K1, K2 and none, stored
three messages at P = 16; inside ``transaction.atomic`` a repeated (key, ordering key)
returned an id that never existed in Redis."""

from __future__ import annotations

import pytest
from django.db import transaction

import outbox
from outbox.exceptions import IdempotencyConflict, OutboxUnavailable
from outbox.records import new_message_id, partition_of
from outbox.sending.validation import SendArguments, build_message
from outbox.store.keys import partition_for

pytestmark = pytest.mark.django_db(transaction=True)

PARTITIONS = 16


def apart(destination: str = "mem", key: str = "order-1") -> tuple[str, str]:
    """Two ordering keys whose partitions differ from each other and from ``key``'s."""
    home = partition_for(destination, key, PARTITIONS)
    found: list[str] = []
    parts = {home}
    for n in range(1000):
        candidate = f"K{n}"
        p = partition_for(destination, candidate, PARTITIONS)
        if p not in parts:
            parts.add(p)
            found.append(candidate)
        if len(found) == 2:
            return found[0], found[1]
    raise AssertionError("no two ordering keys found")


def count_stored(repo) -> int:
    return sum(repo.counts_by_destination(["mem"])["mem"].values())


@pytest.mark.parametrize(
    "orders",
    [("K1", "K2", None), (None, "K1", "K2"), ("K1", "K1", None), ("K2", None, "K1")],
    ids=["ordered-first", "plain-first", "same-key-twice", "mixed"],
)
def test_one_idempotency_key_stores_one_message_whatever_its_ordering_key(spread, orders):
    k1, k2 = apart()
    names = {"K1": k1, "K2": k2, None: None}
    sent = [outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=names[o]) for o in orders]
    assert {m.id for m in sent} == {sent[0].id}
    assert count_stored(spread) == 1
    assert [outbox.get(m.id).ordering_key for m in sent] == [names[orders[0]]] * 3
    assert spread.ids_for_idempotency_keys([("mem", "order-1")]) == [sent[0].id]


def test_another_body_under_the_key_is_a_conflict_whatever_the_ordering_key(spread):
    k1, k2 = apart()
    first = outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1)
    for ordering_key in (k1, k2, None):
        with pytest.raises(IdempotencyConflict) as raised:
            outbox.send("mem", {"n": 2}, idempotency_key="order-1", ordering_key=ordering_key)
        assert raised.value.existing_id == first.id
    assert count_stored(spread) == 1


def test_send_many_with_one_key_under_several_ordering_keys(spread):
    k1, k2 = apart()
    sent = outbox.send_many(
        [
            {"destination": "mem", "body": {"n": 1}, "idempotency_key": "order-1", "ordering_key": k1},
            {"destination": "mem", "body": {"n": 2}, "idempotency_key": "order-2", "ordering_key": k1},
        ]
    )
    again = outbox.send_many(
        [
            {"destination": "mem", "body": {"n": 1}, "idempotency_key": "order-1", "ordering_key": k2},
            {"destination": "mem", "body": {"n": 2}, "idempotency_key": "order-2"},
            {"destination": "mem", "body": {"n": 3}, "idempotency_key": "order-3", "ordering_key": k2},
        ]
    )
    assert [m.id for m in again[:2]] == [m.id for m in sent]
    assert count_stored(spread) == 3


def test_a_reservation_whose_create_never_ran_is_completed_by_the_next_send(spread):
    """The seam between the two steps: the home record was written (the reservation)
    and the create in the ordering key's partition never ran (a crash, an outage). The
    next send under the key stores the message under the reserved id, once."""
    k1, _ = apart()
    message = build_message(SendArguments("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1))
    home = spread.keys.idempotency_home("mem", "order-1")
    spread.connection.set(home, f"{message.id}|{message.fingerprint()}")
    assert spread.get_many([message.id]) == [None]
    sent = outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1)
    assert sent.id == message.id
    assert outbox.get(message.id).status == "pending"
    assert outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1).id == message.id
    assert count_stored(spread) == 1


def test_a_key_that_names_an_unstored_message_of_another_partition_refuses_and_stores_nothing(spread):
    k1, k2 = apart()
    elsewhere = new_message_id(partition=partition_for("mem", k2, PARTITIONS))
    message = build_message(SendArguments("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1))
    home = spread.keys.idempotency_home("mem", "order-1")
    spread.connection.set(home, f"{elsewhere}|{message.fingerprint()}")
    with pytest.raises(OutboxUnavailable, match="not stored"):
        outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1)
    assert count_stored(spread) == 0


def test_a_record_an_older_version_wrote_in_the_ordering_keys_partition_still_deduplicates(spread):
    """The upgrade window: an older version wrote the record of an ordered message in its
    ordering key's partition only. A send of the same (key, ordering key) finds it there
    (the create call's own check) and points the home record at that message."""
    k1, _ = apart()
    old = outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1)
    home = spread.keys.idempotency_home("mem", "order-1")
    assert partition_of(old.id) != partition_for("mem", "order-1", PARTITIONS)
    spread.connection.delete(home)  # as an older version left it: no home record
    again = outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1)
    assert again.id == old.id and count_stored(spread) == 1
    assert spread.ids_for_idempotency_keys([("mem", "order-1")]) == [old.id]


def test_inside_a_transaction_a_repeated_key_and_ordering_key_returns_a_stored_message(spread):
    k1, _ = apart()
    with transaction.atomic():
        first = outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1)
    assert outbox.get(first.id).status == "pending"  # pushed on commit
    with transaction.atomic():
        again = outbox.send("mem", {"n": 1}, idempotency_key="order-1", ordering_key=k1)
    assert again.id == first.id
    assert outbox.get(again.id).status == "pending"
    assert count_stored(spread) == 1
