"""The public API: send messages, look them up, requeue, cancel, delete.

Everything here validates its input first and raises
:class:`~outbox.exceptions.InvalidMessage` (a ``ValueError``) before writing anything.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import fields, replace
from datetime import timedelta
from functools import partial
from typing import Any

from asgiref.sync import AsyncToSync, sync_to_async
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from redis.exceptions import RedisClusterException, RedisError

from outbox import tracing
from outbox.conf import outbox_settings
from outbox.endpoint_names import is_endpoint
from outbox.exceptions import (
    EndpointDeleted,
    InvalidMessage,
    MessageNotFound,
    NotDurable,
    OutboxUnavailable,
    SendCancelled,
    SendOutcomeUnknown,
)
from outbox.operations import actions
from outbox.records import Attempt, Message
from outbox.sending import intake
from outbox.sending.validation import SendArguments, build_message
from outbox.store import Created, get_repository
from outbox.store.asteps import adrive, aget_many, arepository, built_repository
from outbox.store.base import IDS_PER_CALL, RepositoryBase
from outbox.store.client.outages import may_have_run
from outbox.store.keys import random_partition
from outbox.store.steps import Blocking, Progress, Steps, drive

#: The keys of a ``send_many`` item: :func:`send`'s arguments but ``using``.
SEND_ARGUMENTS = frozenset(f.name for f in fields(SendArguments))


def send(
    destination: str,
    body: Any,
    *,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    ordering_key: str | None = None,
    max_retries: int | None = None,
    retry: Mapping[str, Any] | Sequence[float] | None = None,
    delay: float | timedelta | None = None,
    priority: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Message:
    """Store a message and have it delivered.

    Outside a transaction: one Redis round trip writes the message record, the resend
    record and the indexes (one atomic script); when no wake-up job waits for its
    queue, a second round trip enqueues one.

    Inside ``transaction.atomic`` (on database ``using``): the message is written to
    this app's table in the same transaction (as durable as your own rows), pushed to
    Redis when the transaction commits, and pushed by the relay of an ``outbox_worker``
    if that push could not happen (Redis down, process killed). A rollback sends nothing.

    Args:
        destination: a name in ``OUTBOX["DESTINATIONS"]``.
        body: bytes, str (sent as UTF-8), or JSON-serializable data (``application/json``).
        content_type: overrides the content type guessed from ``body``.
        headers: extra headers for the transport (RFC 9110 names; no CR/LF in values).
        idempotency_key: sending again to the same destination with the same key within
            24 hours returns the first message instead of creating another (with another
            body it raises :class:`~outbox.exceptions.IdempotencyConflict`). Keys are
            scoped per destination.
        ordering_key: 1 to 200 printable characters: the messages of this destination
            with this key are delivered one at a time, in the order they were accepted
            (outside a transaction: the order in which ``send()`` returns; inside: commit
            order, so a transaction that sends to the key waits in ``send()`` until
            another open transaction that sent to it ends). The ones behind the key's
            head are ``waiting``. Scoped per destination; see ``docs/concepts.md``,
            "Ordered delivery".
        max_retries: retries after the first attempt (0 to 1000); default from the
            destination, then ``OUTBOX["MAX_RETRIES"]``.
        retry: a retry policy (see :mod:`outbox.retry`) over the destination's.
        delay: seconds (or a ``timedelta``) before the first attempt.
        priority: ``"high"``, ``"default"`` or ``"low"``: which queue carries it.
        using: the database alias whose transaction to wait for.

    Returns:
        The :class:`Message`, status ``pending``. With an idempotency key already
        used, the earlier message as it is now. With ``OUTBOX["EAGER"]``, the message
        as its attempt inside the call left it (``succeeded``, or ``retrying`` /
        ``failed`` with that attempt counted; ``pending`` if it was not due yet).

    Raises:
        InvalidMessage: bad input (``UnknownDestination``, ``MessageTooLarge``,
            ``IdempotencyConflict``, ...); nothing is written.
        OutboxUnavailable: outside a transaction, Redis could not be reached (within
            the socket timeouts of the cache alias); nothing is stored. On a cluster, a
            message without an idempotency key whose partition's primary is down (or
            whose slot is stuck half moved) is stored in a partition of another primary
            instead (its id names that partition); one with a key has one partition.
        SendOutcomeUnknown: (an ``OutboxUnavailable``) the write was sent and its reply
            did not come back (a timeout): the message may be stored, so it is never
            moved to another partition. ``exc.unknown`` holds it;
            ``outbox.send_again(exc.unknown)`` stores it once.
        NotDurable: outside a transaction, with ``OUTBOX["DURABILITY"]`` set: the
            message is stored on the Redis primary (and will be delivered) but fewer
            replicas or AOF fsyncs than asked acknowledged it within the setting's
            ``TIMEOUT`` (seconds), so a failover now could lose it. ``exc.messages[0]``
            is the message this call would have returned. Inside a transaction never
            raised: the captured row stays until a push is acknowledged.
    """
    given = SendArguments(
        destination, body, content_type, headers, idempotency_key, ordering_key,
        max_retries, retry, delay, priority,
    )  # fmt: skip
    return _submit([build_message(given)], using)[0]


def send_many(messages: Iterable[Mapping[str, Any]], *, using: str = DEFAULT_DB_ALIAS) -> list[Message]:
    """Send a batch: each item is a dict of :func:`send`'s arguments.

    All items are validated before anything is written; one invalid item writes none.
    Records go out in one script call (atomic), and at most one wake-up job per queue.

    With ``OUTBOX["PARTITIONS"]`` > 1 (a cluster), the call is atomic per partition
    only: the items without an idempotency key go to one partition together (all or
    nothing), an item with a key to its key's partition. When one partition refuses
    (an ``IdempotencyConflict``; on a cluster, its primary down), the others' messages
    are written: ``exc.stored`` lists them.

    Returns:
        The messages, in order (see :func:`send` for idempotency keys).

    Raises:
        InvalidMessage: an item is invalid; ``str(exc)`` names its index.
        IdempotencyConflict: an item's key names a message with another body (its index
            named; ``exc.stored``: the messages written, with partitions).
        OutboxUnavailable, SendOutcomeUnknown, NotDurable: as for :func:`send`
            (``exc.messages``: the list this call would have returned; ``exc.stored`` /
            ``exc.unstored`` of an ``OutboxUnavailable``: what was and was not stored,
            with partitions; ``exc.unknown`` of a ``SendOutcomeUnknown``: the messages
            whose partition timed out, which may be stored).
    """
    return _submit(_build_many(messages), using)


def send_again(messages: Iterable[Message], *, using: str = DEFAULT_DB_ALIAS) -> list[Message]:
    """Store messages again under the ids they already have, after a
    :class:`~outbox.exceptions.SendOutcomeUnknown`: ``outbox.send_again(exc.unknown)``.

    The write is idempotent on the message id: a message that the failed call did store
    is left as it is (not a second copy, not reset), one it did not store is stored now.
    So the pair "a send whose outcome is unknown, then send_again" makes each message
    once, where sending the same content with :func:`send` would make a second message
    whenever the first write had landed. Inside ``transaction.atomic`` the messages are
    captured with the caller's rows, as by :func:`send`, and pushed the same way.

    Call it soon after the error: a message stored by the failed call, delivered and
    then purged by retention (``OUTBOX["RETENTION"]``) would be stored again.

    Args:
        messages: :class:`~outbox.records.Message` objects as an exception of
            :func:`send` or :func:`send_many` lists them (``exc.unknown``,
            ``exc.unstored``), not made by hand.

    Returns:
        The messages, in order, as :func:`send_many` returns them.

    Raises:
        InvalidMessage: an item is not a ``Message``.
        OutboxUnavailable, SendOutcomeUnknown, NotDurable: as for :func:`send_many`;
            calling it again with the new exception's messages is again safe.
    """
    messages = _again(messages)
    # no new "send" span: the messages carry the trace context of the send they repeat
    return _capture_or_store(messages, using, repeat=True)


def _build_many(messages: Iterable[Mapping[str, Any]]) -> list[Message]:
    """:func:`send_many`'s items validated and built (see it for what it raises)."""
    now = time.time()
    built = []
    # The messages without a key go to one partition (all-or-nothing together); see
    # build_message.
    partition = random_partition(outbox_settings.partitions)
    for index, item in enumerate(messages):
        if not isinstance(item, Mapping):
            raise InvalidMessage(
                f"send_many item {index} must be a dict of send() arguments", field="messages"
            )
        unknown = set(item) - SEND_ARGUMENTS
        if unknown or "destination" not in item or "body" not in item:
            raise InvalidMessage(
                f"send_many item {index}: needs 'destination' and 'body'"
                + (f"; unknown keys {sorted(unknown)}" if unknown else ""),
                field="messages",
            )
        try:
            built.append(build_message(SendArguments(**item), now, partition))
        except InvalidMessage as exc:
            exc.args = (f"send_many item {index}: {exc}", *exc.args[1:])
            raise
    if len({m.idempotency_key for m in built if m.idempotency_key}) != sum(
        1 for m in built if m.idempotency_key
    ):
        raise InvalidMessage("send_many: the same idempotency_key is given twice", field="idempotency_key")
    return built


