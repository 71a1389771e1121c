"""The public API: send messages, look them up, requeue, cancel, delete.

Everything here validates its input first and raises
:class:`~outbox.exceptions.InvalidMessage` (a ``ValueError``) before writing anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction

from . import actions, dispatch
from .connection import get_repository
from .delivery import get_transport
from .destinations import get_destination, validate_max_retries
from .exceptions import InvalidMessage
from .records import Attempt, Message, Status, new_message_id
from .retry import RetryPolicy
from .validation import clean_delay, clean_headers, clean_idempotency_key, clean_priority, encode_body

SEND_ARGUMENTS = frozenset(
    {"destination", "body", "content_type", "headers", "idempotency_key", "max_retries", "retry", "delay", "priority"}
)


def build_message(
    destination: str,
    body: Any,
    *,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    max_retries: int | None = None,
    retry: Mapping[str, Any] | Sequence[float] | None = None,
    delay: float | timedelta | None = None,
    priority: str | None = None,
    now: float | None = None,
) -> Message:
    """Validate ``send()`` arguments and build the message, without writing it.

    Raises:
        InvalidMessage: any argument is invalid (see :func:`send`).
    """
    dest = get_destination(destination)
    data, ctype = encode_body(body, content_type)
    if max_retries is None:
        max_retries = dest.max_retries
    else:
        try:
            validate_max_retries(max_retries, "max_retries")
        except ValueError as exc:
            raise InvalidMessage(str(exc), field="max_retries") from exc
    try:
        policy = RetryPolicy.from_value(retry, default=dest.retry_policy)
    except ValueError as exc:
        raise InvalidMessage(f"retry: {exc}", field="retry") from exc
    headers = clean_headers(headers)
    get_transport(dest.name).check_message(data, ctype, headers)
    now = time.time() if now is None else now
    send_time = now + clean_delay(delay)
    return Message(
        id=new_message_id(now),
        destination=dest.name,
        body=data,
        content_type=ctype,
        headers=headers,
        created_at=now,
        idempotency_key=clean_idempotency_key(idempotency_key),
        status=Status.PENDING.value,
        retry_count=0,
        max_retries=max_retries,
        retry_policy=policy.to_dict(),
        send_time=send_time,
        next_attempt_at=send_time,
        queue=clean_priority(priority),
        updated_at=now,
        job_id=dispatch.new_job_id(),
    )


def send(
    destination: str,
    body: Any,
    *,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    max_retries: int | None = None,
    retry: Mapping[str, Any] | Sequence[float] | None = None,
    delay: float | timedelta | None = None,
    priority: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Message:
    """Store a message in Redis and queue its delivery.

    Costs one Redis round trip: the message record, the resend record, the indexes and
    the RQ job go out in one MULTI/EXEC. Inside ``transaction.atomic`` (on database
    ``using``) the write happens when the transaction commits; a rollback sends nothing.

    Args:
        destination: a name in ``OUTBOX["DESTINATIONS"]``.
        body: bytes, str (sent as UTF-8), or JSON-serializable data (``application/json``).
        content_type: overrides the content type guessed from ``body``.
        headers: extra headers for the transport (RFC 9110 names; no CR/LF in values).
        idempotency_key: sending again with the same key within 24 hours returns the
            first message instead of creating another.
        max_retries: retries after the first attempt (0 to 1000); default from the
            destination, then ``OUTBOX["MAX_RETRIES"]``.
        retry: a retry policy (see :mod:`outbox.retry`) over the destination's.
        delay: seconds (or a ``timedelta``) before the first attempt.
        priority: ``"high"``, ``"default"`` or ``"low"``: which queue carries it.
        using: the database alias whose transaction to wait for.

    Returns:
        The :class:`Message`, status ``pending``. With an idempotency key already
        used, the earlier message as it is now.

    Raises:
        InvalidMessage: bad input (``UnknownDestination``, ``MessageTooLarge``, ...);
            nothing is written.
        redis.exceptions.RedisError: Redis could not be reached (outside a transaction).
    """
    message = build_message(
        destination,
        body,
        content_type=content_type,
        headers=headers,
        idempotency_key=idempotency_key,
        max_retries=max_retries,
        retry=retry,
        delay=delay,
        priority=priority,
    )
    return _submit([message], using)[0]


def send_many(messages: Iterable[Mapping[str, Any]], *, using: str = DEFAULT_DB_ALIAS) -> list[Message]:
    """Send a batch: each item is a dict of :func:`send`'s arguments.

    All items are validated before anything is written; one invalid item writes none.
    Records go out in one MULTI/EXEC with one delivery job per ``BATCH_SIZE`` ids of a
    queue and due time.

    Returns:
        The messages, in order (see :func:`send` for idempotency keys).

    Raises:
        InvalidMessage: an item is invalid; ``str(exc)`` names its index.
    """
    now = time.time()
    built = []
    for index, item in enumerate(messages):
        if not isinstance(item, Mapping):
            raise InvalidMessage(f"send_many item {index} must be a dict of send() arguments", field="messages")
        unknown = set(item) - SEND_ARGUMENTS
        if unknown or "destination" not in item or "body" not in item:
            raise InvalidMessage(
                f"send_many item {index}: needs 'destination' and 'body'"
                + (f"; unknown keys {sorted(unknown)}" if unknown else ""),
                field="messages",
            )
        try:
            built.append(build_message(**item, now=now))
        except InvalidMessage as exc:
            exc.args = (f"send_many item {index}: {exc}", *exc.args[1:])
            raise
    if len({m.idempotency_key for m in built if m.idempotency_key}) != sum(1 for m in built if m.idempotency_key):
        raise InvalidMessage("send_many: the same idempotency_key is given twice", field="idempotency_key")
    return _submit(built, using)


def _submit(messages: list[Message], using: str) -> list[Message]:
    """Write messages and their jobs now, or on commit of the current transaction."""
    if not messages:
        return []
    # One job per BATCH_SIZE ids of the same queue and due time.
    jobs = []
    for (queue, due), batch, job_id in dispatch.plan_jobs(messages, key=lambda m: (m.queue, m.send_time)):
        for m in batch:
            m.job_id = job_id
        jobs.append((queue, [m.id for m in batch], job_id, due))

    def write() -> list[str]:
        repo = get_repository()
        with repo.pipeline() as pipe:
            repo.create(pipe, messages)
            for queue, batch, job_id, due in jobs:
                dispatch.enqueue(pipe, queue, batch, job_id=job_id, at=due)
            return [i.decode() for i in pipe.execute()[0]]

    connection = transaction.get_connection(using)
    if connection.in_atomic_block:
        transaction.on_commit(write, using=using)
        return _resolve_known_keys(messages)
    standing = write()
    duplicates = [s for m, s in zip(messages, standing) if s != m.id]
    if not duplicates:
        return messages
    found = {m.id: m for m in get_repository().get_many(duplicates) if m is not None}
    return [found.get(s, m) if s != m.id else m for m, s in zip(messages, standing)]


def _resolve_known_keys(messages: list[Message]) -> list[Message]:
    """Inside a transaction: return messages already sent under the same key, if any.

    (The key is checked again atomically on commit; a duplicate then writes nothing.)
    """
    keyed = [m for m in messages if m.idempotency_key]
    if not keyed:
        return messages
    repo = get_repository()
    existing = repo.ids_for_idempotency_keys([m.idempotency_key for m in keyed])
    found = {m.id: m for m in repo.get_many([e for e in existing if e]) if m is not None}
    replace = {m.id: found[e] for m, e in zip(keyed, existing) if e and e in found}
    return [replace.get(m.id, m) for m in messages]


def get(message_id: str) -> Message:
    """The message with this id, with its current delivery state.

    Raises:
        MessageNotFound: no such message.
    """
    return get_repository().get(message_id)


def attempts(message_id: str) -> list[Attempt]:
    """The message's delivery attempts, newest first (at most ``ATTEMPTS_KEPT``)."""
    return get_repository().attempts(message_id)


def _ids(ids: str | Iterable[str]) -> list[str]:
    return [ids] if isinstance(ids, str) else list(ids)


def requeue(ids: str | Iterable[str]) -> actions.ActionResult:
    """Send failed, cancelled or succeeded messages again with a fresh retry budget.

    Returns:
        :class:`~outbox.actions.ActionResult` (``acted``, ``skipped``: ids in another status or gone).
    """
    return actions.requeue(_ids(ids))


def cancel(ids: str | Iterable[str]) -> actions.ActionResult:
    """Cancel pending or retrying messages. Returns an :class:`~outbox.actions.ActionResult`."""
    return actions.cancel(_ids(ids))


def delete(ids: str | Iterable[str]) -> actions.ActionResult:
    """Delete messages (not while ``sending``) with their history. Returns an ``ActionResult``."""
    return actions.delete(_ids(ids))
