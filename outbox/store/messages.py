"""Messages in Redis: their records written and changed by the Lua scripts (create,
claim, compare-and-set transitions, bulk changes, release, delete, wake checks) and
read back (records, attempts, idempotency keys).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

from outbox.exceptions import MessageNotFound
from outbox.records import Attempt, Message, Status, partition_of
from outbox.store.base import RepositoryBase, ScriptCall, first_of, queue_first
from outbox.store.client.durability import Durability
from outbox.store.codec import (
    INLINE_ATTEMPT_FIELDS,
    attempt_from_inline,
    attempt_from_json,
    attempt_json,
    message_from_flat,
    message_from_redis,
    message_value,
    resend_fields,
)
from outbox.store.created import Created, CreateResult, create_groups
from outbox.store.creating import create_steps, partitioned_steps
from outbox.store.endpoint_versions import AdminState
from outbox.store.keys import Keys
from outbox.store.scripts import field_names, named
from outbox.store.steps import drive

# The Lua scripts' replies (lua/*.lua, each documented in its header), as parsed here:
# Redis arrays arrive as lists, typed as the tuples they are unpacked as; Lua false as None.
#: create.lua: [number of queues woken, their names..., then (position, standing id,
#: code) for each message not written as new].
CreateReply = list[Any]
#: claim.lua: (message record ([id, string or a hash's HGETALL]: lua/lib/message.lua),
#: resend HGETALL, ... per claimed message; next due score or None; messages a limit
#: rescheduled; destinations skipped at their cap; next due score of the quarantine index or None;
#: payload records, flat; and from claim.lua, the endpoints' states its gate read, flat:
#: :func:`parse_states`).
ClaimReply = (
    tuple[list[list[Any]], bytes | None, int, list[bytes], bytes | None, list[Any]]
    | tuple[list[list[Any]], bytes | None, int, list[bytes], bytes | None, list[Any], list[bytes]]
)


def parse_states(flat: Sequence[bytes]) -> dict[str, AdminState]:
    """The endpoints' states a claim's gate read (``lua/lib/gate.lua`` ``gate_states``:
    flat, per endpoint its name, ``admin``, ``admin_reason``, ``limits``, "" for a field
    absent) as destination name -> ``(admin state, its reason, limits field or None)``,
    the shape of :func:`outbox.store.endpoint_versions.admin_state`."""
    found = {}
    for i in range(0, len(flat), 4):
        name, admin, reason, limits = (v.decode() for v in flat[i : i + 4])
        found[name] = (admin or "active", reason, limits or None)
    return found


#: transition.lua, per change: (applied 0|1, status after, queue of the key's next message
#: promoted to its head or b""[, message record, resend HGETALL]).
TransitionRow = tuple[int, bytes, bytes] | tuple[int, bytes, bytes, list[Any], list[bytes]]
#: bulk.lua: (applied 0|1 per id, queues woken); release.lua: (ids released, queues woken).
BulkReply = tuple[list[int], list[bytes]]
ReleaseReply = tuple[list[bytes], list[bytes], list[bytes]]

#: ``lua/create.lua``'s arguments, by position (its header says why not by name): first
#: these, then :data:`CREATE_GROUP` per group of messages, then :data:`CREATE_FIELDS` and
#: the resend pairs per message (:meth:`MessageRepository.create_args` sends them).
CREATE_HEADER = ("idem_ttl", "wake_ttl_ms", "now", "slack", "repeat", "n", "groups", "parts")
#: The arguments of each group of messages of ``lua/create.lua`` (:func:`create_groups`).
CREATE_GROUP = ("status", "dest", "queue")
#: The arguments of each message of ``lua/create.lua``, before its resend pairs.
CREATE_FIELDS = ("id", "fp", "group", "score", "created", "record", "ordered", "n_resend")
#: Resend fields that ``lua/create.lua`` writes from the arguments before them.
_CREATE_WRITES = ("status", "destination", "queue", "next_attempt_at")
#: ``lua/create_one.lua``'s arguments, by position, before the resend pairs
#: (:meth:`MessageStore.create_call` sends them).
CREATE_ONE = ("status", "dest", "queue", "id", "score", "created", "record", "wake", "wake_ttl_ms")

logger = logging.getLogger(__name__)


def create_scores(m: Message) -> tuple[str, str]:
    """A new message's status score (its ``next_attempt_at``, else its ``created_at``) and
    its ``created_at``, as the create scripts get them (``repr``: every digit)."""
    return repr(m.next_attempt_at if m.next_attempt_at is not None else m.created_at), repr(m.created_at)


def resend_rest(m: Message, created: str) -> list[str]:
    """The resend record's field/value pairs, flat, that the create scripts do not write
    themselves from their other arguments (status, destination, queue, next_attempt_at;
    updated_at when it is ``created``)."""
    rfields = resend_fields(m)
    for name in _CREATE_WRITES:
        rfields.pop(name, None)
    if rfields.get("updated_at") == created:  # the script writes created_at there
        del rfields["updated_at"]
    return [x for pair in rfields.items() for x in pair]


def payloads_of(messages: Sequence[Message]) -> dict[str, list[int]]:
    """The published events' payloads among ``messages`` (of one create call, so of one
    partition): event id -> the positions (1-based) of the messages referencing it, in
    order of first appearance. Empty for messages of ``send()``."""
    refs: dict[str, list[int]] = {}
    for position, m in enumerate(messages, 1):
        if m.payload_ref:
            refs.setdefault(m.payload_ref, []).append(position)
    return refs


def payload_args(messages: Sequence[Message]) -> list[Any]:
    """The payload section of ``lua/create.lua``'s ARGV, after the messages (see its
    header): nothing for messages of ``send()`` (the script reads none), else the number
    of payloads, then per payload its content type, body, and the positions of the
    messages referencing it. Its KEYS: the payload records, in the same order
    (:meth:`MessageStore.create_keys`)."""
    refs = payloads_of(messages)
    if not refs:
        return []
    first = {ref: messages[positions[0] - 1] for ref, positions in refs.items()}
    args: list[Any] = [len(refs)]
    for ref, positions in refs.items():
        args += [first[ref].content_type, first[ref].body, len(positions), *positions]
    return args


def payloads_wanted(keys: Keys, messages: Sequence[Message | None]) -> dict[str, list[Message]]:
    """The payload records (key -> the messages that need its body) of the deliveries of a
    published event among ``messages`` read without their body
    (:meth:`MessageStore.attach_payloads`)."""
    wanted: dict[str, list[Message]] = {}
    for m in messages:
        if m is not None and m.payload_ref and not m.body:
            wanted.setdefault(keys.of(m.id).payload(m.payload_ref), []).append(m)
    return wanted


def set_payloads(wanted: dict[str, list[Message]], bodies: Sequence[bytes | None]) -> None:
    """Each body read (``HGET <record> body``, in the order of ``wanted``) given to the
    messages that reference its record; a record that is gone is logged, its messages'
    body left b"" (:meth:`MessageStore.attach_payloads`)."""
    for (key, found), body in zip(wanted.items(), bodies, strict=True):
        if body is None:
            logger.error(
                "outbox: the payload record %s of %d message(s) (%s) is gone: the event's payload was purged",
                key,
                len(found),
                found[0].id,
            )
            continue
        for m in found:
            m.body = body


#: The fields of each change of ``lua/transition.lua``, in the order :meth:`Change.args` sends them.
CHANGE_FIELDS = (
    "id",
    "from",
    "to",
    "score",
    "lease",
    "due_by",
    "attempt",
    "event",
    "stat",
    "load",
    "also",
    "park",
    "oskip",
    "okey",
    "dest",
    "n_set",
    "n_unset",
    "n_inline",
)


@dataclass
class Change:
    """One compare-and-set status change for :meth:`MessageRepository.transition`.

    Attributes:
        id: the message id.
        from_statuses: statuses the message must be in for the change to apply.
        to: the status after the change.
        score: the message's score in the new status index (epoch seconds).
        set: resend-record fields to write (values are strings).
        unset: resend-record fields to delete.
        lease: if given, the record's current lease must equal it.
        due_by: if given, next_attempt_at must be <= this epoch time (seconds).
        attempt: an attempt record to push on the capped attempts list.
        inline: the attempt as resend-record fields (a success:
            :func:`~outbox.store.codec.inline_fields`), written instead of pushing
            ``attempt`` when the record holds no inline success yet.
        event: a JSON event to publish on the events channel.
        stats_outcome: an outcome name counted in the per-minute statistics.
        return_records: return both records when applied (saves a round trip on claim).
        exhausted_event: a second JSON event published with the change
            (``message.exhausted``).
        park: what to write instead when the destination holds its messages (paused,
            disabled, circuit breaker not closed; see ``lua/transition.lua``): a dict with
            ``to``, ``score``, ``set``, ``unset``, ``attempt`` (JSON) and ``event``.
        destination, queue: the message's, when the caller knows them (an outcome):
            with partitions, the indexes the change touches are then declared
            (:meth:`MessageStore.transition_keys`). The script reads the record's own.
        ordering_key: the message's, when the caller knows it: its key's queue and state
            and its destination's ``waiting`` index and blocked keys are declared too.
        skip: a dead letter of an ordering key leaves the key (policy ``"skip"``) instead
            of blocking it (``"block"``, the default; ``lua/lib/ordering.lua``).
    """

    id: str
    from_statuses: Sequence[str]
    to: str
    score: float
    set: dict[str, str] = field(default_factory=dict)
    unset: Sequence[str] = ()
    lease: str | None = None
    due_by: float | None = None
    attempt: Attempt | None = None
    inline: dict[str, str] | None = None
    event: str | None = None
    stats_outcome: str | None = None
    return_records: bool = False
    exhausted_event: str | None = None
    park: dict[str, Any] | None = None
    destination: str = ""
    queue: str = ""
    ordering_key: str = ""
    skip: bool = False

    def args(self) -> list[Any]:
        """This change as ``lua/transition.lua`` reads it (named by :data:`CHANGE_FIELDS`):
        15 fixed values (id, from
        statuses joined by commas, to, score, lease, due_by, attempt JSON, event JSON,
        stat, load "1", also, park JSON, oskip "1", okey and dest (the ordering key and
        destination of an ordered message); "" where absent), the number of ``set`` pairs, of
        ``unset`` fields and of ``inline`` pairs, then the pairs, the fields and the
        inline pairs. Flat strings, not one JSON document: the script passes them to
        ``HSET``/``HDEL`` as ranges of its arguments and decodes nothing but a ``park``
        alternative (which gives all of its fields), and only when it applies."""
        args: list[Any] = [
            self.id,
            ",".join(self.from_statuses),
            self.to,
            repr(self.score),
            "" if self.lease is None else self.lease,
            "" if self.due_by is None else repr(self.due_by),
            "" if self.attempt is None else attempt_json(self.attempt),
            self.event or "",
            self.stats_outcome or "",
            "1" if self.return_records else "",
            self.exhausted_event or "",
            "" if self.park is None else json.dumps(self.park, separators=(",", ":")),
            "1" if self.skip else "",
            self.ordering_key if self.destination else "",
            self.destination if self.ordering_key else "",
            len(self.set),
            len(self.unset),
            len(self.inline or ()),
        ]
        for pair in self.set.items():
            args += pair
        args += self.unset
        for pair in (self.inline or {}).items():
            args += pair
        return args


@dataclass
class ChangeResult:
    """What :meth:`MessageRepository.transition` did with one :class:`Change`.

    Attributes:
        id: the message id.
        applied: True if the compare-and-set succeeded.
        status: the status after the call ("" when no such message exists).
        message: both records, when the change asked to ``load`` and was applied.
        parked: True when the change applied as its ``park`` alternative (the
            destination was held: the message waits, no retry charged), now or earlier.
        earlier: True when the change did not apply now because an earlier call of the
            same change had applied it (its reply lost, or a later step of the caller's
            round trip failed): the record holds its attempt already (``applied`` is
            False; only a change with an attempt is recognised so).
        promoted: the queue of the next message of the message's ordering key when this
            change made that message the key's head (now ``pending`` in that queue's due
            index), else None. It may be another queue (priority) than the message's:
            the caller wakes it (:func:`outbox.delivery.outcomes.announce`).
        unwritten: with more than one partition, why the change was not written now
            ("" when it was, or its compare-and-set failed): ``"destination"`` (its
            outcome's health write met an outage in the destination's home slot, so the
            change was not sent: health goes first) or ``"partition"`` (its partition's
            transition met an outage: a slot moving, a primary away). Nothing of it is
            known to have applied; writing the same change again is safe (``earlier``).
    """

    id: str
    applied: bool
    status: str
    message: Message | None = None
    parked: bool = False
    earlier: bool = False
    promoted: str | None = None
    unwritten: str = ""


@dataclass
class Claim:
    """The reply of :meth:`MessageRepository.claim`.

    Attributes:
        messages: the messages claimed (status ``sending``, this claim's lease), with both records.
        next_due: epoch seconds when the earliest message left in the queue's due index
            is due, or None when the index is empty.
        rescheduled: how many messages the claim rescheduled because their destination
            was over a limit (rate, concurrency, ``Retry-After``): due again soon.
        events: destination events (JSON strings, see ``lua/health.lua``) caused by the
            outcomes written in the same round trip (:meth:`MessageRepository.outcomes_and_claim`).
        capped: destinations whose due messages the claim skipped because their cap
            (``caps``) was reached: they stay due at the head of the queue.
        next_suspect: epoch seconds when the earliest message of the queue's quarantine
            index is due (a suspect, attempted alone: ``quarantine=True``), or None.
        error: with more than one partition, the outage the partition's pick or claim met
            (:data:`.outages.PARTITION_UNAVAILABLE`: a slot moving, a primary away), when
            it could not be claimed from now (its messages stay due); None otherwise.
        states: the state in Redis of each endpoint the claim's gate read (taken, parked
            or held): name -> ``(admin state, its reason, limits field or None)``
            (:func:`parse_states`), so the worker checks it against the endpoint's row
            with no read of its own (:meth:`outbox.destinations.config.EndpointCache.preload`).
    """

    messages: list[Message]
    next_due: float | None
    rescheduled: int = 0
    events: list[str] = field(default_factory=list)
    capped: list[str] = field(default_factory=list)
    next_suspect: float | None = None
    error: Exception | None = None
    states: dict[str, AdminState] = field(default_factory=dict)

    @property
    def unavailable(self) -> bool:
        """True when the partition could not be claimed from now (see ``error``)."""
        return self.error is not None


@dataclass(frozen=True)
class ClaimOptions:
    """What :meth:`MessageRepository.claim` claims, beside its queue, time and partition.

    Attributes:
        lease: the claim's lease token.
        deadline: epoch seconds when the lease ends (the score in the sending index).
        limit: messages claimed at most.
        caps: destination -> messages of it claimed at most (None: no caps).
        due_slack: seconds ahead of now a message counts as due.
        scan: due entries looked at (None: ``limit * 2 + 8``).
        limits: JSON of the destinations' limits
            (:func:`outbox.destinations.config.limits_json`).
        quarantine: claim from the quarantine index (a suspect, alone).
    """

    lease: str
    deadline: float
    limit: int
    caps: dict[str, int] | None = None
    due_slack: float = 0.0
    scan: int | None = None
    limits: str = "{}"
    quarantine: bool = False


@dataclass(frozen=True)
class BulkChange:
    """The compare-and-set :meth:`MessageRepository.bulk_transition` applies to each of
    its messages.

    Attributes:
        action: the event name, e.g. ``"requeued"``.
        from_statuses: statuses a message must be in for the change to apply.
        to: the status after the change.
        set: other resend-record fields to write; unset: fields to delete.
    """

    action: str
    from_statuses: Sequence[str]
    to: str
    set: Mapping[str, str] | None = None
    unset: Sequence[str] = ()


@dataclass
class BulkResult:
    """The reply of :meth:`MessageRepository.bulk_transition`: the ids changed and the
    queues whose wake-up flag the call set; with more than one partition, the error each
    partition whose call failed met, by partition number (its messages unchanged)."""

    applied: list[str]
    woken: list[str]
    errors: dict[int, Exception] = field(default_factory=dict)
    #: A requeue's ids refused because their event's payload record is gone (purged).
    purged: list[str] = field(default_factory=list)


def with_holding(args: list[Any], holding: set[str]) -> list[Any]:
    """``transition.lua``'s ARGV with ``holding`` (the destinations that hold their
    messages, a JSON list) added to its named inputs: with more than one partition the
    script cannot read the destinations' state hashes (other slots)."""
    count = int(args[0])
    extra = ["holding", json.dumps(sorted(holding))]
    return [count + 1, *args[1 : 1 + 2 * count], *extra, *args[1 + 2 * count :]]