def _again(items: Iterable[Message]) -> list[Message]:
    """:func:`send_again`'s items, checked (see it for what it raises)."""
    messages = list(items)
    for index, item in enumerate(messages):
        if not isinstance(item, Message):
            raise InvalidMessage(
                f"send_again item {index} must be a Message (exc.unknown of a SendOutcomeUnknown), "
                f"not {type(item).__name__}",
                field="messages",
            )
    return messages


@tracing.traced_send  # OpenTelemetry "send" span; trace context into the headers
def _submit(messages: list[Message], using: str, atomic: bool | None = None) -> list[Message]:
    """Capture new messages in the current transaction, or write them to Redis now
    (``atomic``: whether a transaction is open on ``using``, when the caller has just
    looked; None: look)."""
    return _capture_or_store(messages, using, repeat=False, atomic=atomic)


def _capture_or_store(
    messages: list[Message], using: str, repeat: bool, atomic: bool | None = None
) -> list[Message]:
    """Capture messages in the current transaction, or write them to Redis now.

    ``repeat``: the messages may have been stored before (:func:`send_again`), so the
    write checks each id first (``intake.store``)."""
    if not messages:
        return []
    if atomic is None:
        atomic = transaction.get_connection(using).in_atomic_block
    if atomic and not outbox_settings.EAGER:
        from outbox.sending.capture import (
            capture,  # capture imports Django models: `import outbox.api` must not
        )

        return capture(messages, using)
    try:
        repository = get_repository()  # on a cluster, made on first use: it asks for the slot map
    except (RedisError, RedisClusterException) as exc:
        raise _unreachable(messages, exc) from exc
    return drive(repository, _store_steps(messages, repeat))


