"""Batches: the exact messages one bulk operation acted on, kept for a while so the
operator can follow them ("137 requeued" -> a list of those 137).

A batch is a Redis sorted set ``<prefix>:batch:<token>`` of message ids scored by the
order they were acted on (0, 1, 2 ...), so a list pages through it by rank. It expires
:data:`TTL` seconds after the operation's last write. The console lists it with
``?batch=<token>`` (:mod:`outbox.admin_views.filters`); the message list then checks
every other filter (status, destination ...) id by id against it.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

from outbox.store import MessageRepository
from outbox.store.background.batches import add_to_batch

if TYPE_CHECKING:
    from outbox.operations.operation import Operation

#: Seconds a batch is kept after its operation's last write (24 hours).
TTL = 24 * 3600
#: What a batch token looks like (URL-safe, so it goes into a query string as is).
TOKEN = re.compile(r"[A-Za-z0-9_-]{8,32}")


def new_token() -> str:
    """A fresh random batch token (12 URL-safe characters, 72 random bits)."""
    return secrets.token_urlsafe(9)


def is_token(text: str) -> bool:
    """True if ``text`` has the shape of a batch token (nothing is read)."""
    return bool(TOKEN.fullmatch(text))


class BatchRecorder:
    """Adds acted-on ids to a batch as an operation goes (one ZADD + EXPIRE per chunk).

    Args:
        repo: the repository (its connection and key names).
        token: the batch token; a fresh one by default.

    Use it as the ``applied`` callback of :func:`outbox.operations.execute`.
    """

    def __init__(self, repo: MessageRepository, token: str | None = None) -> None:
        self.repo = repo
        self.token = token or new_token()
        self.count = 0

    def __call__(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        add_to_batch(self.repo, self.token, ids, self.count, TTL)
        self.count += len(ids)


def recorder_for(repo: MessageRepository, op: Operation) -> BatchRecorder | None:
    """The recorder of the batch of an operation's messages, or None for a delete (the
    deleted messages are gone: there is nothing to list)."""
    return BatchRecorder(repo) if op.name != "delete" else None
