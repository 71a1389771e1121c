"""The test cluster (outbox.testing.cluster_server, the ``redis_cluster`` fixture) is a real
3-primary cluster: every slot served, keys on every node, Lua refused across slots
(CROSSSLOT: the constraint the outbox's scripts must meet), and slots that move the legacy
way, with TRYAGAIN while a slot is half moved."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, ResponseError

from outbox.testing.cluster_server import SLOTS

pytestmark = pytest.mark.cluster

TWO_KEYS = "return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}"


def key_on(cluster, node, tag="k"):
    """A key (with a hash tag) whose slot ``node`` serves."""
    for i in range(10_000):
        key = f"{{{tag}{i}}}:x"
        if cluster.slot_owner(key_slot(key.encode())) == node:
            return key
    raise AssertionError(f"no key found for {node}")


@pytest.fixture
def client(redis_cluster):
    redis_cluster.flush()
    client = redis_cluster.client()
    yield client
    client.close()


def test_three_primaries_serve_all_16384_slots(redis_cluster, client):
    assert redis_cluster.is_ok()
    ranges = client.execute_command("CLUSTER SLOTS", target_nodes=RedisCluster.RANDOM)
    owners = {(host, port) for (host, port) in redis_cluster.nodes}
    covered = sorted(slot for start, end, *_ in _slot_rows(ranges) for slot in range(start, end + 1))
    assert covered == list(range(SLOTS))
    assert {(n.host, n.port) for n in client.get_primaries()} == owners
    assert len(owners) == 3 and client.get_replicas() == []


def _slot_rows(reply):
    # redis-py parses CLUSTER SLOTS to {(start, end): {"primary": (host, port), ...}}
    if isinstance(reply, dict):
        return [(start, end, info) for (start, end), info in reply.items()]
    return [(int(row[0]), int(row[1]), row[2]) for row in reply]


def test_a_cluster_client_sets_and_gets_a_key_on_each_node(redis_cluster, client):
    for node in redis_cluster.nodes:
        key = key_on(redis_cluster, node)
        client.set(key, node[1])
        assert client.get(key) == str(node[1]).encode()
        assert redis_cluster.node_client(node).get(key) == str(node[1]).encode()  # it lives there


def test_lua_with_keys_of_two_slots_answers_crossslot(redis_cluster, client):
    first, second = redis_cluster.nodes[:2]
    a, b = key_on(redis_cluster, first, "a"), key_on(redis_cluster, first, "b")
    assert key_slot(a.encode()) != key_slot(b.encode())  # one node, two slots
    node = redis_cluster.node_client(first)
    sha = client.script_load(TWO_KEYS)  # on every primary (redis-py's default for SCRIPT LOAD)
    # the server's -CROSSSLOT (ClusterCrossSlotError in redis-py 5.1+, a ResponseError before)
    with pytest.raises(ResponseError, match="same slot"):
        node.evalsha(sha, 2, a, b)
    with pytest.raises(RedisClusterException, match="same key slot"):  # redis-py refuses it first
        client.evalsha(sha, 2, a, key_on(redis_cluster, second, "c"))
    # two keys of one slot (one hash tag) are fine
    client.set("{t}:1", "x")
    assert client.evalsha(sha, 2, "{t}:1", "{t}:2") == [b"x", None]


def test_a_moved_slot_is_served_by_its_new_owner(redis_cluster, client):
    source, target = redis_cluster.nodes[0], redis_cluster.nodes[2]
    key = key_on(redis_cluster, source, "move")
    slot = key_slot(key.encode())
    client.set(key, "v")
    try:
        assert redis_cluster.move_slots([slot], target) == 1
        assert redis_cluster.slot_owner(slot) == target
        assert redis_cluster.node_client(target).get(key) == b"v"
        assert client.get(key) == b"v"  # its slot map was stale: MOVED, followed
        assert redis_cluster.is_ok()
    finally:
        redis_cluster.move_slots([slot], source)
    assert redis_cluster.slot_owner(slot) == source and client.get(key) == b"v"


def test_a_script_on_a_half_moved_slot_answers_tryagain(redis_cluster, client):
    source, target = redis_cluster.nodes[1], redis_cluster.nodes[0]
    first = key_on(redis_cluster, source, "half")
    tag = first.split("}")[0] + "}"
    second = f"{tag}:y"
    slot = key_slot(first.encode())
    client.set(first, "1")
    client.set(second, "2")
    sha = client.script_load(TWO_KEYS)
    try:
        redis_cluster.begin_migration(slot, target)
        assert redis_cluster.migrate_keys(slot, limit=1) == 1  # one key moved, one not
        # -TRYAGAIN (TryAgainError in redis-py 5.1+, a ResponseError before)
        with pytest.raises(ResponseError, match="TRYAGAIN|rehashing"):
            redis_cluster.node_client(source).evalsha(sha, 2, first, second)
        redis_cluster.finish_migration(slot)
        assert client.evalsha(sha, 2, first, second) == [b"1", b"2"]
    finally:
        if slot in redis_cluster.migrations:
            redis_cluster.finish_migration(slot)
        redis_cluster.move_slots([slot], source)
