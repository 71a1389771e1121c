"""Reads of ordered delivery's state (``lua/lib/ordering.lua`` writes it): a destination's
blocked keys, and the queue of one ordering key. Part of
:class:`~outbox.store.repository.MessageRepository`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from outbox.store.base import RepositoryBase
from outbox.store.keys import Keys, partition_for


@dataclass(frozen=True)
class BlockedKeyRow:
    """One blocked ordering key as Redis holds it: the key, the id of the dead letter at
    its head (None when its state was lost), when it was blocked (epoch seconds)."""

    key: str
    head_id: str | None
    since: float


class OrderingReads(RepositoryBase):
    """The ordering part of :class:`~outbox.store.repository.MessageRepository`."""

    def blocked_key_rows(self, destination: str, limit: int | None = None) -> list[BlockedKeyRow]:
        """``destination``'s blocked ordering keys, longest blocked first, in every
        partition (one round trip per partition's node; at most ``limit``)."""
        pipe = self.connection.pipeline(transaction=False)
        for k in self.keys.partition_numbers():
            pipe.zrange(self.keys.partition(k).blocked(destination), 0, -1, withscores=True)
        rows: list[tuple[float, str]] = []
        for reply in pipe.execute():
            rows += [(float(score), key.decode()) for key, score in reply]
        rows.sort()
        if limit is not None:
            rows = rows[:limit]
        pipe = self.connection.pipeline(transaction=False)
        for _, key in rows:
            pipe.hget(self.order_keys(destination, key).order_state(destination, key), "blocked")
        heads = pipe.execute() if rows else []
        return [
            BlockedKeyRow(key, head.decode() if head else None, since)
            for (since, key), head in zip(rows, heads, strict=True)
        ]

    def blocked_key_count(self, destination: str) -> int:
        """How many ordering keys of ``destination`` are blocked, in every partition."""
        return self.blocked_key_counts([destination])[destination]

    def blocked_key_counts(self, destinations: Iterable[str]) -> dict[str, int]:
        """Destination -> how many of its ordering keys are blocked, in every partition
        (one pipeline of O(1) ZCARDs: one per destination and partition)."""
        names = list(destinations)
        if not names:
            return {}
        pipe = self.connection.pipeline(transaction=False)
        self.queue_blocked_counts(pipe, names)
        return self.parse_blocked_counts(names, pipe.execute())

    def queue_blocked_counts(self, pipe: Any, destinations: Sequence[str]) -> None:
        """Add to ``pipe`` one ZCARD of the blocked keys per destination and partition (in
        that order), for :meth:`parse_blocked_counts`: a caller that reads more in the same
        round trip (the metrics' gauges)."""
        for destination in destinations:
            for k in self.keys.partition_numbers():
                pipe.zcard(self.keys.partition(k).blocked(destination))

    def parse_blocked_counts(self, destinations: Sequence[str], cards: Sequence[int]) -> dict[str, int]:
        """The replies of :meth:`queue_blocked_counts` as destination -> blocked keys
        (summed over partitions)."""
        p = self.keys.partitions
        return {d: sum(int(c) for c in cards[i * p : (i + 1) * p]) for i, d in enumerate(destinations)}

    def key_queue_lengths(self, destination: str, keys: Sequence[str]) -> list[int]:
        """How many unsettled messages each ordering key of ``keys`` of ``destination``
        holds, head included, in order (one pipeline of O(1) ZCARDs)."""
        if not keys:
            return []
        pipe = self.connection.pipeline(transaction=False)
        for key in keys:
            pipe.zcard(self.order_keys(destination, key).order(destination, key))
        return [int(n) for n in pipe.execute()]

    def key_head(self, destination: str, key: str) -> tuple[str | None, int]:
        """The head of ordering ``key`` of ``destination`` (the id of its first unsettled
        message, None when it has none) and how many unsettled messages it holds, head
        included: one round trip (``ZRANGE 0 0`` and ``ZCARD``), whatever the key's length."""
        queue = self.order_keys(destination, key).order(destination, key)
        pipe = self.connection.pipeline(transaction=False)
        pipe.zrange(queue, 0, 0)
        pipe.zcard(queue)
        first, length = pipe.execute()
        return (first[0].decode() if first else None), int(length)

    def key_log(self, destination: str, key: str, offset: int = 0, limit: int = 50) -> tuple[list[str], int]:
        """One page of every message of ordering ``key`` of ``destination`` (settled or
        not, until deleted), newest first: (ids, how many the key has in all)."""
        keys = self.order_keys(destination, key)
        log = keys.order_log(destination, key)
        pipe = self.connection.pipeline(transaction=False)
        pipe.zrevrange(log, offset, offset + limit - 1)
        pipe.zcard(log)
        ids, total = pipe.execute()
        return [i.decode() for i in ids], int(total)

    def order_keys(self, destination: str, key: str) -> Keys:
        """The :class:`~outbox.store.keys.Keys` of the partition ordering ``key`` of
        ``destination`` lives in (:func:`~outbox.store.keys.partition_for` of the pair)."""
        if not self.keys.partitioned:
            return self.keys
        return self.keys.partition(partition_for(destination, key, self.keys.partitions))
