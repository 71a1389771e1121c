"""Which primary of a Redis Cluster serves a key, by redis-py's slot map: for the calls
the outbox sends on a node's own client (a pipeline per primary, a write and its wait on
one connection) instead of through the cluster client's routing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster


def primary_of(cluster: RedisCluster, key: str) -> Any:
    """The primary (a ``redis.cluster.ClusterNode``) serving ``key``'s slot in
    ``cluster``'s slot map.

    Raises:
        redis.exceptions.SlotNotCoveredError: no node serves the slot.
    """
    return cluster.get_node_from_key(key)  # type: ignore[no-untyped-call]


def by_primary(cluster: RedisCluster, keys: Sequence[str]) -> dict[str, tuple[Any, list[int]]]:
    """The positions in ``keys`` grouped by the primary serving each key's slot: node name
    -> (the node, its positions in order), in order of first appearance."""
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, key in enumerate(keys):
        node = primary_of(cluster, key)
        groups.setdefault(node.name, (node, []))[1].append(i)
    return groups
