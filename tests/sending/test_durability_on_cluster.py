"""OUTBOX["DURABILITY"] on a cluster (outbox/store/client/durability.py, issue 22 "Failover"):
each primary replicates its own writes, so send() sends its script and the wait on one
connection to the primary of the message's partition, one primary after another for a
send_many across partitions; NotDurable when a replica does not answer in time.

A private cluster of 3 primaries with a replica each (:class:`outbox.testing.ClusterServer`,
``replicas=1``) is started for the module. Replicas are held still with SIGSTOP
(``frozen`` from the single-server tests). Before, every send() with the setting on a
cluster raised ImproperlyConfigured ("needs a redis.Redis client").
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import redis as redis_py

import outbox
from outbox.exceptions import NotDurable
from outbox.store import get_repository
from outbox.testing import ClusterServer
from tests.sending.test_durability import frozen
from tests.support.cluster import PARTITIONS, RQ_QUEUE_NAMES, cluster_settings

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def replicated() -> Iterator[ClusterServer]:
    with ClusterServer(primaries=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def on_cluster(replicated: ClusterServer, settings):
    """outbox_at(**durability): the outbox on the (emptied) replicated cluster, 16
    partitions, RQ beside it on the plain Redis, OUTBOX["DURABILITY"] = ``durability``."""
    from outbox.testing.state import empty_outbox

    @contextlib.contextmanager
    def outbox_at(**durability):
        replicated.flush()
        settings.OUTBOX = {
            **settings.OUTBOX,
            "CLUSTER": cluster_settings(replicated),
            "PARTITIONS": PARTITIONS,
            "DURABILITY": durability,
        }
        settings.RQ_QUEUES = {name: {"URL": settings.REDIS_URL} for name in RQ_QUEUE_NAMES}
        get_repository.cache_clear()
        with empty_outbox():
            yield

    return outbox_at


def replicas(cluster: ClusterServer) -> list:
    primaries = cluster.primaries()
    return [cluster.server(node) for node in cluster.nodes if node not in primaries]


@contextlib.contextmanager
def all_frozen(cluster: ClusterServer, thaw_after: float | None = None):
    """Every replica stopped until the block ends, or until ``thaw_after`` seconds after
    the last one stopped, when all are thawed at once; yields a list that then holds the
    ``time.monotonic()`` taken just before they were thawed."""
    thawed_at: list[float] = []
    servers = replicas(cluster)
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(frozen(server))
        timer = None
        if thaw_after is not None:

            def thaw() -> None:
                thawed_at.append(time.monotonic())
                for server in servers:
                    os.kill(server.process.pid, signal.SIGCONT)

            timer = threading.Timer(thaw_after, thaw)
            timer.start()
        try:
            yield thawed_at
        finally:
            if timer is not None:
                timer.join()


def on_its_replica(cluster: ClusterServer, message_id: str) -> bool:
    """Whether the replica of the message's primary has its record (READONLY: a replica
    answers reads of its primary's slots)."""
    key = get_repository().keys.message(message_id)
    primary = cluster.slot_owner(redis_py.crc.key_slot(key.encode()))
    replica = cluster.replica_of(primary)
    conn = redis_py.Redis(host=replica[0], port=replica[1], single_connection_client=True, socket_timeout=5)
    try:
        conn.execute_command("READONLY")
        return bool(conn.exists(key))
    finally:
        conn.close()


def test_send_returns_once_the_replica_of_its_partition_s_primary_has_it(replicated, on_cluster):
    with on_cluster(REPLICAS=1, TIMEOUT=5):
        with all_frozen(replicated, thaw_after=0.5) as thawed_at:
            m = outbox.send("mem", {"n": 1})
            returned = time.monotonic()
            assert thawed_at and returned > thawed_at[0], "send() returned while the replicas were stopped"
        assert on_its_replica(replicated, m.id)


def test_send_many_across_partitions_waits_on_every_primary(replicated, on_cluster):
    with on_cluster(REPLICAS=1, TIMEOUT=5):
        with all_frozen(replicated, thaw_after=0.5) as thawed_at:
            sent = outbox.send_many(
                [{"destination": "mem", "body": i, "idempotency_key": f"s{i}"} for i in range(30)]
            )
            returned = time.monotonic()
            assert thawed_at and returned > thawed_at[0], (
                "send_many() returned while the replicas were stopped"
            )
        assert len({get_repository().keys.message(m.id).split("}")[0] for m in sent}) > 3
        assert all(on_its_replica(replicated, m.id) for m in sent)


def test_a_replica_that_does_not_answer_is_not_durable_and_the_message_is_written(replicated, on_cluster):
    with on_cluster(REPLICAS=1, TIMEOUT=0.3):
        with all_frozen(replicated):
            started = time.monotonic()
            with pytest.raises(NotDurable) as caught:
                outbox.send("mem", {"n": 2})
            assert time.monotonic() - started < 2
        (message_id,) = caught.value.ids
        assert (caught.value.replicas, caught.value.required) == (0, 1)
        assert outbox.get(message_id).status == "pending"


def test_an_idempotency_key_used_before_waits_for_the_earlier_write(replicated, on_cluster):
    """The second send() of a key writes nothing: it waits (PUBLISH and WAIT on every
    primary) for the earlier write, so it is not durable while the replicas are stopped
    and returns the same message once they run."""
    with on_cluster(REPLICAS=1, TIMEOUT=0.3):
        with all_frozen(replicated):
            with pytest.raises(NotDurable):
                outbox.send("mem", {"n": 3}, idempotency_key="k")
            with pytest.raises(NotDurable):
                outbox.send("mem", {"n": 3}, idempotency_key="k")
        first = outbox.send("mem", {"n": 3}, idempotency_key="k")
        assert on_its_replica(replicated, first.id)


