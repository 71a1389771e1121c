"""Ordered delivery's operations: list a destination's blocked ordering keys, and release
one by requeueing or cancelling the dead letter at its head (the console's "Blocked
keys" view and ``manage.py outbox_ordering`` use these).

A key blocks when the message at its head becomes a dead letter and its destination's
``ORDERING`` policy is ``"block"`` (the default): the key's later messages stay
``waiting`` until the head is requeued (delivered first, then the rest in order),
cancelled or deleted (the next message becomes the head). See ``docs/concepts.md``,
"Ordered delivery".
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox.exceptions import InvalidMessage, MessageNotFound
from outbox.operations import actions
from outbox.records import Message, Status
from outbox.sending.validation import clean_ordering_key
from outbox.store import get_repository

#: How :func:`release_key` releases a blocked key.
RELEASES = ("requeue", "cancel")


@dataclass(frozen=True)
class BlockedKey:
    """One blocked ordering key.

    Attributes:
        destination: the destination's name.
        key: the ordering key.
        head: the dead letter at its head, or None when it could not be read.
        since: when the key was blocked (epoch seconds).
        waiting: how many messages wait behind the head.
    """

    destination: str
    key: str
    head: Message | None
    since: float
    waiting: int


def blocked_keys(destination: str, limit: int | None = 1000) -> list[BlockedKey]:
    """``destination``'s blocked ordering keys, longest blocked first (at most ``limit``;
    None: all). Four pipelined rounds whatever the number of keys (the blocked keys of
    every partition, their states, their heads, their queues' lengths)."""
    repo = get_repository()
    rows = repo.blocked_key_rows(destination, limit)
    heads = repo.get_many([r.head_id for r in rows if r.head_id])
    by_id = {m.id: m for m in heads if m is not None}
    lengths = repo.key_queue_lengths(destination, [r.key for r in rows])
    return [
        BlockedKey(destination, r.key, by_id.get(r.head_id or ""), r.since, max(0, n - 1))
        for r, n in zip(rows, lengths, strict=True)
    ]


def blocked_key_count(destination: str) -> int:
    """How many ordering keys of ``destination`` are blocked."""
    return get_repository().blocked_key_count(destination)


def release_key(destination: str, key: str, how: str = "requeue") -> str:
    """Release a blocked ordering key: ``how="requeue"`` sends its dead letter again
    (delivered first, then the key's other messages in order; a fresh retry budget),
    ``how="cancel"`` cancels it (the next message becomes the head).

    Returns:
        The id of the dead letter acted on.

    Raises:
        InvalidMessage: ``how`` is not one of :data:`RELEASES`, or ``key`` is not an
            ordering key.
        MessageNotFound: the key is not blocked (its head is not a dead letter).
    """
    if how not in RELEASES:
        raise InvalidMessage(f"how must be one of {', '.join(RELEASES)}, not {how!r}", field="how")
    key = clean_ordering_key(key) or ""
    repo = get_repository()
    head_id, _ = repo.key_head(destination, key)
    head = repo.get_many([head_id])[0] if head_id else None
    if head is None or head.status != Status.FAILED.value:
        raise MessageNotFound(f"ordering key {key!r} of destination {destination!r} is not blocked")
    done = actions.requeue([head.id]) if how == "requeue" else actions.cancel_dead_letters([head.id])
    if not done.acted:
        raise MessageNotFound(f"ordering key {key!r} of destination {destination!r} is not blocked")
    return head.id
