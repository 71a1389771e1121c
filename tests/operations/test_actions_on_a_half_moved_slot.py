"""Bulk requeue and cancel, delete, release and unpark on a real cluster while a partition's
slot is held half-moved by a legacy migration (some of its keys moved, the records the call
declares not): each finds keys at run time (a message's indexes, its ordering key's next
message), so each must check them before its first write and answer TRYAGAIN with nothing
written, not abort half-way ("Script attempted to access a non local key") with its earlier
writes kept. Once the slot is handed over, the same call does its work."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis import Redis
from redis.crc import key_slot

import outbox
from outbox.exceptions import MessageNotFound, OutboxUnavailable
from outbox.store import ClaimOptions, get_repository
from outbox.store.client import cluster_admin
from outbox.store.client.outages import CLUSTER_IN_FLUX
from outbox.store.keys import partition_for
from outbox.testing.cluster_server import ClusterServer
from tests.support.messages import hook_settings, settle

REFUSED = (OutboxUnavailable, *CLUSTER_IN_FLUX)
PARTITION = 3


def keys_in_partition(count: int, destination: str = "hook") -> list[str]:
    """``count`` idempotency keys whose messages of ``destination`` land in partition 3."""
    p = get_repository().keys.partitions
    return [k for k in (f"k{i}" for i in range(20_000)) if partition_for(destination, k, p) == PARTITION][
        :count
    ]


@contextmanager
def half_moved(cluster: ClusterServer, keys: list[str]) -> Iterator[Redis]:
    """The slot of ``keys`` held half-moved: its migration opened and those keys alone moved
    to another primary. Yields a client of the source node; hands the slot over at the end."""
    slot = key_slot(keys[0].encode())
    source = cluster.slot_owner(slot)
    target = next(n for n in cluster.nodes if n != source)
    cluster.begin_migration(slot, target)
    try:
        node = cluster.node_client(source)
        cluster_admin.migrate(node, target, [k.encode() for k in keys], 5000)
        yield node
    finally:
        cluster.finish_migration(slot)


def test_a_bulk_requeue_writes_nothing_while_the_index_it_moves_to_has_moved(
    cluster_mode, redis_cluster, receiver, worker
):
    receiver.respond(400)
    k1, k2, k3 = keys_in_partition(3)
    with hook_settings(receiver.url, RETRY=[60]):
        dead = [outbox.send("hook", {"n": i}, idempotency_key=k) for i, k in enumerate((k1, k2))]
        # until both are dead letters: one burst pass claimed nothing in some matrix runs
        # (order-dependent, not reproduced alone; see the closing note of issue 32)
        settle(worker, [m.id for m in dead])
        later = outbox.send("hook", {"n": 3}, idempotency_key=k3, delay=3600)  # a pending index
    assert {outbox.get(m.id).status for m in dead} == {"failed"}  # dead letters
    repo = get_repository()
    part = repo.keys.of(later.id)
    with half_moved(redis_cluster, [part.status("pending", "hook")]) as node:
        with pytest.raises(REFUSED):
            outbox.requeue([m.id for m in dead])
        for m in dead:  # nothing written
            assert node.hget(repo.keys.resend(m.id), "status") == b"failed"
            assert node.zscore(part.status("failed", "hook"), m.id) is not None
    assert outbox.requeue([m.id for m in dead]).acted == 2
    assert {outbox.get(m.id).status for m in dead} == {"pending"}
    assert all(cluster_mode.zscore(part.due(dead[0].queue), m.id) is not None for m in dead)


def test_cancelling_an_ordered_head_writes_nothing_while_the_next_record_has_moved(
    cluster_mode, redis_cluster
):
    """The next message of the key becomes its head in the same script: its record is a
    key the caller cannot declare. Before, the head was cancelled and the script aborted
    at that record: the key waited for ever behind a head that was gone."""
    head = outbox.send("hook", {"n": 1}, ordering_key="order-9", delay=3600)
    nxt = outbox.send("hook", {"n": 2}, ordering_key="order-9")
    assert outbox.get(nxt.id).status == "waiting"
    repo = get_repository()
    with half_moved(redis_cluster, [repo.keys.resend(nxt.id)]) as node:
        with pytest.raises(REFUSED):
            outbox.cancel([head.id])
        assert node.hget(repo.keys.resend(head.id), "status") == b"pending"  # nothing written
    assert outbox.cancel([head.id]).acted == 1
    assert (outbox.get(head.id).status, outbox.get(nxt.id).status) == ("cancelled", "pending")


def test_a_delete_writes_nothing_while_an_index_it_cleans_has_moved(
    cluster_mode, redis_cluster, receiver, worker
):
    """A dead letter (its attempts list written) deleted: its idempotency key, records and
    index entries go in one script, which finds the indexes at run time."""
    receiver.respond(400)
    (k1,) = keys_in_partition(1)
    with hook_settings(receiver.url, RETRY=[60]):
        m = outbox.send("hook", {"n": 1}, idempotency_key=k1)
        worker(simple=True)
    assert outbox.get(m.id).status == "failed"
    repo = get_repository()
    part = repo.keys.of(m.id)
    records = [repo.keys.resend(m.id), repo.keys.message(m.id), repo.keys.attempts(m.id)]
    assert cluster_mode.exists(*records) == 3
    with half_moved(redis_cluster, [part.created("hook")]) as node:
        with pytest.raises(REFUSED):
            outbox.delete([m.id])
        assert node.exists(*records) == 3  # nothing written
        assert node.zscore(part.status("failed", "hook"), m.id) is not None
        assert node.get(part.idempotency("hook", k1)) is not None
    assert outbox.delete([m.id]).acted == 1
    with pytest.raises(MessageNotFound):
        outbox.get(m.id)
    assert cluster_mode.get(part.idempotency("hook", k1)) is None


def test_a_release_writes_nothing_while_the_due_index_has_moved(cluster_mode, redis_cluster):
    """A worker gives back the messages it claimed and did not attempt (a shutdown)."""
    ids = [outbox.send("hook", {"n": i}, idempotency_key=k).id for i, k in enumerate(keys_in_partition(2))]
    repo = get_repository()
    now = time.time()
    claim = repo.claim("outbox", now, PARTITION, ClaimOptions(lease="L", deadline=now + 60, limit=5))
    assert sorted(m.id for m in claim.messages) == sorted(ids)
    part = repo.keys.of(ids[0])
    assert cluster_mode.zcard(part.due("outbox")) == 0
    cluster_mode.zadd(part.due("outbox"), {"placeholder": 0})  # the index exists, and moves
    with half_moved(redis_cluster, [part.due("outbox")]) as node:
        with pytest.raises(CLUSTER_IN_FLUX):
            repo.release("L", now + 60, now, ids)
        assert {node.hget(repo.keys.resend(i), "status") for i in ids} == {b"sending"}  # nothing written
    assert sorted(repo.release("L", now + 60, now, ids).applied) == sorted(ids)
    assert {outbox.get(i).status for i in ids} == {"pending"}
    assert all(cluster_mode.zscore(part.due("outbox"), i) is not None for i in ids)


def test_an_unpark_writes_nothing_while_a_parked_messages_record_has_moved(
    cluster_mode, redis_cluster, hook, worker
):
    """Before, the parked entries looked at before the moved record were taken out of the
    parked set and the script aborted: messages neither parked nor due, never delivered."""
    from outbox.destinations import controls

    controls.pause("hook")
    sent = [outbox.send("hook", {"n": i}, idempotency_key=k) for i, k in enumerate(keys_in_partition(3))]
    worker()
    repo = get_repository()
    part = repo.keys.of(sent[0].id)
    parked = [i.decode() for i in cluster_mode.zrange(part.parked("hook"), 0, -1)]
    assert sorted(parked) == sorted(m.id for m in sent)
    cluster_mode.hset(repo.keys.dest("hook"), "admin", "active")  # resumed, not yet unparked
    with half_moved(redis_cluster, [repo.keys.resend(parked[1])]) as node:
        with pytest.raises(CLUSTER_IN_FLUX):
            repo.unpark("hook", time.time())
        assert node.zcard(part.parked("hook")) == 3  # nothing written
    moved, _, left = repo.unpark("hook", time.time())
    assert (moved, left) == (3, 0)
    assert all(cluster_mode.zscore(part.due(m.queue), m.id) is not None for m in sent)  # due again