def _unreachable(messages: Sequence[Message], exc: BaseException) -> OutboxUnavailable:
    """The :class:`OutboxUnavailable` of a write that could not be sent (``exc``)."""
    return OutboxUnavailable(
        f"Redis could not be reached to store {len(messages)} message(s) ({type(exc).__name__}: {exc}); "
        "nothing was stored. Inside transaction.atomic the outbox captures messages in the database instead."
    )


def _store_steps(messages: list[Message], repeat: bool) -> Steps[list[Message]]:
    """Write ``messages`` to Redis now (:func:`intake.store_steps`) and turn what the
    write did into the call's result or exception: the I/O-free steps that
    :func:`send` drives on the synchronous client and :func:`asend` on ``redis.asyncio``."""
    not_durable: NotDurable | None = None
    try:
        created = yield from intake.store_steps(messages, repeat=repeat)
    except NotDurable as exc:  # written, not acknowledged: raised below, with the messages
        created, not_durable = exc.created, exc
    except (RedisError, RedisClusterException) as exc:  # the second: a cluster with a slot no node serves
        raise _not_stored(exc, messages) from exc
    if not_durable is None and not outbox_settings.EAGER and _all_written_as_sent(messages, created):
        return messages  # the common case (every send() without a key): nothing to read back
    # a message moved to another partition (a cluster's primary down) has a new id; an
    # ordered one has its sequence, and is "waiting" behind its key's head
    messages = [_as_created(m, c) for m, c in zip(messages, created, strict=True)]
    stored = [m for m, c in zip(messages, created, strict=True) if c.code in ("new", "exists")]
    unstored = [m for m, c in zip(messages, created, strict=True) if c.code == "unstored"]
    unknown = [m for m, c in zip(messages, created, strict=True) if c.code == "unknown"]
    single = len(messages) == 1
    for index, (message, c) in enumerate(zip(messages, created, strict=True)):
        if c.code == "conflict":
            refused = intake.conflict_error(message, c.standing_id, None if single else index)
            refused.stored = stored
            raise refused
    if unknown:
        raise SendOutcomeUnknown(
            f"{len(stored)} of {len(messages)} message(s) stored; the outcome of {len(unknown)} "
            f"({_first_ids(unknown)}) is unknown: their partition's write was sent and its reply did not "
            "come back (a timeout), so Redis may have stored them"
            + (f", and {len(unstored)} were not stored" if unstored else "")
            + ". Call outbox.send_again(exc.unknown + exc.unstored) to store them once; exc.stored, "
            "exc.unknown and exc.unstored list them.",
            unknown=unknown,
            stored=stored,
            unstored=unstored,
        )
    if unstored:
        raise OutboxUnavailable(
            f"{len(stored)} of {len(messages)} message(s) stored: the partition(s) of {len(unstored)} "
            f"({_first_ids(unstored)}) could not be "
            "written now (a Redis Cluster primary is down or a slot is moving); those were not stored. "
            "exc.stored and exc.unstored list them.",
            stored=stored,
            unstored=unstored,
        )
    standing = [
        c.standing_id if c.code == "duplicate" else m.id for m, c in zip(messages, created, strict=True)
    ]
    # Read back the duplicates (the earlier message as it is now) and, in eager mode,
    # every message as its attempt left it (succeeded, retrying, failed).
    reread = standing if outbox_settings.EAGER else [c.standing_id for c in created if c.code == "duplicate"]
    result = messages
    if reread:  # in a generator of its own: its names would be cells made at every call of this one
        result = yield from _read_back_steps(messages, standing, reread)
    if not_durable is not None:
        not_durable.messages = result
        raise not_durable
    return result


