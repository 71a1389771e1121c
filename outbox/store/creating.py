"""The steps of :meth:`MessageRepository.create <outbox.store.messages.MessageStore.create>`,
I/O-free (:mod:`.steps`): driven by ``send()`` on the synchronous client and by
``asend()`` on ``redis.asyncio``, so both write the same way.

What is decided here: the scripts loaded before the first call and again after
``NOSCRIPT``; on a cluster, a call sent to its primary's own client and, when that
node says the slot map is out of date (``MOVED``, ``ASK``, ``TRYAGAIN``, a connection
error), sent once more through the cluster client, which follows redirects; with more
than one partition, the idempotency reservations (:mod:`.idempotency`), the destinations
registered, one call per partition (grouped per primary: a primary that cannot be
reached fails its own partitions only), the wake-up flags; with ``OUTBOX["DURABILITY"]``,
the write and its wait on one connection (:mod:`.durability`, run as a
:class:`~.steps.Blocking` step: the wait's rounds of redirects are that module's).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from outbox.exceptions import OutboxUnavailable
from outbox.records import Message, partition_of
from outbox.store.base import wake_flags_unavailable
from outbox.store.client.durability import Durability, commands_then_wait, write_then_wait
from outbox.store.client.outages import PARTITION_UNAVAILABLE, unknown_first
from outbox.store.created import Created, CreateResult, due_queues
from outbox.store.idempotency import Held, Reservations, away_from_home
from outbox.store.scripts import sha
from outbox.store.steps import Batch, Blocking, LoadScripts, Primaries, Steps

if TYPE_CHECKING:
    from outbox.store.client.thread_client import ThreadClients
    from outbox.store.keys import Keys


class MessageStore(Protocol):
    """What the steps use of :class:`~outbox.store.messages.MessageStore` (which imports
    this module): its key names and settings, and the pure builders of a create call."""

    keys: Keys
    scripts_loaded: bool
    registered: dict[str, float]
    idempotency_ttl: int
    wake_ttl_ms: int
    thread_clients: ThreadClients
    connection: Any

    def load_scripts(self) -> None: ...

    def unregistered(self, names: Iterable[str]) -> list[str]: ...

    def mark_registered(self, names: Iterable[str]) -> None: ...

    def create_call(
        self, messages: Sequence[Message], now: float, due_slack: float, repeat: bool = True
    ) -> tuple[str, list[Any], list[str]]: ...

    def parse_create(self, messages: Sequence[Message], reply: Any) -> CreateResult: ...


logger = logging.getLogger("outbox")

#: What a node's own client answers when this process's slot map is out of date: the
#: call is sent again through the cluster client (as :func:`.base.on_primary`).
STALE_ROUTE: tuple[type[Exception], ...] = (
    MovedError,
    AskError,
    TryAgainError,
    RedisConnectionError,
    ClusterDownError,
)


def evalsha(name: str, args: Sequence[Any], keys: Sequence[str]) -> tuple[Any, ...]:
    """The words of ``EVALSHA`` of ``lua/<name>.lua`` with ``keys`` and ``args``."""
    return ("EVALSHA", sha(name), len(keys), *keys, *args)


def script_steps(
    store: MessageStore, name: str, args: Sequence[Any], keys: Sequence[str], *, cluster: bool
) -> Steps[Any]:
    """One script call (a write), its reply; the scripts loaded first and after
    ``NOSCRIPT``; on a cluster sent to its primary, then through the cluster client when
    that node's answer is :data:`STALE_ROUTE` (the call is safe to run twice: every
    script is).

    Raises:
        redis.exceptions.RedisError: the call failed.
    """
    if not store.scripts_loaded:
        yield LoadScripts()
    command = evalsha(name, args, keys)
    for attempt in range(2):
        direct = cluster and attempt == 0
        try:
            (reply,) = yield Batch((command,), keys[0] if direct and keys else None, write=True)
        except STALE_ROUTE:
            if not direct:
                raise
            (reply,) = yield Batch((command,), None, write=True)
        if isinstance(reply, STALE_ROUTE) and direct:
            (reply,) = yield Batch((command,), None, write=True)
        if isinstance(reply, NoScriptError) and attempt == 0:
            yield LoadScripts()
            continue
        if isinstance(reply, Exception):
            raise reply
        return reply
    raise AssertionError("unreachable")


def create_steps(
    store: MessageStore,
    messages: Sequence[Message],
    now: float,
    due_slack: float,
    repeat: bool,
    durability: Durability | None,
    *,
    cluster: bool,
) -> Steps[CreateResult]:
    """The steps of :meth:`~outbox.store.messages.MessageStore.create` (which states what
    they do and raise)."""
    if not messages:
        return CreateResult([], [])
    if store.keys.partitioned:
        result: CreateResult = yield from partitioned_steps(
            store, messages, now, due_slack, repeat, durability, cluster=cluster
        )
        return result
    name, args, keys = store.create_call(messages, now, due_slack, repeat)
    # the script adds the destinations' names to their set with every call (an SADD of a
    # member already there, about 0.2 µs): a name Redis lost (a restart without
    # persistence, a failover to an empty replica) is listed, counted and purged again
    # from the next message on, not REGISTER_AGAIN seconds later (.base); so nothing is
    # marked registered here (only the partitioned steps read the marks)
    keys.append(store.keys.destinations)
    if durability is not None and durability.waits:
        reply, acknowledged = yield Blocking(partial(_create_then_wait, store, name, args, keys, durability))
        result = store.parse_create(messages, reply)
        result.acknowledged = acknowledged
    else:
        reply = yield from script_steps(store, name, args, keys, cluster=cluster)
        result = store.parse_create(messages, reply)
    return result


def _create_then_wait(
    store: MessageStore, name: str, args: Sequence[Any], keys: Sequence[str], durability: Durability
) -> tuple[Any, Any]:
    """The create script's call (``lua/<name>.lua``) and the ``DURABILITY`` wait, on this thread's connection
    (a function of its own: as a lambda in :func:`create_steps`, its names were cells
    made at every call of the steps, objects for the collector, per send)."""
    return store.thread_clients.run(
        lambda client: write_then_wait(store, client, name, args, keys, durability)
    )


#: One script call of the create steps (a write): the script's name, its ARGV, its KEYS.
WriteCall = tuple[str, Sequence[Any], Sequence[str]]


@dataclass(frozen=True, slots=True)
class Plan:
    """The messages of :func:`partitioned_steps` after :func:`settle_steps`.

    Attributes:
        messages: as given.
        work: as created (a message whose key names an id of its own partition under
            that id).
        settled: position -> its :class:`Created`, for those settled without a create.
        substituted: the positions so created under another id.
        parts: partition -> the positions of its create call, in order.
    """

    messages: Sequence[Message]
    work: Sequence[Message]
    settled: dict[int, Created]
    substituted: set[int]
    parts: dict[int, list[int]]

    def chunk(self, positions: Sequence[int]) -> list[Message]:
        """The messages of a create call (``positions``: one of :attr:`parts`)."""
        return [self.work[i] for i in positions]


def partitioned_steps(
    store: MessageStore,
    messages: Sequence[Message],
    now: float,
    due_slack: float,
    repeat: bool,
    durability: Durability | None,
    *,
    cluster: bool,
) -> Steps[CreateResult]:
    """The steps of :meth:`~outbox.store.messages.MessageStore.create_partitioned` (which
    states what they do and raise)."""
    settled, work, substituted = yield from settle_steps(store, messages)
    parts: dict[int, list[int]] = {}
    for i, m in enumerate(work):
        if i not in settled:
            parts.setdefault(partition_of(m.id), []).append(i)
    if not parts:
        return CreateResult([settled[i] for i in range(len(messages))], [])
    plan = Plan(messages, work, settled, substituted, parts)
    woken_before: list[str] = []  # queues flagged with a create that did not run
    yield from register_steps(store, {m.destination for m in messages})
    calls = create_calls(store, plan, now, due_slack, repeat)
    acknowledged = None
    replies: list[Any]
    if durability is not None and durability.waits:
        writes = [evalsha(name, args, keys) for name, args, keys in calls]
        replies, acknowledged = yield Blocking(
            lambda: store.thread_clients.run(
                lambda client: commands_then_wait(store, client, writes, durability)
            )
        )
    elif len(calls) == 1:  # one partition (every send()): one round trip where it can be
        done = yield from one_partition_steps(store, plan, calls[0], now, due_slack, cluster=cluster)
        if isinstance(done, CreateResult):
            return done
        woken_before, replies = done
    else:
        replies = yield from scripts_steps(store, calls, cluster=cluster)
    results, woken, errors = parse_replies(store, plan, replies)
    created = yield from after_create_steps(store, plan, results)
    woken_now = yield from wake_flag_steps(
        store, [q for q in woken if q not in woken_before], now, cluster=cluster
    )
    return CreateResult(created, woken_before + woken_now, acknowledged, errors)


def create_calls(
    store: MessageStore, plan: Plan, now: float, due_slack: float, repeat: bool
) -> list[WriteCall]:
    """The ``lua/create.lua`` call of each partition of ``plan``, in its order."""
    calls: list[WriteCall] = []
    for positions in plan.parts.values():
        chunk = plan.chunk(positions)
        # a message sent under the id its key names may be stored already: check ids
        again = repeat or any(i in plan.substituted for i in positions)
        calls.append(store.create_call(chunk, now, due_slack, again))
    return calls


def one_partition_steps(
    store: MessageStore, plan: Plan, call: WriteCall, now: float, due_slack: float, *, cluster: bool
) -> Steps[CreateResult | tuple[list[str], list[Any]]]:
    """The create of :func:`partitioned_steps` when its messages are in one partition
    (every ``send()``): with the wake-up flags of the queues it makes due in one round
    trip where they are on one server (:func:`create_and_flag_steps`).

    Returns:
        The :class:`CreateResult` when that create ran; else (the queues flagged by a
        pipeline whose create did not run, the reply of the create sent once more by
        itself), for :func:`partitioned_steps` to finish as with several calls.
    """
    name, args, keys = call
    chunk = plan.chunk(next(iter(plan.parts.values())))
    due = due_queues(chunk, now + due_slack)
    flagged = yield from create_and_flag_steps(store, name, args, keys, due, now, cluster=cluster)
    if flagged is not None and not isinstance(flagged[0], Exception):
        reply, set_flags = flagged
        result = store.parse_create(chunk, reply)
        # the flags of the queues made due were set with the create: a job for each
        # one this call set (a duplicate's too: that job finds nothing, harmlessly)
        rest = yield from wake_flag_steps(
            store, [q for q in result.woken if q not in due], now, cluster=cluster
        )
        created = yield from after_create_steps(store, plan, [result])
        return CreateResult(created, set_flags + rest)
    woken_before = [] if flagged is None else flagged[1]  # the create did not run there: once more
    return woken_before, [(yield from script_steps(store, name, args, keys, cluster=cluster))]


def parse_replies(
    store: MessageStore, plan: Plan, replies: Sequence[Any]
) -> tuple[list[CreateResult | Exception], list[str], dict[int, Exception]]:
    """The create calls' replies (or errors), one per partition of ``plan``: each
    partition's :class:`CreateResult` or error, the queues woken, the errors by partition.

    Raises:
        redis.exceptions.RedisError: a reply's error that is not an outage of its
            partition, or every call failed (a write that may have run first: raised, it
            says the outcome is unknown).
    """
    failed = unknown_first(r for r in replies if isinstance(r, Exception))
    for reply in failed:
        if not isinstance(reply, PARTITION_UNAVAILABLE) or len(failed) == len(replies):
            raise reply  # a bug, not an outage; or nothing is known to be written
    results: list[CreateResult | Exception] = []
    woken: list[str] = []
    errors: dict[int, Exception] = {}
    for (part, positions), reply in zip(plan.parts.items(), replies, strict=True):
        if isinstance(reply, Exception):
            errors[part] = reply
            results.append(reply)
            continue
        parsed = store.parse_create(plan.chunk(positions), reply)
        results.append(parsed)
        woken += [q for q in parsed.woken if q not in woken]
    return results, woken, errors


def scripts_steps(store: MessageStore, calls: Sequence[WriteCall], *, cluster: bool) -> Steps[list[Any]]:
    """Several script calls (writes, one per partition), each reply or error in order, as
    :meth:`~.base.RepositoryBase.run_scripts` with ``errors=True``: one pipeline (on a
    cluster, one per primary, so that a primary that cannot be reached fails its own
    calls only); a call answered ``MOVED``/``ASK``/``TRYAGAIN`` or ``NOSCRIPT`` did not
    run, and is sent again alone (:func:`script_steps`)."""
    if not store.scripts_loaded:
        yield LoadScripts()
    for name, _args, keys in calls:
        if cluster and not keys:
            raise RedisClusterException(f"script {name!r} is called without KEYS")
    commands = [evalsha(name, args, keys) for name, args, keys in calls]
    replies: list[Any] = [None] * len(calls)
    groups: dict[str, list[int]] = {}
    if cluster:
        try:
            owners = yield Primaries(tuple(keys[0] for _, _, keys in calls))
        except PARTITION_UNAVAILABLE as exc:
            return [exc] * len(calls)
        for i, owner in enumerate(owners):
            groups.setdefault(owner, []).append(i)
    else:
        groups[""] = list(range(len(calls)))
    for positions in groups.values():
        route = calls[positions[0]][2][0] if cluster else None
        try:
            got = yield Batch(tuple(commands[i] for i in positions), route, write=True)
        except PARTITION_UNAVAILABLE as exc:
            got = [exc] * len(positions)
        for i, reply in zip(positions, got, strict=True):
            replies[i] = reply
    for i, reply in enumerate(replies):
        if isinstance(reply, (MovedError, AskError, TryAgainError, NoScriptError)):
            name, args, keys = calls[i]
            try:
                replies[i] = yield from script_steps(store, name, args, keys, cluster=cluster)
            except (RedisError, RedisClusterException) as exc:
                replies[i] = exc
    return replies


def settle_steps(
    store: MessageStore, messages: Sequence[Message]
) -> Steps[tuple[dict[int, Created], list[Message], set[int]]]:
    """The step before the create calls of :func:`partitioned_steps`: the home records
    of the ordered messages whose idempotency record lives in another partition
    (:mod:`.idempotency`, which states the rule), one round trip when there are any.

    Returns:
        (the positions settled without a create: ``"conflict"`` and the others of its
        partition ``"refused"``, as one create call refuses; ``"duplicate"`` of a
        stored message of another partition), the messages to create (a message whose
        key names an id of its own partition is created under that id), and the
        positions so substituted.

    Raises:
        OutboxUnavailable: a key names a message of another partition that is not
            stored (its send has not finished, or failed after its reservation).
        redis.exceptions.RedisError: the reservation's round trip failed (nothing
            was created).
    """
    work = list(messages)
    settled: dict[int, Created] = {}
    substituted: set[int] = set()
    found = yield from reserve_steps(store, messages)
    if not found.held:
        return settled, work, substituted
    elsewhere = [
        i
        for i, held in found.held.items()
        if held.fingerprint == messages[i].fingerprint()
        and partition_of(held.id) != partition_of(messages[i].id)
    ]
    stored: list[Any] = []
    if elsewhere:
        stored = yield Batch(tuple(("EXISTS", store.keys.message(found.held[i].id)) for i in elsewhere))
    for i, present in zip(elsewhere, stored, strict=True):
        if isinstance(present, Exception):
            raise present
        if not present:
            m, held_id = messages[i], found.held[i].id
            raise OutboxUnavailable(
                f"idempotency_key {m.idempotency_key!r} of destination {m.destination!r} names message "
                f"{held_id}, which is not stored: the send() that reserved the key (with another ordering "
                "key) has not finished, or failed after reserving it. Nothing was stored; send again later."
            )
        settled[i] = Created(messages[i].id, found.held[i].id, "duplicate")
    for i, held in found.held.items():
        m = messages[i]
        if held.fingerprint != m.fingerprint():
            settled[i] = Created(m.id, held.id, "conflict")
            for j, other in enumerate(messages):  # one create call refuses its partition whole
                if j not in settled and partition_of(other.id) == partition_of(m.id):
                    settled[j] = Created(other.id, other.id, "refused")
        elif i not in settled:
            work[i] = replace(m, id=held.id)
            substituted.add(i)
    substituted -= set(settled)
    return settled, work, substituted


def reserve_steps(store: MessageStore, messages: Sequence[Message]) -> Steps[Reservations]:
    """Write the home record (``<id>|<fingerprint>``, ``SET NX`` with ``EX`` the store's
    ``idempotency_ttl``; no expiry when it is 0) of each message
    :func:`~.idempotency.away_from_home`, and read what each home holds, in one
    :class:`~.steps.Batch` (one round trip on one server; on a cluster the cluster client
    routes each command). A record that names the message itself (a push repeated, or a send again
    under its id) is its own.

    Raises:
        redis.exceptions.RedisError: the round trip failed (some records may be written:
            each names its message's id, which a later send under the key completes).
    """
    away = [i for i, m in enumerate(messages) if away_from_home(store.keys, m)]
    found = Reservations()
    if not away:
        return found
    commands: list[tuple[Any, ...]] = []
    for i in away:
        m = messages[i]
        home = store.keys.idempotency_home(m.destination, m.idempotency_key or "")
        value = f"{m.id}|{m.fingerprint()}"
        ttl = store.idempotency_ttl
        commands.append(("SET", home, value, "NX", "EX", ttl) if ttl > 0 else ("SET", home, value, "NX"))
        commands.append(("GET", home))
    replies = yield Batch(tuple(commands), write=True)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    for n, i in enumerate(away):
        value = replies[2 * n + 1]
        held_id, _, fingerprint = (value.decode() if value else f"{messages[i].id}|").partition("|")
        if held_id == messages[i].id:
            found.mine.append(i)
        else:
            found.held[i] = Held(held_id, fingerprint)
    return found


def after_create_steps(
    store: MessageStore, plan: Plan, results: Sequence[CreateResult | Exception]
) -> Steps[list[Created]]:
    """One :class:`Created` per message of :func:`partitioned_steps`, in order: the
    settled ones, the results of the create calls (one per partition of ``plan``;
    ``"unstored"`` where a call failed),
    a substituted message as a ``"duplicate"`` of the id it was created under; and the
    home records of the messages whose create found an older version's record in
    their partition pointed at the message that stands (:func:`.idempotency.point_home`)."""
    messages, work, substituted = plan.messages, plan.work, plan.substituted
    created = [plan.settled.get(i, Created(m.id, m.id, "new")) for i, m in enumerate(messages)]
    repoint: list[tuple[Message, str]] = []
    for positions, result in zip(plan.parts.values(), results, strict=True):
        for n, i in enumerate(positions):
            c = (
                Created(work[i].id, work[i].id, "unstored")
                if isinstance(result, Exception)
                else result.created[n]
            )
            if i in substituted and c.code in ("new", "exists"):
                c = Created(messages[i].id, work[i].id, "duplicate")
            elif c.code == "duplicate" and away_from_home(store.keys, work[i]):
                repoint.append((work[i], c.standing_id))
            created[i] = c
    if repoint:
        commands = tuple(
            (
                "SET",
                store.keys.idempotency_home(m.destination, m.idempotency_key or ""),
                f"{standing}|{m.fingerprint()}",
                "XX",
                "KEEPTTL",
            )
            for m, standing in repoint
        )
        try:
            replies = yield Batch(commands, write=True)
            failed = [r for r in replies if isinstance(r, Exception)]
            if failed:
                raise failed[0]
        except (RedisError, RedisClusterException):  # the messages stand; the record expires in time
            logger.warning("outbox: could not point %d idempotency record(s) at their message", len(repoint))
    return created


def register_steps(store: MessageStore, names: set[str]) -> Steps[None]:
    """With more than one partition: add ``names`` to the destinations set (``SADD``, a key
    of its own slot), each at most once per :data:`~.base.REGISTER_AGAIN` seconds per
    process, before their first messages are written, with the partition count the first
    time (:attr:`~.keys.Keys.partitions_record`, for check outbox.E011)."""
    new = store.unregistered(names)
    if new:
        replies = yield Batch(
            (
                ("SADD", store.keys.destinations, *new),
                ("SET", store.keys.partitions_record, store.keys.partitions, "NX"),
            ),
            write=True,
        )
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        store.mark_registered(new)


def create_and_flag_steps(
    store: MessageStore,
    name: str,
    args: Sequence[Any],
    keys: Sequence[str],
    queues: Sequence[str],
    now: float,
    *,
    cluster: bool,
) -> Steps[tuple[Any, list[str]] | None]:
    """One partition's create and the wake-up flags (``SET NX PX``) of ``queues`` (those
    its messages make due) in one pipeline, the create first, when they are on one
    server: always with one server, on a cluster when the flags' slot (``{g}``) is on
    the partition's primary. With more than one partition the flags are keys across
    the deployment, which the create script may not touch: without this, every
    ``send()`` made a second round trip for its flag.

    Returns:
        None when there is nothing to flag, or the flags are on another primary (the
        caller then writes the flags after the create: :func:`wake_flag_steps`);
        else (the create's reply, or the error it met: it did not run then; the
        queues whose flag this call set, whose wake-up jobs the caller enqueues).

    Raises:
        redis.exceptions.RedisError: the pipeline could not be sent or read (nothing
            is known of what it did; as a failed create).
    """
    if not queues:
        return None
    flags = [store.keys.wake(q) for q in queues]
    if cluster:
        owners = yield Primaries((keys[0], *flags))
        if len(set(owners)) > 1:
            return None
    if not store.scripts_loaded:
        yield LoadScripts()
    commands = (
        evalsha(name, args, keys),
        *(("SET", flag, repr(now), "NX", "PX", store.wake_ttl_ms) for flag in flags),
    )
    try:
        reply, *set_replies = yield Batch(commands, keys[0] if cluster else None, write=True)
    except STALE_ROUTE:
        if not cluster:
            raise
        return None  # a primary gone: the caller's own path asks the cluster client
    if cluster and isinstance(reply, STALE_ROUTE):
        return None
    set_flags = [q for q, was_set in zip(queues, set_replies, strict=True) if was_set is True]
    if isinstance(reply, NoScriptError):
        yield LoadScripts()
    return reply, set_flags


def routed_steps(commands: tuple[tuple[Any, ...], ...], key: str, *, cluster: bool) -> Steps[list[Any]]:
    """``commands`` (writes, all of ``key``'s slot, safe to run twice) on the primary of
    ``key``'s slot, then through the cluster client when that node's answer is
    :data:`STALE_ROUTE` (as :func:`.base.on_primary`); on one server, on its client."""
    if not cluster:
        replies: list[Any] = yield Batch(commands, write=True)
        return replies
    try:
        replies = yield Batch(commands, key, write=True)
    except STALE_ROUTE:
        replies = yield Batch(commands, None, write=True)
        return replies
    if any(isinstance(reply, STALE_ROUTE) for reply in replies):
        replies = yield Batch(commands, None, write=True)
    return replies


def wake_flag_steps(
    store: MessageStore, queues: Sequence[str], now: float, *, cluster: bool
) -> Steps[list[str]]:
    """The steps of :meth:`~.base.RepositoryBase.raise_wake_flags` (which states what they
    do and return)."""
    if not queues or not store.keys.partitioned:
        return list(queues)
    commands = tuple(("SET", store.keys.wake(q), repr(now), "NX", "PX", store.wake_ttl_ms) for q in queues)
    try:
        replies = yield from routed_steps(commands, store.keys.wake(queues[0]), cluster=cluster)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
    except PARTITION_UNAVAILABLE as exc:
        return wake_flags_unavailable(queues, exc)
    return [q for q, was_set in zip(queues, replies, strict=True) if was_set]
