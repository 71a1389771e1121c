"""The record of a bulk operation's messages (``outbox:batch:<token>``): a sorted set of
the ids acted on, scored by their order, kept for a while (:mod:`outbox.operations.batches`)."""

from __future__ import annotations

from collections.abc import Sequence

from outbox.store.repository import MessageRepository


def add_to_batch(repo: MessageRepository, token: str, ids: Sequence[str], first: int, ttl: float) -> None:
    """Add ``ids`` to batch ``token`` in order, scored ``first``, ``first + 1``, ... (ids
    already in it keep their place: ``ZADD NX``), and let the batch live ``ttl`` seconds
    from now. One round trip.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    key = repo.keys.batch(token)
    pipe = repo.connection.pipeline(transaction=False)
    pipe.zadd(key, {message_id: first + i for i, message_id in enumerate(ids)}, nx=True)
    pipe.expire(key, max(1, int(ttl)))
    pipe.execute()