def _read_back_steps(messages: list[Message], standing: list[str], reread: list[str]) -> Steps[list[Message]]:
    """``messages`` with those whose id (``standing``: the id each stands under) is in
    ``reread`` as Redis has them now (read in a thread: a :class:`Blocking` step)."""
    read = yield Blocking(partial(_get_many, reread))
    found = {m.id: m for m in read if m is not None}
    return [found.get(i, m) for m, i in zip(messages, standing, strict=True)]


def _get_many(ids: list[str]) -> list[Message | None]:
    return get_repository().get_many(ids)


def _not_stored(exc: Exception, messages: Sequence[Message]) -> OutboxUnavailable:
    """The error of a write to Redis that failed as a whole with ``exc``: its outcome
    unknown when the write may have run (:func:`~outbox.store.client.outages.may_have_run`),
    else nothing stored."""
    if may_have_run(exc):
        return SendOutcomeUnknown(
            f"the outcome of storing {len(messages)} message(s) is unknown ({type(exc).__name__}: {exc}): "
            "the write was sent, its reply did not come back, and Redis may have stored them. Sending the "
            "same content again with send() could make a second message: call "
            "outbox.send_again(exc.unknown), which stores them under their ids "
            f"({_first_ids(messages)}) once.",
            unknown=list(messages),
        )
    return _unreachable(messages, exc)


def _all_written_as_sent(messages: Sequence[Message], created: Sequence[Created]) -> bool:
    """True when every message was written new, under its own id, unordered: the
    messages stand as they are (what the general path below would return too)."""
    for message, c in zip(messages, created, strict=True):
        if c.code != "new" or c.id != message.id or c.order_seq is not None:
            return False
    return True


def _as_created(message: Message, created: Created) -> Message:
    """``message`` as its write left it: the id it was stored under and, with an ordering
    key, its status (``pending`` at its key's head, else ``waiting``) and sequence."""
    if created.id != message.id:
        message = replace(message, id=created.id)
    if created.order_seq is not None and created.status is not None:
        message = replace(
            message,
            status=created.status,
            order_seq=created.order_seq,
            order_prev=created.order_prev,
            order_epoch=created.order_epoch,
        )
    return message


def _first_ids(messages: Sequence[Message]) -> str:
    """The first three ids of ``messages`` for an error's text, "..." after them."""
    return ", ".join(m.id for m in messages[:3]) + (", ..." if len(messages) > 3 else "")


