"""Reads of ordered delivery's state (``lua/lib/ordering.lua`` writes it): a destination's
blocked keys, and the queue of one ordering key. Part of
:class:`~outbox.store.repository.MessageRepository`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

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
        pipe = self.connection.pipeline(transaction=False)
        for k in self.keys.partition_numbers():
            pipe.zcard(self.keys.partition(k).blocked(destination))
        return sum(int(n) for n in pipe.execute())

    def key_queue(self, destination: str, key: str) -> list[str]:
        """The ids of the unsettled messages of ordering ``key`` of ``destination``, head
        first (empty when the key has none)."""
        keys = self.order_keys(destination, key)
        ids = cast(list[bytes], self.connection.zrange(keys.order(destination, key), 0, -1))
        return [i.decode() for i in ids]

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
