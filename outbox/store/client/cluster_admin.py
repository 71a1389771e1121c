"""Commands that administer a Redis/Valkey Cluster node: its state, its id, the slot map,
and the steps of a legacy slot migration (``CLUSTER SETSLOT IMPORTING/MIGRATING``,
``MIGRATE`` key by key, ``CLUSTER SETSLOT NODE``). Each takes a plain ``redis.Redis``
client of one node (not a ``RedisCluster``: these commands are per node).

Used by the test cluster (:class:`outbox.testing.cluster_server.ClusterServer`) to form
a cluster and move slots under a running outbox. See
https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#live-reconfiguration
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import Redis

#: A node's address: (host, port).
Node = tuple[str, int]


def _run(client: Redis, *args: Any) -> Any:
    """``client.execute_command(*args)`` (redis-py leaves it unannotated): the raw reply."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cluster_info(client: Redis) -> dict[str, str]:
    """``CLUSTER INFO`` of the node as text fields (``cluster_state``: ``"ok"``...).

    Raises:
        redis.exceptions.RedisError: the node did not answer, or is not a cluster node.
    """
    text = _text(_run(client, "CLUSTER", "INFO"))
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


def node_id(client: Redis) -> str:
    """The node's cluster id, 40 hex characters (``CLUSTER MYID``).

    Raises:
        redis.exceptions.RedisError: as :func:`cluster_info`.
    """
    return _text(_run(client, "CLUSTER", "MYID"))


def slot_owner(client: Redis, slot: int) -> Node | None:
    """The primary serving ``slot`` as this node sees it (``CLUSTER SLOTS``), or None.

    Raises:
        redis.exceptions.RedisError: as :func:`cluster_info`.
    """
    for start, end, primary, *_ in _run(client, "CLUSTER", "SLOTS"):
        if int(start) <= slot <= int(end):
            return (_text(primary[0]), int(primary[1]))
    return None


def assign_slots(client: Redis, first: int, last: int, epoch: int) -> None:
    """Give the node the slots ``first``..``last`` (``CLUSTER ADDSLOTSRANGE``) and its config
    epoch (``CLUSTER SET-CONFIG-EPOCH``, a fresh node only): how a cluster is formed by
    hand where ``--cluster create`` refuses (fewer than 3 primaries).

    Raises:
        redis.exceptions.RedisError: the node refused.
    """
    _run(client, "CLUSTER", "ADDSLOTSRANGE", first, last)
    _run(client, "CLUSTER", "SET-CONFIG-EPOCH", epoch)


def meet(client: Redis, node: Node) -> None:
    """Introduce ``node`` to the cluster of ``client``'s node (``CLUSTER MEET``).

    Raises:
        redis.exceptions.RedisError: the node refused.
    """
    _run(client, "CLUSTER", "MEET", node[0], node[1])


def set_slot(client: Redis, slot: int, state: str, owner_id: str) -> None:
    """``CLUSTER SETSLOT <slot> <state> <owner_id>``: ``state`` is ``"IMPORTING"`` (on the
    target, naming the source), ``"MIGRATING"`` (on the source, naming the target) or
    ``"NODE"`` (naming the new owner, on every primary at the end).

    Raises:
        redis.exceptions.RedisError: the node refused (e.g. ``NODE`` on a source that
            still holds keys of the slot).
    """
    _run(client, "CLUSTER", "SETSLOT", slot, state, owner_id)


def keys_in_slot(client: Redis, slot: int, count: int) -> list[bytes]:
    """Up to ``count`` keys of ``slot`` held by the node (``CLUSTER GETKEYSINSLOT``).

    Raises:
        redis.exceptions.RedisError: the node did not answer.
    """
    return list(_run(client, "CLUSTER", "GETKEYSINSLOT", slot, count))


def migrate(client: Redis, target: Node, keys: Sequence[bytes], timeout_ms: int) -> None:
    """Move ``keys`` from the node to ``target`` (``MIGRATE host port "" 0 timeout KEYS ...``:
    atomically per key, the key deleted at the source once the target has it).

    Raises:
        redis.exceptions.RedisError: the node refused or the target did not answer in time.
    """
    _run(client, "MIGRATE", target[0], target[1], "", 0, timeout_ms, "KEYS", *keys)


def primaries(client: Redis) -> list[Node]:
    """The primaries this node knows and does not think failed (``CLUSTER NODES``:
    ``master`` among a line's flags, neither ``fail`` nor ``fail?``), in its listing order.

    Raises:
        redis.exceptions.RedisError: as :func:`cluster_info`.
    """
    found: list[Node] = []
    for line in _text(_run(client, "CLUSTER", "NODES")).splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        flags = fields[2].split(",")
        if "master" in flags and "fail" not in flags and "fail?" not in flags:
            address = fields[1].split("@", 1)[0]  # host:port@busport[,hostname]
            host, _, port = address.rpartition(":")
            found.append((host, int(port)))
    return found


def migrate_slots(client: Redis, first: int, last: int, target_id: str) -> None:
    """Start the atomic migration of slots ``first``..``last`` from the node to the
    primary ``target_id`` (``CLUSTER MIGRATESLOTS SLOTSRANGE first last NODE target_id``,
    Valkey 9.0+): the target copies the slots' keys as a replica would and takes the
    slots over in one step; no ``ASK`` or ``TRYAGAIN`` is ever answered. The command
    returns once the migration is queued; :func:`slot_owner` tells when it is done.
    https://valkey.io/commands/cluster-migrateslots/

    Raises:
        redis.exceptions.ResponseError: the server has no such command (before Valkey 9)
            or refused (a migration of these slots already runs, the node does not own
            them).
    """
    _run(client, "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", first, last, "NODE", target_id)


def take_over(client: Redis) -> None:
    """Promote the replica ``client`` is connected to now: ``CLUSTER FAILOVER TAKEOVER``
    (no agreement of the other primaries, no wait for the old primary, which may be
    dead). https://valkey.io/commands/cluster-failover/

    Raises:
        redis.exceptions.ResponseError: the node is not a replica, or refused.
    """
    _run(client, "CLUSTER", "FAILOVER", "TAKEOVER")


def flush(client: Redis) -> None:
    """Empty the node (``FLUSHALL``, synchronously).

    Raises:
        redis.exceptions.RedisError: the node did not answer.
    """
    client.flushall()
