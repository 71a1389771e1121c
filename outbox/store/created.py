"""What a create call did with each message (:class:`Created`, :class:`CreateResult`),
and the pure helpers of its arguments: a leaf of the store, shared by
:mod:`.messages` and the I/O-free steps of :mod:`.creating`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from outbox.records import Message
from outbox.store.client.durability import Acknowledgement


def due_queues(messages: Sequence[Message], due_by: float) -> list[str]:
    """The queues of ``messages`` that get a message due by ``due_by`` (epoch seconds), as
    ``lua/create.lua`` judges it (its score: ``next_attempt_at``, else ``created_at``), in
    order of first appearance."""
    out: list[str] = []
    for m in messages:
        score = m.next_attempt_at if m.next_attempt_at is not None else m.created_at
        if score <= due_by and m.queue not in out:
            out.append(m.queue)
    return out


def create_groups(messages: Sequence[Message]) -> dict[tuple[str, str, str], int]:
    """(status, destination, queue) -> its group number (1-based, in order of first
    appearance) among ``messages``: the messages of a group share the index keys that
    ``lua/create.lua`` receives once per group (:meth:`MessageRepository.create_keys`)."""
    groups: dict[tuple[str, str, str], int] = {}
    for m in messages:
        groups.setdefault((m.status, m.destination, m.queue), len(groups) + 1)
    return groups


@dataclass
class Created:
    """What :meth:`MessageRepository.create` did with one message.

    Attributes:
        id: the id the caller proposed.
        standing_id: the id that stands for it: ``id``, or the message already sent under
            the same idempotency key.
        code: ``"new"`` (written), ``"exists"`` (a message with this id was already
            written: a repeated push), ``"duplicate"`` (the key names another message
            with the same body: nothing written), ``"conflict"`` (the key names another
            message with a different body: nothing written) or, with more than one
            partition, ``"unstored"`` (its partition could not be written now, while
            another partition of the call was: see :attr:`CreateResult.errors`) or
            ``"unknown"`` (set by ``outbox.sending.intake``: its partition's write was
            sent and the reply lost, :func:`.outages.may_have_run`; it may be stored).
    """

    id: str
    standing_id: str
    code: str
    #: A message with an ordering key written as new: ``"pending"`` (its key's head) or
    #: ``"waiting"``, its sequence in the key, the sequence delivered before it and the
    #: key's epoch.
    status: str | None = None
    order_seq: int | None = None
    order_prev: int | None = None
    order_epoch: str | None = None


@dataclass
class CreateResult:
    """The reply of :meth:`MessageRepository.create`: one :class:`Created` per message,
    in order, and the queues whose wake-up flag the call set (enqueue their job); with a
    ``durability`` wait, what it acknowledged (:mod:`.durability`)."""

    created: list[Created]
    woken: list[str]
    acknowledged: Acknowledgement | None = None
    #: With more than one partition: the outage (:data:`.outages.PARTITION_UNAVAILABLE`)
    #: each partition that could not be written met, by partition number; its messages
    #: are ``"unstored"``.
    errors: dict[int, Exception] = field(default_factory=dict)