def test_after_a_failover_the_writes_go_to_the_promoted_replica(settings, on_cluster):
    """A primary SIGKILLed and its replica promoted after the outbox read the slot map: a
    send_many over every partition finds the old primary gone, reads the map again and
    writes there once more. The promoted primary has no replica (its old primary is
    dead), so the call is not durable: NotDurable, every message written; not
    OutboxUnavailable with some of them not written."""
    import signal

    from outbox.exceptions import OutboxUnavailable

    with ClusterServer(primaries=3, replicas=1) as cluster:
        settings.OUTBOX = {**settings.OUTBOX, "CLUSTER": cluster_settings(cluster), "PARTITIONS": PARTITIONS}
        settings.OUTBOX["DURABILITY"] = {"REPLICAS": 1, "TIMEOUT": 0.3}
        settings.RQ_QUEUES = {name: {"URL": settings.REDIS_URL} for name in RQ_QUEUE_NAMES}
        get_repository.cache_clear()
        # the client reads the slot map; this send's own wait is not under test (a replica
        # still syncing on a busy machine may miss its 0.3 s)
        with contextlib.suppress(NotDurable):
            outbox.send("mem", {"n": 0})
        victim = cluster.primaries()[0]
        replica = cluster.replica_of(victim)
        cluster.server(victim).halt(signal.SIGKILL)
        cluster.take_over(replica)
        items = [{"destination": "mem", "body": i, "idempotency_key": f"f{i}"} for i in range(48)]
        with pytest.raises(NotDurable) as caught:
            try:
                outbox.send_many(items)
            except OutboxUnavailable as exc:
                pytest.fail(f"not written on the promoted replica: {exc}")
        assert {outbox.get(i).status for i in caught.value.ids} == {"pending"}
        get_repository.cache_clear()


def test_a_durable_send_follows_a_slot_that_moved(replicated, on_cluster):
    """Issue 30, item 3: with DURABILITY the cluster path read the slot map again and
    handed the MOVED back, so send() raised OutboxUnavailable as soon as a slot had
    moved (plain messages included). It follows the redirect, as redis-py does."""
    from redis.crc import key_slot

    from outbox.records import partition_of
    from outbox.store.keys import partition_for

    with on_cluster(REPLICAS=1, TIMEOUT=5):
        repo = get_repository()
        keys = [f"m{i}" for i in range(2000) if partition_for("mem", f"m{i}", PARTITIONS) == 5][:5]
        slot = key_slot(repo.keys.tag_prefix(5).encode())
        outbox.send("mem", {"warm": 1}, idempotency_key=keys[0])  # this process's slot map: its owner
        source = replicated.slot_owner(slot)
        target = next(n for n in replicated.primaries() if n != source)
        replicated.move_slots([slot], target)
        try:
            m = outbox.send("mem", {"n": 1}, idempotency_key=keys[1])
            assert partition_of(m.id) == 5 and outbox.get(m.id).status == "pending"
            many = outbox.send_many(
                [{"destination": "mem", "body": i, "idempotency_key": k} for i, k in enumerate(keys[2:])]
            )
            assert {partition_of(x.id) for x in many} == {5}
            assert on_its_replica(replicated, m.id)
        finally:
            replicated.move_slots([slot], source)


def test_a_durable_plain_send_during_a_legacy_migration_goes_to_another_partition(
    replicated, on_cluster, monkeypatch
):
    """The same during a legacy migration, with the partition's keys on the target and its
    slot still MIGRATING: the source answers ASK, the target TRYAGAIN (a script's keys
    split between them), so the write cannot land there until the move ends. A message
    without a key goes to a partition of another primary, as without DURABILITY; one
    with a key is refused (OutboxUnavailable, nothing stored), as documented."""
    from redis.crc import key_slot

    from outbox.exceptions import OutboxUnavailable, SendOutcomeUnknown
    from outbox.records import partition_of
    from outbox.store.keys import partition_for

    with on_cluster(REPLICAS=1, TIMEOUT=5):
        repo = get_repository()
        keys = [f"a{i}" for i in range(2000) if partition_for("mem", f"a{i}", PARTITIONS) == 9][:3]
        slot = key_slot(repo.keys.tag_prefix(9).encode())
        outbox.send("mem", {"warm": 1}, idempotency_key=keys[0])
        source = replicated.slot_owner(slot)
        target = next(n for n in replicated.primaries() if n != source)
        replicated.begin_migration(slot, target)
        try:
            replicated.migrate_keys(slot)  # every key of the partition, on the target now
            monkeypatch.setattr("outbox.sending.validation.random_partition", lambda partitions: 9)
            m = outbox.send("mem", {"n": 1})
            assert partition_of(m.id) != 9 and outbox.get(m.id).status == "pending"
            with pytest.raises(OutboxUnavailable, match="nothing was stored") as refused:
                outbox.send("mem", {"n": 2}, idempotency_key=keys[1])
            assert not isinstance(refused.value, SendOutcomeUnknown)
        finally:
            replicated.finish_migration(slot)
        assert on_its_replica(replicated, m.id)
        replicated.move_slots([slot], source)