def get(message_id: str) -> Message:
    """The message with this id, with its current delivery state.

    A message captured in a transaction that Redis does not have yet (inside the
    sending transaction, or while Redis is down) is read from the capture table, with
    status ``pending``.

    Raises:
        MessageNotFound: no such message.
        OutboxUnavailable: Redis is unreachable and the message is not in the capture table.
    """
    from outbox.sending.capture import captured  # capture imports Django models: `import outbox.api` must not

    try:
        return get_repository().get(message_id)
    except MessageNotFound:
        message = captured(message_id)
        if message is None:
            raise
        return message
    except (RedisError, RedisClusterException) as exc:
        message = captured(message_id)
        if message is None:
            raise OutboxUnavailable(
                f"Redis could not be reached to read message {message_id!r}: {exc}"
            ) from exc
        return message


def attempts(message_id: str) -> list[Attempt]:
    """The message's delivery attempts, newest first (at most ``ATTEMPTS_KEPT``)."""
    return get_repository().attempts(message_id)


def _ids(ids: str | Iterable[str]) -> list[str]:
    return [ids] if isinstance(ids, str) else list(ids)


def requeue(ids: str | Iterable[str]) -> actions.ActionResult:
    """Send failed, cancelled or succeeded messages again with a fresh retry budget.

    Returns:
        :class:`~outbox.operations.actions.ActionResult` (``acted``, ``skipped``: ids in another status or gone).

    Raises:
        EndpointDeleted: some of them are deliveries to an endpoint that was deleted
            (the text names them; nothing was requeued). One read per 1,000 ids, and one
            database query per chunk holding endpoint deliveries.
    """
    chosen = _ids(ids)
    _refuse_deleted_endpoints(chosen)
    return actions.requeue(chosen)


def _refuse_deleted_endpoints(ids: list[str]) -> None:
    """Raise :class:`EndpointDeleted` when a message among ``ids`` goes to an endpoint
    whose row is gone."""
    repo = get_repository()
    gone: list[str] = []
    names: set[str] = set()
    for start in range(0, len(ids), IDS_PER_CALL):
        found = [m for m in repo.get_many(ids[start : start + IDS_PER_CALL]) if m is not None]
        ours = {m.destination for m in found if is_endpoint(m.destination)}
        if not ours:
            continue
        from outbox.destinations import endpoints  # Django models: `import outbox` must not load them

        dead = ours - set(endpoints.describe(ours))
        gone += [m.id for m in found if m.destination in dead]
        names |= dead
    if gone:
        raise EndpointDeleted(
            f"{len(gone)} message(s) go to endpoint(s) that were deleted ({', '.join(sorted(names)[:5])}): "
            f"they cannot be requeued; nothing was requeued ({', '.join(gone[:5])}"
            + (", ..." if len(gone) > 5 else "")
            + ")",
            gone,
        )


def cancel(ids: str | Iterable[str]) -> actions.ActionResult:
    """Cancel pending or retrying messages. Returns an :class:`~outbox.operations.actions.ActionResult`."""
    return actions.cancel(_ids(ids))


def delete(ids: str | Iterable[str]) -> actions.ActionResult:
    """Delete messages (not while ``sending``) with their history. Returns an ``ActionResult``."""
    return actions.delete(_ids(ids))


# The asynchronous twins (issue 33): the same arguments, results and exceptions, the same
# steps (``_store_steps``), driven on ``redis.asyncio`` (outbox.store.asteps). See
# docs/async.md.


