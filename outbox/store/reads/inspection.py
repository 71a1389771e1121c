"""Reads for the testing helpers (:mod:`outbox.testing`): which messages were sent since
a time, which wait to become due. Read-only."""

from __future__ import annotations

from typing import cast

from outbox.store.repository import Members, MessageRepository


def ids_since(repo: MessageRepository, since: float) -> list[str]:
    """Ids of the messages created since ``since`` (epoch seconds, less 1 ms), in every
    status index, index by index. One round trip.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    pipe = repo.connection.pipeline(transaction=False)
    for key in repo.index().keys:
        pipe.zrangebyscore(key, since - 0.001, "+inf")
    return [i.decode() for raw in cast(list[Members], pipe.execute()) for i in raw]


def waiting_ids(repo: MessageRepository, queue: str, now: float) -> list[str]:
    """Ids in the due and quarantine indexes of ``queue`` that become due after ``now``
    (epoch seconds): delayed messages and retries waiting for their backoff.

    Raises:
        redis.exceptions.RedisError: Redis could not be reached.
    """
    return [
        i.decode()
        for key in (
            *repo.keys.every("due", queue),
            *repo.keys.every("quarantine", queue),
        )  # suspects: quarantine
        for i in cast(Members, repo.connection.zrangebyscore(key, f"({now}", "+inf"))
    ]
