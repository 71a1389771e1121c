"""send() and send_many() on a cluster one of whose partitions cannot take a write now,
on a private 3-primary cluster of this module's own (its slots are moved and a primary
is crashed): a fresh message without an idempotency key goes to a partition of another
primary; one with a key has one partition and is refused; send_many says which of its
messages were stored (it is atomic per partition only)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

import outbox
from outbox.exceptions import OutboxUnavailable, SendOutcomeUnknown
from outbox.records import partition_of
from outbox.store import get_repository
from outbox.store.keys import partition_for
from outbox.testing import ClusterServer
from tests.support.cluster import PARTITIONS, RQ_QUEUE_NAMES, cluster_settings

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[ClusterServer]:
    with ClusterServer(primaries=3) as cluster:
        yield cluster


@pytest.fixture
def on_own_cluster(own_cluster: ClusterServer, settings: Any) -> Iterator[ClusterServer]:
    """The outbox at 16 partitions on this module's cluster (short timeouts: a crashed
    primary refuses at once on loopback), RQ on the plain private Redis."""
    from outbox.testing.state import empty_outbox

    own_cluster.flush()
    config = cluster_settings(own_cluster, SOCKET_CONNECT_TIMEOUT=0.5, SOCKET_TIMEOUT=2)
    settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": config, "PARTITIONS": PARTITIONS}
    settings.RQ_QUEUES = {name: {"URL": settings.REDIS_URL} for name in RQ_QUEUE_NAMES}
    with empty_outbox():
        yield own_cluster


def tag_slot(partition: int) -> int:
    return key_slot(get_repository().keys.tag_prefix(partition).encode())


def key_in(partition: int, prefix: str = "k") -> str:
    """An idempotency key of destination 'mem' whose partition is ``partition``."""
    return next(
        f"{prefix}{i}" for i in range(10_000) if partition_for("mem", f"{prefix}{i}", PARTITIONS) == partition
    )


def test_a_keyless_send_whose_slot_is_stuck_half_moved_goes_to_another_primary(on_own_cluster, monkeypatch):
    """A legacy migration stopped half-way: the partition's indexes moved, its new
    message records not, so create.lua's keys are split and the source answers TRYAGAIN
    (redis-py retries, then gives up). The message is written in another partition."""
    cluster = on_own_cluster
    outbox.send("mem", {"warm": 1}, idempotency_key=key_in(3))  # partition 3 has indexes now
    slot = tag_slot(3)
    source = cluster.slot_owner(slot)
    cluster.begin_migration(slot, next(n for n in cluster.nodes if n != source))
    try:
        assert cluster.migrate_keys(slot, limit=2) > 0
        monkeypatch.setattr("outbox.api.random_partition", lambda partitions: 3)
        m = outbox.send("mem", {"order": 1})
        # another partition; its primary is another one as this process's slot map says,
        # which a redirection met during the move may have changed: not asserted
        assert partition_of(m.id) != 3
        assert outbox.get(m.id).status == "pending"
        many = outbox.send_many([{"destination": "mem", "body": i} for i in range(5)])
        assert len({partition_of(x.id) for x in many}) == 1 and partition_of(many[0].id) != 3
        assert [outbox.get(x.id).body for x in many] == [str(i).encode() for i in range(5)]
        with pytest.raises(OutboxUnavailable) as refused:  # a key has one partition: no move
            outbox.send("mem", {"order": 2}, idempotency_key=key_in(3, "other"))
        assert refused.value.stored == []
    finally:
        cluster.finish_migration(slot)
    m = outbox.send("mem", {"order": 3}, idempotency_key=key_in(3, "after"))
    assert partition_of(m.id) == 3 and outbox.get(m.id).status == "pending"


def test_a_primary_that_stops_answering_makes_its_partitions_unknown_never_moved(on_own_cluster, monkeypatch):
    """Issue 30, item 2, on the cluster: a primary frozen with SIGSTOP takes the writes
    sent to it and answers after the client has timed out. send_many says which messages
    are stored (other primaries') and which are unknown (the frozen one's), and a keyless
    send whose partition timed out is not moved to another partition (its first write
    may land: moved, it would be stored twice); send_again then stores each once."""
    cluster = on_own_cluster
    frozen = cluster.nodes[0]
    on_frozen = [k for k in range(PARTITIONS) if cluster.slot_owner(tag_slot(k)) == frozen]
    alive = [k for k in range(PARTITIONS) if k not in on_frozen]
    for k in (on_frozen[0], alive[0]):  # connections to both primaries in the pool
        outbox.send("mem", {"warm": k}, idempotency_key=key_in(k, "warm"))
    items = [
        {"destination": "mem", "body": "alive", "idempotency_key": key_in(alive[0])},
        {"destination": "mem", "body": "frozen", "idempotency_key": key_in(on_frozen[0], "f")},
    ]
    process = cluster.server(frozen).process
    process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(SendOutcomeUnknown) as partial:
            outbox.send_many(items)
        monkeypatch.setattr("outbox.sending.validation.random_partition", lambda partitions: on_frozen[0])
        with pytest.raises(SendOutcomeUnknown) as keyless:
            outbox.send("mem", {"n": "keyless"})
    finally:
        process.send_signal(signal.SIGCONT)
    assert [m.body for m in partial.value.stored] == [b"alive"]
    assert [m.body for m in partial.value.unknown] == [b"frozen"] and partial.value.unstored == []
    assert "1 of 2 message(s) stored" in str(partial.value) and "unknown" in str(partial.value)
    assert [partition_of(m.id) for m in keyless.value.unknown] == [on_frozen[0]]  # not moved
    again = outbox.send_again(partial.value.unknown + keyless.value.unknown)
    assert [m.id for m in again] == [m.id for m in partial.value.unknown + keyless.value.unknown]
    assert all(m is not None for m in get_repository().get_many([m.id for m in again]))
    assert get_repository().count() == 5  # the 2 warm ones, alive, frozen, keyless: each once


def test_with_a_primary_down_keyless_sends_go_on_and_send_many_says_what_was_stored(on_own_cluster):
    """Runs last in the module: the crashed primary stays down."""
    cluster = on_own_cluster
    repo = get_repository()
    down = cluster.nodes[0]
    on_down = [k for k in range(PARTITIONS) if cluster.slot_owner(tag_slot(k)) == down]
    alive = [k for k in range(PARTITIONS) if k not in on_down]
    assert on_down and alive
    outbox.send("mem", {"warm": 1})  # scripts loaded, destination registered
    cluster.servers[0].halt()

    sent = [outbox.send("mem", {"n": n}) for n in range(30)]
    assert {partition_of(m.id) for m in sent} <= set(alive)
    assert all(outbox.get(m.id).status == "pending" for m in sent)

    with pytest.raises(OutboxUnavailable, match="nothing was stored"):
        outbox.send("mem", {"n": "keyed"}, idempotency_key=key_in(on_down[0]))

    items = [
        {"destination": "mem", "body": "keyless"},
        {"destination": "mem", "body": "alive", "idempotency_key": key_in(alive[0])},
        {"destination": "mem", "body": "down", "idempotency_key": key_in(on_down[0], "d")},
    ]
    with pytest.raises(OutboxUnavailable, match="2 of 3 message") as partial:
        outbox.send_many(items)
    stored, unstored = partial.value.stored, partial.value.unstored
    assert sorted(m.body for m in stored) == [b"alive", b"keyless"]
    assert [m.body for m in unstored] == [b"down"]
    assert all(repo.get(m.id).status == "pending" for m in stored)
    assert all(partition_of(m.id) in alive for m in stored)
