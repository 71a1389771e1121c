"""send() and the operations on one message, on a real 3-primary cluster with 16
partitions (tests/support/cluster.py): every script call stays in one hash slot (a
cluster refuses one that does not), the message id names its partition, and what the
single-server suite proves of sending holds here."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

import outbox
from outbox.exceptions import IdempotencyConflict
from outbox.records import partition_of
from outbox.store import get_repository
from outbox.store.keys import partition_for
from tests.support.cluster import PARTITIONS


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_send_writes_a_message_in_its_partitions_slot_and_get_reads_it(cluster_mode, redis_cluster):
    m = outbox.send("mem", {"order": 1})
    assert m.id.endswith(f"_p{partition_of(m.id)}") and 0 <= partition_of(m.id) < PARTITIONS
    got = outbox.get(m.id)
    assert (got.status, got.body, got.destination) == ("pending", m.body, "mem")
    repo = get_repository()
    part = repo.keys.of(m.id)
    keys = [
        repo.keys.message(m.id),
        repo.keys.resend(m.id),
        part.due("outbox"),
        part.status("pending", "mem"),
    ]
    assert len({slot(k) for k in keys}) == 1
    assert cluster_mode.zscore(part.due("outbox"), m.id) is not None
    assert cluster_mode.sismember(repo.keys.destinations, "mem")
    assert cluster_mode.get(repo.keys.wake("outbox")) is not None  # its queue was woken


def test_keyless_messages_of_one_send_many_share_a_partition_keyed_ones_go_where_their_key_maps(cluster_mode):
    sent = outbox.send_many([{"destination": "mem", "body": i} for i in range(50)])
    assert len({partition_of(m.id) for m in sent}) == 1
    keyed = outbox.send_many(
        [{"destination": "mem", "body": i, "idempotency_key": f"k{i}"} for i in range(20)]
    )
    assert [partition_of(m.id) for m in keyed] == [
        partition_for("mem", f"k{i}", PARTITIONS) for i in range(20)
    ]
    assert len({partition_of(m.id) for m in keyed}) > 1  # they span partitions (and nodes)
    assert all(outbox.get(m.id).status == "pending" for m in [*sent, *keyed])


def test_an_idempotency_key_is_checked_in_its_partition(cluster_mode):
    first = outbox.send("mem", {"a": 1}, idempotency_key="order-42")
    again = outbox.send("mem", {"a": 1}, idempotency_key="order-42")
    assert again.id == first.id
    with pytest.raises(IdempotencyConflict):
        outbox.send("mem", {"a": 2}, idempotency_key="order-42")


def test_cancel_requeue_and_delete_by_id_alone(cluster_mode):
    sent = outbox.send_many([{"destination": "mem", "body": i, "idempotency_key": f"c{i}"} for i in range(6)])
    ids = [m.id for m in sent]
    assert outbox.cancel(ids[0]) and outbox.get(ids[0]).status == "cancelled"
    outbox.requeue(ids[0])
    assert outbox.get(ids[0]).status == "pending"
    outbox.cancel(ids[1])
    outbox.delete(ids[1])
    with pytest.raises(outbox.MessageNotFound):
        outbox.get(ids[1])
    assert [outbox.get(i).status for i in ids[2:]] == ["pending"] * 4


def test_bulk_actions_on_ids_of_many_partitions(cluster_mode):
    """One action on ids of several partitions (and nodes): one script call per partition."""
    sent = outbox.send_many(
        [{"destination": "mem", "body": i, "idempotency_key": f"b{i}"} for i in range(30)]
    )
    ids = [m.id for m in sent]
    assert len({partition_of(i) for i in ids}) > 3
    assert outbox.cancel(ids).acted == 30
    assert {outbox.get(i).status for i in ids} == {"cancelled"}
    assert outbox.requeue(ids[:20]).acted == 20
    assert outbox.delete(ids[20:]).acted == 10
    assert [outbox.get(i).status for i in ids[:20]] == ["pending"] * 20
    for i in ids[20:]:
        with pytest.raises(outbox.MessageNotFound):
            outbox.get(i)


def test_counts_read_every_partition(cluster_mode):
    outbox.send_many([{"destination": "mem", "body": i, "idempotency_key": f"l{i}"} for i in range(30)])
    assert get_repository().counts_by_destination(["mem"])["mem"]["pending"] == 30