async def asend(
    destination: str,
    body: Any,
    *,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    ordering_key: str | None = None,
    max_retries: int | None = None,
    retry: Mapping[str, Any] | Sequence[float] | None = None,
    delay: float | timedelta | None = None,
    priority: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Message:
    """:func:`send` for ``async def`` code: ``message = await outbox.asend("orders", body)``.

    The same arguments, result and exceptions as :func:`send`, the same write (one Redis
    round trip, the cluster's fall-over to another partition, ``NOSCRIPT`` and
    ``TRYAGAIN`` handling: the steps both drive), on this event loop's
    ``redis.asyncio`` client: waiting for Redis (a hang included, up to the alias's
    ``SOCKET_TIMEOUT``) blocks only this task. The wake-up job (RQ), an
    ``OUTBOX["DURABILITY"]`` wait and ``OUTBOX["EAGER"]`` delivery run in a thread.

    Transactions: Django's are synchronous and per thread. Called through
    ``async_to_sync`` inside a synchronous ``transaction.atomic`` block, the message is
    captured in that block's transaction, on that thread (as :func:`send` does), never
    written to Redis ahead of the commit. From async code, put the atomic block and
    :func:`send` in one ``sync_to_async`` function (docs/async.md).

    Raises:
        InvalidMessage, OutboxUnavailable, SendOutcomeUnknown, NotDurable: as :func:`send`.
        SendCancelled: the task was cancelled after the write was sent (a
            ``SendOutcomeUnknown`` and an ``asyncio.CancelledError``: ``exc.unknown``).
        asyncio.CancelledError: the task was cancelled before the write was sent
            (nothing was stored).
    """
    given = SendArguments(
        destination, body, content_type, headers, idempotency_key, ordering_key,
        max_retries, retry, delay, priority,
    )  # fmt: skip
    return (await _asubmit([build_message(given)], using))[0]


async def asend_many(
    messages: Iterable[Mapping[str, Any]], *, using: str = DEFAULT_DB_ALIAS
) -> list[Message]:
    """:func:`send_many` for ``async def`` code (see it, and :func:`asend`)."""
    return await _asubmit(_build_many(messages), using)


async def asend_again(messages: Iterable[Message], *, using: str = DEFAULT_DB_ALIAS) -> list[Message]:
    """:func:`send_again` for ``async def`` code: after a ``SendOutcomeUnknown`` (or a
    ``SendCancelled``), ``await outbox.asend_again(exc.unknown)`` (see :func:`send_again`)."""
    return await _acapture_or_store(_again(messages), using, repeat=True)


@tracing.atraced_send  # the same "send" span as _submit's
def _asubmit(messages: list[Message], using: str) -> Awaitable[list[Message]]:
    """:func:`_submit` on an event loop, to await: new messages captured or written (see
    :func:`asend`); the coroutine of :func:`_acapture_or_store` itself, no layer around it."""
    return _acapture_or_store(messages, using, repeat=False)


def _acapture_or_store(messages: list[Message], using: str, repeat: bool) -> Awaitable[list[Message]]:
    """:func:`_capture_or_store` on an event loop (see :func:`asend`), to await. On the
    common path (no transaction to join, the repository and this loop's client made)
    the drive's coroutine itself (:func:`~outbox.store.asteps.adrive`, which turns a
    cancellation after the write into :class:`SendCancelled`): the awaiting task holds one
    coroutine less per ``asend`` (in asyncio's debug mode each one made keeps a stack of
    ten frames for the collector, and the collector's passes were what ran over 1 ms)."""
    repository = built_repository()
    if (
        not messages
        or repository is None
        or (not outbox_settings.EAGER and (atomic_block_here(using) or _has_sync_caller()))
    ):
        return _acapture_or_store_fully(messages, using, repeat)
    return _astore(repository, messages, repeat)


async def _acapture_or_store_fully(messages: list[Message], using: str, repeat: bool) -> list[Message]:
    """:func:`_acapture_or_store` on every path: a transaction to join, the repository to make."""
    if not messages:
        return []
    if not outbox_settings.EAGER:
        if atomic_block_here(using):
            # an atomic block on this very thread (DJANGO_ALLOW_ASYNC_UNSAFE): capture here
            return _capture_or_store(messages, using, repeat)
        if await _callers_atomic_block(using):
            # async_to_sync inside transaction.atomic: capture in the caller's thread and
            # transaction (asgiref runs a thread-sensitive call on the thread that waits)
            return await sync_to_async(_capture_or_store, thread_sensitive=True)(messages, using, repeat)
    try:
        repository = await arepository()
    except (RedisError, RedisClusterException) as exc:
        raise _unreachable(messages, exc) from exc
    return await _astore(repository, messages, repeat)


def _astore(repository: RepositoryBase, messages: list[Message], repeat: bool) -> Awaitable[list[Message]]:
    """The drive of :func:`_store_steps` on this loop (:func:`~outbox.store.asteps.adrive`),
    a cancellation after the write raised as :class:`SendCancelled`."""
    return adrive(repository, _store_steps(messages, repeat), Progress(), partial(_send_cancelled, messages))


def _send_cancelled(messages: list[Message]) -> SendCancelled:
    """The error of a task cancelled after the write of ``messages`` was sent."""
    return SendCancelled(
        f"the task sending {len(messages)} message(s) was cancelled after their write was sent: the "
        "outcome is unknown, Redis may have stored them. Call outbox.send_again(exc.unknown) (or "
        f"asend_again), which stores them under their ids ({_first_ids(messages)}) once.",
        unknown=messages,
    )


def atomic_block_here(using: str) -> bool:
    """Whether database ``using``'s connection of this context is inside
    ``transaction.atomic`` (async code entered it with ``DJANGO_ALLOW_ASYNC_UNSAFE``),
    without making that connection: Django keeps one per asyncio task (contextvars), and
    ``transaction.get_connection`` in a task that never used the database builds a
    ``DatabaseWrapper`` (with its cycles of a dozen objects, garbage for the collector
    once the task ends) only to answer no. Looks up ``using`` alone, as
    ``connections.all(initialized_only=True)`` looks up each alias (its
    ``hasattr(connections._connections, alias)``): one context-local lookup instead of one
    per configured database, each a raised ``AttributeError`` when absent (about half of
    this check's 20 µs per ``asend`` with two databases on a slow machine)."""
    held = getattr(connections, "_connections", None)
    if held is None:  # not Django's BaseConnectionHandler: its public way
        return any(c.alias == using and c.in_atomic_block for c in connections.all(initialized_only=True))
    connection = getattr(held, using, None)
    return connection is not None and bool(connection.in_atomic_block)


def _has_sync_caller() -> bool:
    """Whether this coroutine runs for a synchronous caller (``async_to_sync``): asgiref
    sets the executor of the thread waiting for it."""
    return getattr(AsyncToSync.executors, "current", None) is not None


async def _callers_atomic_block(using: str) -> bool:
    """Whether this coroutine runs for a synchronous caller (``async_to_sync``) whose
    thread is inside ``transaction.atomic`` on database ``using``. Only such a call pays
    for the question (one hop to that thread); a coroutine of an ASGI server's loop has
    no synchronous caller."""
    if not _has_sync_caller():
        return False

    def in_atomic() -> bool:
        return bool(transaction.get_connection(using).in_atomic_block)

    return await sync_to_async(in_atomic, thread_sensitive=True)()


async def aget(message_id: str) -> Message:
    """:func:`get` for ``async def`` code: the Redis read on this loop's ``redis.asyncio``
    client; the capture table (the ORM), when Redis does not have the message, in
    Django's thread for synchronous code.

    Raises:
        MessageNotFound, OutboxUnavailable: as :func:`get`.
    """
    from outbox.sending.capture import captured  # capture imports Django models: `import outbox.api` must not

    repository = await arepository()
    try:
        (message,) = await aget_many(repository, [message_id])
    except (RedisError, RedisClusterException) as exc:
        message = await sync_to_async(captured, thread_sensitive=True)(message_id)
        if message is None:
            raise OutboxUnavailable(
                f"Redis could not be reached to read message {message_id!r}: {exc}"
            ) from exc
        return message
    if message is None:
        message = await sync_to_async(captured, thread_sensitive=True)(message_id)
        if message is None:
            raise MessageNotFound(f"no message with id {message_id!r}")
    return message


async def arequeue(ids: str | Iterable[str]) -> actions.ActionResult:
    """:func:`requeue` for ``async def`` code. The bulk change and its operation signal
    (``messages_requeued``) run in Django's thread for synchronous code
    (``sync_to_async``), so receivers that use the ORM never run on the event loop."""
    return await sync_to_async(requeue, thread_sensitive=True)(ids)


async def acancel(ids: str | Iterable[str]) -> actions.ActionResult:
    """:func:`cancel` for ``async def`` code (run as :func:`arequeue` is)."""
    return await sync_to_async(cancel, thread_sensitive=True)(ids)


async def adelete(ids: str | Iterable[str]) -> actions.ActionResult:
    """:func:`delete` for ``async def`` code (run as :func:`arequeue` is)."""
    return await sync_to_async(delete, thread_sensitive=True)(ids)