class MessageStore(RepositoryBase):
    """The messages part of :class:`~outbox.store.repository.MessageRepository`."""

    def create_args(
        self,
        messages: Sequence[Message],
        now: float,
        due_slack: float,
        repeat: bool = True,
        groups: dict[tuple[str, str, str], int] | None = None,
    ) -> list[Any]:
        """ARGV of ``lua/create.lua`` for ``messages`` (see :meth:`create`; its KEYS:
        :meth:`create_keys`; ``groups``: :func:`create_groups` of ``messages``, computed
        here when not given)."""
        groups = create_groups(messages) if groups is None else groups
        args: list[Any] = [
            self.idempotency_ttl,
            self.wake_ttl_ms,
            repr(now),
            repr(due_slack),
            "1" if repeat else "0",
            len(messages),
            len(groups),
            self.keys.partitions,
        ]
        for group in groups:  # (status, destination, queue): CREATE_GROUP
            args += group
        for m in messages:
            score, created = create_scores(m)
            rest = resend_rest(m, created)
            args += (
                m.id,
                m.fingerprint() if m.idempotency_key else "",
                groups[(m.status, m.destination, m.queue)],
                score,
                created,
                message_value(m),
                "1" if m.ordering_key else "",
                len(rest) // 2,
                *rest,
            )
        return args + payload_args(messages)

    def create_call(
        self, messages: Sequence[Message], now: float, due_slack: float, repeat: bool = True
    ) -> tuple[str, list[Any], list[str]]:
        """The script call that creates ``messages`` (one partition's; see :meth:`create`):
        ``(script name, ARGV, KEYS)``. One message without an idempotency key, an ordering
        key or a published event's payload (every plain ``send()``) goes to
        ``lua/create_one.lua``, which writes it as ``lua/create.lua`` would with a third
        fewer arguments and none of the Lua that other calls need; any other call to
        ``lua/create.lua`` (:meth:`create_args`, :meth:`create_keys`). ``repeat`` does not
        matter to the first: its ``SET NX`` of the record is the existence check."""
        if len(messages) == 1:
            m = messages[0]
            if not (m.idempotency_key or m.ordering_key or m.payload_ref):
                return "create_one", *self.create_one(m, now, due_slack)
        groups = create_groups(messages)
        return (
            "create",
            self.create_args(messages, now, due_slack, repeat, groups),
            self.create_keys(messages, groups),
        )

    def create_one(self, m: Message, now: float, due_slack: float) -> tuple[list[Any], list[str]]:
        """ARGV (:data:`CREATE_ONE`, then the resend pairs) and KEYS of
        ``lua/create_one.lua`` for the plain message ``m`` (see :meth:`create_call`)."""
        score, created = create_scores(m)
        due = float(score) <= now + due_slack  # as create.lua's score <= now + slack
        shared = not self.keys.partitioned
        part = self.keys.of(m.id)
        keys = [
            self.keys.message(m.id),
            self.keys.resend(m.id),
            part.status(m.status, m.destination),
            part.due(m.queue),
            part.created(m.destination),
        ]
        if shared:
            keys.append(self.keys.wake(m.queue))
        args = [
            m.status,
            m.destination,
            m.queue,
            m.id,
            score,
            created,
            message_value(m),
            repr(now) if due else "",
            self.wake_ttl_ms if shared else "",
            *resend_rest(m, created),
        ]
        return args, keys

    def create_keys(
        self, messages: Sequence[Message], groups: dict[tuple[str, str, str], int] | None = None
    ) -> list[str]:
        """KEYS of ``lua/create.lua`` for ``messages``: per group of messages with one
        (status, destination, queue) (:func:`create_groups`), its status index, due index,
        created index and wake-up flag, each once; then per message its message and resend
        records, if it has one its idempotency key, and if it has an ordering key that
        key's queue and state, its destination's ``waiting`` index and the key's log (see
        ``lua/lib/ordering.lua``); then its events' payload records (:meth:`create` may
        append the destinations set). (A key per message for the indexes it shares with
        the others of its group cost send_many(100) a fifth of its speed: each argument
        costs Redis and the client.)"""
        # every message of one call is in one partition (:meth:`create` splits a call);
        # with more than one, the keys across the deployment are left out (see create.lua)
        part = self.keys.of(messages[0].id) if messages else self.keys
        shared = not self.keys.partitioned
        keys: list[str] = []
        for status, destination, queue in create_groups(messages) if groups is None else groups:
            keys += [part.status(status, destination), part.due(queue), part.created(destination)]
            if shared:
                keys.append(self.keys.wake(queue))
        for m in messages:
            keys += [self.keys.message(m.id), self.keys.resend(m.id)]
            if m.idempotency_key:
                keys.append(part.idempotency(m.destination, m.idempotency_key))
            if m.ordering_key:
                keys += [
                    part.order(m.destination, m.ordering_key),
                    part.order_state(m.destination, m.ordering_key),
                    part.status(Status.WAITING.value, m.destination),
                    part.order_log(m.destination, m.ordering_key),
                ]
        return keys + [part.payload(ref) for ref in payloads_of(messages)]

    def create(
        self,
        messages: Sequence[Message],
        now: float,
        *,
        due_slack: float = 1.0,
        repeat: bool = True,
        durability: Durability | None = None,
    ) -> CreateResult:
        """Write new ``pending`` messages (one script call, atomic).

        Idempotent on the message id when ``repeat`` (the default): pushing the same
        message twice writes it once. ``repeat=False`` says the ids were never written
        (a fresh ``send()``) and skips that check. A
        message whose idempotency key (scoped to its destination) already names another
        message is not written (see :class:`Created`). Each queue that gets a message due
        by ``now + due_slack`` and has no wake-up flag gets one, and is listed in
        :attr:`CreateResult.woken`. The call runs on this thread's own connection
        (:mod:`.thread_client`): ``send()`` is the hottest path there is. With a
        ``durability`` that waits, its ``WAIT``/``WAITAOF`` follows the script on the same
        connection, in the same write (:func:`.durability.write_then_wait`).
        """
        return drive(
            self,
            create_steps(
                self,
                messages,
                now,
                due_slack,
                repeat,
                durability,
                cluster=self.cluster,
            ),
        )

    def create_partitioned(
        self,
        messages: Sequence[Message],
        now: float,
        due_slack: float,
        repeat: bool,
        durability: Durability | None = None,
    ) -> CreateResult:
        """:meth:`create` with more than one partition: one ``lua/create.lua`` call per
        partition the messages are in (their ids name it), after the destinations are
        registered (``SADD outbox:{g}:destinations``: lists read them), in one round trip;
        then the wake-up flags of the queues given due messages
        (:meth:`raise_wake_flags`). Each call is atomic by itself, not the calls together:
        an idempotency conflict refuses the messages of its own partition only (the
        others are written), as a partition of a cluster can refuse a write the others
        took. A partition that cannot be written now (an outage:
        :data:`.outages.PARTITION_UNAVAILABLE`) while another was gives its messages the
        code ``"unstored"`` and its error in :attr:`CreateResult.errors`; when none could
        be written, the first error is raised. A ``durability`` that waits follows the
        last call on the same connection (:func:`.durability.commands_then_wait`; on a
        cluster, on each primary's).

        Raises:
            redis.exceptions.RedisError: no partition could be written (nothing was),
                or a partition refused its call for another reason than an outage.
        """
        return drive(
            self,
            partitioned_steps(
                self,
                messages,
                now,
                due_slack,
                repeat,
                durability,
                cluster=self.cluster,
            ),
        )

    @staticmethod
    def parse_create(messages: Sequence[Message], reply: CreateReply) -> CreateResult:
        """Turn ``lua/create.lua``'s flat reply into a :class:`CreateResult`: the woken
        queues first, then (position, standing id, code) for each message not written
        as new."""
        n_woken = int(reply[0])
        created = [Created(m.id, m.id, "new") for m in messages]
        if len(reply) == 1 + n_woken:  # every message written as new, none ordered: most calls
            return CreateResult(created, [q.decode() for q in reply[1:]] if n_woken else [])
        woken = [q.decode() for q in reply[1 : 1 + n_woken]]
        rest = reply[1 + n_woken :]
        for at in range(0, len(rest), 3):
            index = int(rest[at]) - 1
            code = rest[at + 2].decode()
            if code.startswith("ordered:"):  # written as new, in its ordering key's queue
                _, status, seq, prev, epoch = code.split(":")
                created[index] = Created(
                    messages[index].id,
                    messages[index].id,
                    "new",
                    status,
                    int(seq),
                    int(prev) if prev else None,
                    epoch or None,
                )
                continue
            created[index] = Created(messages[index].id, rest[at + 1].decode(), code)
        return CreateResult(created, woken)

    def claim_args(self, queue: str, now: float, options: ClaimOptions, partition: int = 0) -> list[Any]:
        """ARGV of ``lua/claim.lua`` (see :meth:`claim`; its KEYS: :meth:`claim_keys`) in
        ``partition``."""
        # Entries looked at: a few per message wanted. Messages of a destination at its
        # cap are skipped (they stay due), so the scan stays short when one destination
        # holds the head of the queue.
        o = options
        return named(
            prefix=self.keys.prefix,
            parts=self.keys.partitions,
            now=repr(now),
            queue=queue,
            lease=o.lease,
            deadline=repr(o.deadline),
            limit=o.limit,
            scan=o.scan if o.scan is not None else o.limit * 2 + 8,
            caps=json.dumps(o.caps or {}, separators=(",", ":")),
            slack=repr(o.due_slack),
            limits=o.limits,
            lane="q" if o.quarantine else "",
            **self.payloads_held(partition),
        )

    def payloads_held(self, partition: int) -> dict[str, str]:
        """A claim's ``have`` input in ``partition``: the events whose payload bodies this
        process holds (:class:`~outbox.store.payload_bodies.PayloadBodies`), or nothing."""
        held = self.payload_bodies.held(self.keys.partition(partition).payload(""))
        return {"have": held} if held else {}

    def claim_keys(self, queue: str, partition: int = 0) -> list[str]:
        """KEYS of ``lua/claim.lua``: the queue's due and quarantine indexes in
        ``partition``, ``outbox:probes``."""
        part = self.keys.partition(partition)
        return [part.due(queue), part.quarantine(queue), self.keys.probes]

    def claim(self, queue: str, now: float, partition: int, options: ClaimOptions) -> Claim:
        """Claim up to ``limit`` due messages of ``queue`` for delivery, in due order.

        ``pending``/``retrying`` -> ``sending`` with this claim's ``lease`` and the lease
        ``deadline`` as the score in the sending index (``lua/claim.lua``). A destination
        named in ``caps`` gives at most that many messages; its others stay due. The
        destination gates apply (parking, probe, ``Retry-After``, ``limits``: the JSON of
        :func:`outbox.destinations.config.limits_json`; see ``lua/claim.lua``).

        A suspect (a message taken back from a lost worker: its resend record has
        ``suspect``) is never claimed with others: met in the due index, it is moved to
        the queue's quarantine index. ``quarantine=True`` claims from that index instead
        (the caller asks for one message and has nothing else in flight).

        With more than one partition, this claims from ``partition``'s indexes only
        (``outcomes_and_claim`` claims from several in one round trip).

        ``options``: the lease, its deadline, the limit and the rest (:class:`ClaimOptions`).
        """
        return self.parse_claim(
            self.run_script(
                "claim",
                self.claim_args(queue, now, options, partition),
                keys=self.claim_keys(queue, partition),
            )
        )

    def parse_claim(self, reply: ClaimReply) -> Claim:
        """Turn ``lua/claim.lua``'s (or ``lua/claim_apply.lua``'s first six) raw reply into
        a :class:`Claim`, each delivery of a published event given its body from the
        payload records the reply carries (:meth:`attach_payloads`: a record that is gone
        is logged, its messages' body left b""; one the script could not read, on a slot
        half-moved by a legacy migration, is read in a round trip of its own)."""
        flat, next_due, rescheduled, capped, next_suspect, payloads = reply[:6]
        messages = [message_from_flat(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        self.attach_payloads(
            messages,
            {payloads[i].decode(): payloads[i + 1] for i in range(0, len(payloads), 2)},
            remember=True,
        )
        return Claim(
            messages,
            float(next_due) if next_due else None,
            int(rescheduled),
            capped=[d.decode() for d in capped],
            next_suspect=float(next_suspect) if next_suspect else None,
            states=parse_states(reply[6]) if len(reply) > 6 else {},
        )

    def transition_args(self, changes: Sequence[Change], now: float) -> list[Any]:
        """ARGV of ``lua/transition.lua`` (see :meth:`transition` and :meth:`Change.args`;
        its KEYS: :meth:`transition_keys`)."""
        args: list[Any] = named(
            prefix=self.keys.prefix,
            parts=self.keys.partitions,
            now=repr(now),
            kept=self.attempts_kept,
            okttl=self.ordering_key_ttl,
            channel=self.events_channel,
            # PUBSUB NUMSUB counts the subscribers of the node it runs on only: on a
            # cluster a subscriber may be on another node (PUBLISH reaches every node)
            numsub="0" if isinstance(self.connection, RedisCluster) else "1",
            n=len(changes),
            fields=field_names(CHANGE_FIELDS),
        )
        for change in changes:
            args += change.args()
        return args

    def transition_keys(self, changes: Sequence[Change], now: float | None = None) -> list[str]:
        """KEYS of ``lua/transition.lua``: per change, the message's resend record,
        attempts list and message record. With more than one partition, after them the
        indexes each change may move its message between, where the change names the
        message's destination and queue (an outcome does), and the per-minute counter of
        its ``stat`` at ``now`` (the script reads only the first three per change).
        Declared, a slot held half-moved answers ``TRYAGAIN`` before the script runs,
        instead of the script aborting at the first key that moved ("non local key"),
        its earlier writes kept."""
        keys: list[str] = []
        for change in changes:
            keys += [self.keys.resend(change.id), self.keys.attempts(change.id), self.keys.message(change.id)]
        if not self.keys.partitioned:
            return keys
        more: dict[str, None] = {}
        for change in changes:
            part = self.keys.of(change.id)
            if change.destination:
                ends = [*change.from_statuses, change.to, *([change.park["to"]] if change.park else [])]
                more.update(dict.fromkeys(part.status(status, change.destination) for status in ends))
                more[part.parked(change.destination)] = None
            if change.queue:
                more.update(dict.fromkeys([part.due(change.queue), part.quarantine(change.queue)]))
            if change.ordering_key and change.destination:
                d, key = change.destination, change.ordering_key
                more.update(
                    dict.fromkeys(
                        [
                            part.order(d, key),
                            part.order_state(d, key),
                            part.blocked(d),
                            part.status(Status.WAITING.value, d),
                            part.status(Status.PENDING.value, d),
                        ]
                    )
                )
            if now is not None:
                minute = int(now // 60)
                for stat in [change.stats_outcome, "parked" if change.park else None]:
                    if stat:
                        more[part.stats(stat, minute)] = None
        return keys + list(more)

    def transition(self, changes: Sequence[Change], now: float) -> list[ChangeResult]:
        """Apply compare-and-set status changes atomically (one script call).

        Args:
            changes: the changes; each applies only if its conditions hold.
            now: epoch seconds, written as ``updated_at``.

        Returns:
            One :class:`ChangeResult` per change, in order.
        """
        if not changes:
            return []
        if not self.keys.partitioned:
            return self.parse_transition(
                changes,
                self.run_script(
                    "transition", self.transition_args(changes, now), keys=self.transition_keys(changes)
                ),
            )
        # one call per partition, told which destinations hold their messages (read from
        # their home slots) when a change has a park alternative
        holding: set[str] = set()
        with_park = [c.id for c in changes if c.park]
        if with_park:
            pipe = self.connection.pipeline(transaction=False)
            for message_id in with_park:
                pipe.hget(self.keys.resend(message_id), "destination")
            holding = self.holding(sorted({d.decode() for d in pipe.execute() if d}))
        groups = self.by_partition([c.id for c in changes])
        calls: list[ScriptCall] = []
        for positions in groups:
            chunk = [changes[i] for i in positions]
            args = with_holding(self.transition_args(chunk, now), holding)
            calls.append(("transition", args, self.transition_keys(chunk, now)))
        results: list[ChangeResult] = [ChangeResult(c.id, False, "") for c in changes]
        for positions, reply in zip(groups, self.run_scripts(calls), strict=True):
            for i, r in zip(
                positions, self.parse_transition([changes[i] for i in positions], reply), strict=True
            ):
                results[i] = r
        return results

    def bulk_transition(
        self, ids: Sequence[str], change: BulkChange, now: float, step: float = 1e-6
    ) -> BulkResult:
        """One compare-and-set applied to many messages (``lua/bulk.lua``, one call; one
        per partition the ids are in, in one round trip, with more than one).

        Cheaper per message than :meth:`transition` for a user's bulk action: no
        per-message JSON, and one Pub/Sub event (``messages.<action>`` with the ids) per
        call instead of one per message. Messages that become ``pending`` enter their
        queue's due index and wake it.

        Args:
            ids: the messages.
            change: what to apply to each (statuses, fields, the event's name).
            now: epoch seconds (``updated_at``; the first index score).
            step: seconds between the index scores of successive messages (no ties).

        Returns:
            The ids changed and the queues woken. With more than one partition, a
            partition whose call failed (an outage, a slot in flux) is in
            :attr:`BulkResult.errors` while the others' changes stand (their ids and
            queues are in the result: the caller signals and wakes them).

        Raises:
            redis.exceptions.RedisError: no partition's call applied (the first error).
        """
        args: list[Any] = named(
            prefix=self.keys.prefix,
            parts=self.keys.partitions,
            now=repr(now),
            channel=self.events_channel,
            action=change.action,
            to=change.to,
            **{"from": ",".join(change.from_statuses)},
            unset=",".join(change.unset),
            score=repr(now),
            step=repr(step),
            wake_ttl_ms=self.wake_ttl_ms,
            okttl=self.ordering_key_ttl,
        )
        fields = change.set or {}
        args.append(len(fields))
        for field_name, value in fields.items():
            args += [field_name, value]
        groups = self.by_partition(ids)  # one call per partition (one with one partition)
        calls: list[ScriptCall] = []
        for positions in groups:
            chunk = [ids[i] for i in positions]
            calls.append(("bulk", [*args, 1, "", len(chunk), *chunk], [self.keys.resend(i) for i in chunk]))
        replies = self.run_scripts(calls, errors=True)  # one partition failing fails its own call
        result = self.parse_bulk(ids, groups, replies)
        if result.errors and len(result.errors) == len(calls):
            raise next(iter(result.errors.values()))
        result.woken = self.raise_wake_flags(result.woken, now)
        return result

    def parse_bulk(self, ids: Sequence[str], groups: list[list[int]], replies: list[Any]) -> BulkResult:
        """``lua/bulk.lua``'s replies, one per partition's call (``groups``: the positions
        of ``ids`` in each), as a :class:`BulkResult` (``woken``: the queues whose flag a
        call set; a call that failed: its partition's error)."""
        applied = [False] * len(ids)
        purged: list[str] = []
        woken: list[str] = []
        errors: dict[int, Exception] = {}
        for positions, reply in zip(groups, replies, strict=True):
            if isinstance(reply, Exception):
                errors[partition_of(ids[positions[0]]) if self.keys.partitioned else 0] = reply
                continue
            flags, queues = cast(BulkReply, reply)
            for i, flag in zip(positions, flags, strict=True):
                applied[i] = flag == 1
                if flag == 2:  # a requeue refused: the event's payload was purged
                    purged.append(ids[i])
            woken += [q.decode() for q in queues if q.decode() not in woken]
        return BulkResult([m for m, yes in zip(ids, applied, strict=True) if yes], woken, errors, purged)

    @staticmethod
    def parse_transition(changes: Sequence[Change], reply: list[TransitionRow]) -> list[ChangeResult]:
        """Turn the transition script's raw reply into :class:`ChangeResult` objects."""
        results = []
        for change, row in zip(changes, reply, strict=True):
            message = message_from_flat(row[3], row[4]) if len(row) > 3 else None
            code = row[0]  # 1 applied, 2 as its park alternative; 3, 4: so by an earlier call
            results.append(
                ChangeResult(
                    change.id,
                    code in (1, 2),
                    row[1].decode(),
                    message,
                    code in (2, 4),
                    code in (3, 4),
                    row[2].decode() or None,
                )
            )
        return results

    def release(self, lease: str, deadline: float, now: float, ids: Sequence[str] = ()) -> BulkResult:
        """Give claimed, unattempted messages back with no attempt charged (``lua/release.lua``).

        Args:
            lease: the claim's lease token; only messages still held under it are released.
            deadline: the claim's lease deadline; with no ``ids``, every message in the
                sending index at exactly this score is a candidate (a claim whose reply
                was lost on the way).
            now: epoch seconds: released messages are due now.
            ids: the messages to release, if known.
        """
        base: dict[str, Any] = {
            "prefix": self.keys.prefix,
            "parts": self.keys.partitions,
            "now": repr(now),
            "lease": lease,
            "deadline": repr(deadline),
            "wake_ttl_ms": self.wake_ttl_ms,
        }
        opts = named(**base)
        if not self.keys.partitioned:
            reply: ReleaseReply = self.run_script(
                "release", [*opts, *ids], keys=[self.keys.destinations, *(self.keys.resend(i) for i in ids)]
            )
            released, woken, _ = reply
            return BulkResult([i.decode() for i in released], [q.decode() for q in woken])
        # one call per partition: of the ids' partitions, or (no ids) of every partition,
        # with the destinations named (their set is a key across the deployment)
        calls: list[ScriptCall] = []
        if ids:
            for positions in self.by_partition(ids):
                chunk = [ids[i] for i in positions]
                calls.append(("release", [*opts, *chunk], [self.keys.resend(i) for i in chunk]))
        else:
            names = cast("set[bytes]", self.connection.smembers(self.keys.destinations))
            destinations = json.dumps(sorted(d.decode() for d in names))
            for k in self.keys.partition_numbers():
                args = named(**base, destinations=destinations, partition=k)
                calls.append(("release", args, [self.keys.partition(k).due("-")]))  # a key of the partition
        out: list[str] = []
        made_due: list[str] = []
        inflight: dict[str, list[str]] = {}
        for released, woken, dests in cast(list[ReleaseReply], self.run_scripts(calls)):
            for i, d in zip(released, dests, strict=True):
                out.append(i.decode())
                inflight.setdefault(d.decode(), []).append(i.decode())
            made_due += [q.decode() for q in woken if q.decode() not in made_due]
        if inflight:  # their gates' grants end (lua/gate.lua)
            pipe = self.connection.pipeline(transaction=False)
            for name, released_ids in inflight.items():
                pipe.zrem(self.keys.inflight(name), *(Keys.inflight_member(lease, i) for i in released_ids))
            pipe.execute()
        return BulkResult(out, self.raise_wake_flags(made_due, now))

    def wake_candidates(self, queues: Sequence[str], now: float, stale_after: float) -> list[str]:
        """The queues that need a wake-up job now (``lua/wake.lua``); their flags are set.

        A queue needs one when a message in its due index is due and its flag is absent
        or older than ``stale_after`` seconds.
        """
        if not queues:
            return []
        if self.keys.partitioned:
            return self._wake_candidates_partitioned(queues, now, stale_after)
        keys: list[str] = []
        for queue in queues:
            keys.append(self.keys.wake(queue))
            for k in self.keys.partition_numbers():
                part = self.keys.partition(k)
                keys += [part.due(queue), part.quarantine(queue)]
        reply: list[bytes] = self.run_script(
            "wake", [repr(now), self.wake_ttl_ms, repr(stale_after), self.keys.partitions, *queues], keys=keys
        )
        return [q.decode() for q in reply]

    def _wake_candidates_partitioned(
        self, queues: Sequence[str], now: float, stale_after: float
    ) -> list[str]:
        """:meth:`wake_candidates` with more than one partition: the first entry of each
        partition's due and quarantine indexes and each queue's flag read in one round trip
        (single-key commands, routed per slot), then the flags set (``SET NX``, or over a
        stale one: the compare of ``lua/wake.lua``, not atomic here: two checks at once may
        both enqueue a job, which costs an idle job, never a message)."""
        pipe = self.connection.pipeline(transaction=False)
        for queue in queues:
            pipe.get(self.keys.wake(queue))
            for k in self.keys.partition_numbers():
                part = self.keys.partition(k)
                queue_first(pipe, part.due(queue))
                queue_first(pipe, part.quarantine(queue))
        replies = pipe.execute()
        width = 1 + 2 * self.keys.partitions
        stale: list[str] = []
        absent: list[str] = []
        for i, queue in enumerate(queues):
            flag, *raw = replies[i * width : (i + 1) * width]
            firsts = [first_of(r) for r in raw]
            if not any(first and first[1] <= now for first in firsts):
                continue
            if flag is None:
                absent.append(queue)
            elif now - float(flag) > stale_after:
                stale.append(queue)
        pipe = self.connection.pipeline(transaction=False)
        for queue in absent:
            pipe.set(self.keys.wake(queue), repr(now), nx=True, px=self.wake_ttl_ms)
        for queue in stale:
            pipe.set(self.keys.wake(queue), repr(now), px=self.wake_ttl_ms)
        done = pipe.execute() if absent or stale else []
        return [q for q, ok in zip([*absent, *stale], done, strict=True) if ok]

    def clear_wake_flag(self, queue: str) -> None:
        """A wake-up job of ``queue`` has started: the next message due needs a new one."""
        self.connection.delete(self.keys.wake(queue))

    def delete(self, ids: Sequence[str], statuses: Sequence[str]) -> list[bool]:
        """Delete messages whose status is one of ``statuses`` (records, attempts, indexes).

        Returns:
            Per id, True if it was deleted.
        """
        if not ids:
            return []
        groups = self.by_partition(ids)  # one call per partition (one with one partition)
        calls: list[ScriptCall] = []
        for positions in groups:
            chunk = [ids[i] for i in positions]
            keys: list[str] = []
            for message_id in chunk:
                keys += [
                    self.keys.resend(message_id),
                    self.keys.message(message_id),
                    self.keys.attempts(message_id),
                ]
            opts = named(
                prefix=self.keys.prefix,
                parts=self.keys.partitions,
                statuses=",".join(statuses),
                okttl=self.ordering_key_ttl,
                now=repr(time.time()),
            )
            calls.append(("delete", [*opts, *chunk], keys))
        deleted = [False] * len(ids)
        for positions, reply in zip(groups, self.run_scripts(calls), strict=True):
            for i, flag in zip(positions, reply, strict=True):
                deleted[i] = bool(flag)
        return deleted

    def get(self, message_id: str) -> Message:
        """The message with this id.

        Raises:
            MessageNotFound: no such message.
        """
        message = self.get_many([message_id])[0]
        if message is None:
            raise MessageNotFound(f"no message with id {message_id!r}")
        return message

    def get_many(self, ids: Sequence[str]) -> list[Message | None]:
        """The messages with these ids, in order; None where an id has no message.

        One round trip (a second one only for records written by an older version, hashes)."""
        if not ids:
            return []
        pipe = self.connection.pipeline(transaction=False)
        for message_id in ids:
            pipe.get(self.keys.message(message_id))
            pipe.hgetall(self.keys.resend(message_id))
        replies = pipe.execute(raise_on_error=False)  # GET, HGETALL per id
        records = self.resolve_older_records(ids, replies[::2], lambda key, pipe: pipe.hgetall(key))
        out: list[Message | None] = []
        for i, record in enumerate(records):
            resend = replies[2 * i + 1]
            out.append(message_from_redis(record, resend, ids[i]) if record and resend else None)
        self.attach_payloads(out)
        return out

    def attach_payloads(
        self,
        messages: Sequence[Message | None],
        known: dict[str, bytes | None] | None = None,
        *,
        remember: bool = False,
    ) -> None:
        """Give each delivery of a published event read from Redis (``payload_ref`` set,
        no body) its body, from its payload record: ``known`` (record key -> body, None:
        gone) as a claim's reply carries them, then the bodies this process holds
        (:attr:`payload_bodies`: a claim is told of them and returns none), the others read
        with one ``HGET`` per distinct record (event and partition), all in one round
        trip, none when no message needs one. ``remember`` (a claim's): keep the bodies
        read. A record that is gone (purged; the invariant says it outlives its
        deliveries) leaves the body b"" and is logged (:func:`payloads_wanted`,
        :func:`set_payloads`; ``aget`` reads them with the same two)."""
        wanted = payloads_wanted(self.keys, messages)
        if not wanted:
            return
        held = self.payload_bodies
        # the bodies read from Redis now (the claim's reply, then HGET below)
        read: dict[str, bytes | None] = {k: known[k] for k in wanted if k in known} if known else {}
        found = dict(read)
        for key in wanted:
            if key not in found and (body := held.get(key)) is not None:
                found[key] = body
        set_payloads({key: wanted[key] for key in found}, list(found.values()))
        rest = {key: refs for key, refs in wanted.items() if key not in found}
        if rest:
            pipe = self.connection.pipeline(transaction=False)
            for key in rest:
                pipe.hget(key, "body")
            bodies = pipe.execute()  # HGET per record
            set_payloads(rest, bodies)
            read.update(zip(rest, bodies, strict=True))
        if remember:  # a held body keeps the time it was read from Redis
            for key, body in read.items():
                if body is not None:
                    held.put(key, body)

    def resolve_older_records(
        self, ids: Sequence[str], replies: Sequence[Any], read: Callable[[str, Any], Any]
    ) -> list[Any]:
        """``replies`` to GET (or GETRANGE) of the message records, with each ``WRONGTYPE``
        error (a hash, written by an older version) replaced by ``read(key, pipeline)``'s reply
        (one more round trip, only if there is one). Other errors are raised."""
        out = list(replies)
        older = [i for i, reply in enumerate(out) if isinstance(reply, ResponseError)]
        for i in older:
            if not str(out[i]).startswith("WRONGTYPE"):
                raise out[i]
        if older:
            pipe = self.connection.pipeline(transaction=False)
            for i in older:
                read(self.keys.message(ids[i]), pipe)
            for i, reply in zip(older, pipe.execute(), strict=True):
                out[i] = reply
        return out

    def ids_for_idempotency_keys(self, keys: Sequence[tuple[str, str]]) -> list[str | None]:
        """The id sent under each (destination, idempotency key), or None. One round trip."""
        if not keys:
            return []
        values = self.mget([self.keys.idempotency_home(d, k) for d, k in keys])
        return [v.decode().split("|", 1)[0] if v else None for v in values]

    def resend_field(self, ids: Sequence[str], field_name: str) -> list[str]:
        """One field of each message's resend record (``"status"``, ``"queue"``...); ""
        for a missing message or field. One round trip."""
        pipe = self.connection.pipeline(transaction=False)
        for message_id in ids:
            pipe.hget(self.keys.resend(message_id), field_name)
        values: list[bytes | None] = pipe.execute()  # HGET per id
        return [v.decode() if v else "" for v in values]

    def attempts(self, message_id: str, limit: int | None = None) -> list[Attempt]:
        """The message's attempt records, newest first: those on its attempts list (at
        most ``attempts_kept``) and the success kept in its resend record, if any (see
        :func:`~outbox.store.codec.inline_fields`). One round trip."""
        pipe = self.connection.pipeline(transaction=False)
        pipe.lrange(self.keys.attempts(message_id), 0, -1 if limit is None else limit - 1)
        pipe.hmget(self.keys.resend(message_id), INLINE_ATTEMPT_FIELDS)
        listed, inline_values = pipe.execute()  # LRANGE, HMGET
        found = [attempt_from_json(raw) for raw in listed]
        inline = attempt_from_inline(
            {
                k: v.decode()
                for k, v in zip(INLINE_ATTEMPT_FIELDS, inline_values, strict=True)
                if v is not None
            }
        )
        if inline is not None:
            found.append(inline)
            found.sort(key=lambda a: a.started_at or 0.0, reverse=True)
        return found if limit is None else found[:limit]
