"""The message repository: the only code that reads or writes outbox keys in Redis.

Model-like access to messages (``get``, ``get_many``, ``filter``, ``count``) and atomic
status transitions (compare-and-set Lua scripts, see ``lua/transition.lua``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis import Redis
from redis.exceptions import NoScriptError, ResponseError

from outbox.exceptions import MessageNotFound
from outbox.records import INLINE_ATTEMPT_FIELDS, STATUSES, Attempt, Message
from outbox.store.keys import Keys
from outbox.store.scripts import field_names, named, names, sha, source
from outbox.store.thread_client import ThreadClients

# Replies as this repository's connection returns them (``decode_responses=False``): bytes.
# redis-py's own types also allow str (``decode_responses=True``) and give one type to
# sorted-set reads with and without WITHSCORES, so replies are cast to these where parsed.
Members = list[bytes]
ScoredMembers = list[tuple[bytes, float]]
#: Seconds an ``outbox:workers`` entry is kept after its heartbeat expired: longer than
#: RQ keeps a dead worker's key (its ``worker_ttl``, 420 s, + 60), so a killed worker
#: still listed by RQ is found stale, not unknown.
WORKER_HEARTBEAT_KEPT = 3600.0

# The Lua scripts' replies (lua/*.lua, each documented in its header), as parsed here:
# Redis arrays arrive as lists, typed as the tuples they are unpacked as; Lua false as None.
#: create.lua: [number of queues woken, their names..., then (position, standing id,
#: code) for each message not written as new].
CreateReply = list[Any]
#: claim.lua: (message record ([id, string or a hash's HGETALL]: lua/lib/message.lua),
#: resend HGETALL, ... per claimed message; next due score or None; messages a limit
#: rescheduled; destinations skipped at their cap; next due score of the quarantine index or None).
ClaimReply = tuple[list[list[Any]], bytes | None, int, list[bytes], bytes | None]
#: transition.lua, per change: (applied 0|1, status after[, message record, resend HGETALL]).
TransitionRow = tuple[int, bytes] | tuple[int, bytes, list[Any], list[bytes]]
#: bulk.lua: (applied 0|1 per id, queues woken); release.lua: (ids released, queues woken).
BulkReply = tuple[list[int], list[bytes]]
ReleaseReply = tuple[list[bytes], list[bytes]]


#: Where a walk over an index stopped: (score as Redis wrote it, id) of the last entry read.
Cursor = tuple[bytes, bytes]

#: One call of :meth:`MessageRepository.run_scripts`: (script name in ``lua/``, ARGV) or
#: (script name, ARGV, KEYS).
ScriptCall = tuple[str, Sequence[Any]] | tuple[str, Sequence[Any], Sequence[str]]

#: The fields of each message of ``lua/create.lua``, in the order :meth:`MessageRepository.create_args` sends them.
CREATE_FIELDS = ("id", "keyed", "fp", "dest", "queue", "status", "score", "created", "record", "n_resend")
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
    "n_set",
    "n_unset",
    "n_inline",
)
#: The fields of each attempt outcome given to :meth:`MessageRepository.health_args`, in order.
OUTCOME_FIELDS = ("destination", "kind", "ms", "code", "class", "error", "retry_after", "id", "started_at")
#: The fields of each destination's breaker settings in the health config JSON, in order
#: (:func:`outbox.destinations.health.health_config_json`).
BREAKER_FIELDS = (
    "failures",
    "failure_rate",
    "min_attempts",
    "window",
    "cooldown",
    "max_cooldown",
    "disable_after",
)


def script_call(call: ScriptCall) -> tuple[str, Sequence[Any], Sequence[str]]:
    """A :data:`ScriptCall` as (name, ARGV, KEYS)."""
    if len(call) == 3:
        return call
    return call[0], call[1], ()


@dataclass(frozen=True)
class Index:
    """A list of messages read as one sorted set: one sorted set per destination (of one
    destination, or of every one), all with the same kind of score (see
    :mod:`outbox.store.keys`); their union is the list, in score order (ties by id, as
    Redis orders one sorted set).

    Attributes:
        keys: the sorted sets, one per destination.
    """

    keys: tuple[str, ...]


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
            :meth:`~outbox.records.Attempt.inline_fields`), written instead of pushing
            ``attempt`` when the record holds no inline success yet.
        event: a JSON event to publish on the events channel.
        stat: an outcome name counted in the per-minute statistics.
        load: return both records when applied (saves a round trip on claim).
        also: a second JSON event published with the change (``message.exhausted``).
        park: what to write instead when the destination holds its messages (paused,
            disabled, circuit breaker not closed; see ``lua/transition.lua``): a dict with
            ``to``, ``score``, ``set``, ``unset``, ``attempt`` (JSON) and ``event``.
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
    stat: str | None = None
    load: bool = False
    also: str | None = None
    park: dict[str, Any] | None = None

    def args(self) -> list[Any]:
        """This change as ``lua/transition.lua`` reads it (named by :data:`CHANGE_FIELDS`):
        12 fixed values (id, from
        statuses joined by commas, to, score, lease, due_by, attempt JSON, event JSON,
        stat, load "1", also, park JSON; "" where absent), the number of ``set`` pairs, of
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
            "" if self.attempt is None else self.attempt.to_json(),
            self.event or "",
            self.stat or "",
            "1" if self.load else "",
            self.also or "",
            "" if self.park is None else json.dumps(self.park, separators=(",", ":")),
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
            destination was held: the message waits, no retry charged).
    """

    id: str
    applied: bool
    status: str
    message: Message | None = None
    parked: bool = False


@dataclass
class Created:
    """What :meth:`MessageRepository.create` did with one message.

    Attributes:
        id: the id the caller proposed.
        standing_id: the id that stands for it: ``id``, or the message already sent under
            the same idempotency key.
        code: ``"new"`` (written), ``"exists"`` (a message with this id was already
            written: a repeated push), ``"duplicate"`` (the key names another message
            with the same body: nothing written) or ``"conflict"`` (the key names another
            message with a different body: nothing written).
    """

    id: str
    standing_id: str
    code: str


@dataclass
class CreateResult:
    """The reply of :meth:`MessageRepository.create`: one :class:`Created` per message,
    in order, and the queues whose wake-up flag the call set (enqueue their job)."""

    created: list[Created]
    woken: list[str]


@dataclass
class Claim:
    """The reply of :meth:`MessageRepository.claim`.

    Attributes:
        messages: the messages claimed (status ``sending``, this claim's lease), with both records.
        next_due: epoch seconds when the earliest message left in the queue's due index
            is due, or None when the index is empty.
        held: messages the claim rescheduled because their destination was over a
            limit (rate, concurrency, ``Retry-After``): due again soon.
        events: destination events (JSON strings, see ``lua/health.lua``) caused by the
            outcomes written in the same round trip (:meth:`MessageRepository.outcomes_and_claim`).
        capped: destinations whose due messages the claim skipped because their cap
            (``caps``) was reached: they stay due at the head of the queue.
        next_suspect: epoch seconds when the earliest message of the queue's quarantine
            index is due (a suspect, attempted alone: ``quarantine=True``), or None.
    """

    messages: list[Message]
    next_due: float | None
    held: int = 0
    events: list[str] = field(default_factory=list)
    capped: list[str] = field(default_factory=list)
    next_suspect: float | None = None


@dataclass(frozen=True)
class AlertWindow:
    """An alert that goes now (:meth:`MessageRepository.alert_window`): ``count``
    occurrences since ``since`` (epoch seconds) that no alert reported yet, the newest
    one's detail as JSON in ``last``."""

    count: int
    since: float
    last: str


@dataclass
class BulkResult:
    """The reply of :meth:`MessageRepository.bulk_transition`: the ids changed and the
    queues whose wake-up flag the call set."""

    applied: list[str]
    woken: list[str]


class MessageRepository:
    """Messages in Redis under one key prefix.

    Args:
        connection: a redis-py client (``decode_responses=False``), e.g. from
            ``django_redis.get_redis_connection``.
        prefix: key prefix (``OUTBOX["KEY_PREFIX"]``).
        attempts_kept: attempt records kept per message.
        events_channel: Pub/Sub channel for events, or "" for none.
        idempotency_ttl: seconds an idempotency key is remembered (0 = for ever).
        wake_ttl: seconds a queue's wake-up flag lives (see ``lua/wake.lua``).

    Every write is one Lua script call, atomic on the server. Scripts are called by
    SHA1 (``EVALSHA``) and loaded again after a ``NOSCRIPT`` reply (a restarted Redis
    forgets them). Redis errors (``redis.exceptions.RedisError``) propagate unchanged.
    """

    def __init__(
        self,
        connection: Redis,
        prefix: str = "outbox",
        *,
        attempts_kept: int = 50,
        events_channel: str = "",
        idempotency_ttl: int = 0,
        wake_ttl: float = 60.0,
    ) -> None:
        self.connection = connection
        #: send()'s client: one connection held per thread (see :mod:`.thread_client`).
        self.thread_clients = ThreadClients(connection)
        self.keys = Keys(prefix)
        self.attempts_kept = attempts_kept
        self.events_channel = events_channel or ""
        self.idempotency_ttl = idempotency_ttl
        self.wake_ttl_ms = max(1, int(wake_ttl * 1000))
        self.scripts_loaded = False

    # -- running scripts ------------------------------------------------------------
    def load_scripts(self) -> None:
        """Load every Lua script into Redis's script cache (one round trip, ``SCRIPT LOAD``).

        Raises:
            redis.exceptions.RedisError: Redis could not be reached.
        """
        pipe = self.connection.pipeline(transaction=False)
        for name in names():
            pipe.script_load(source(name))
        pipe.execute()
        self.scripts_loaded = True

    def run_scripts(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """Run Lua scripts in one round trip (a pipeline without MULTI), in order.

        Each script is atomic by itself; the calls are not atomic together. Every script
        is loaded before the first call (:meth:`load_scripts`), so the calls run in order.
        Only when Redis lost its script cache between two calls (a restart, ``SCRIPT
        FLUSH``) do the calls that met ``NOSCRIPT`` run again after the others: the
        scripts are written so that this costs time, never a message (a claim that runs
        before an outcome write only misses a retry due at once until the next claim).

        Args:
            calls: (script name in ``lua/``, ARGV) or (name, ARGV, KEYS) per call.

        Returns:
            The raw reply of each call, in order.

        Raises:
            redis.exceptions.RedisError: a call failed (after loading the scripts and
                running the calls that hit ``NOSCRIPT`` once more).
        """
        if not self.scripts_loaded:
            self.load_scripts()
        parts = [script_call(call) for call in calls]
        pipe = self.connection.pipeline(transaction=False)
        for name, args, keys in parts:
            pipe.evalsha(sha(name), len(keys), *keys, *args)
        replies = pipe.execute(raise_on_error=False)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            self.load_scripts()
            pipe = self.connection.pipeline(transaction=False)
            for i in missing:
                name, args, keys = parts[i]
                pipe.evalsha(sha(name), len(keys), *keys, *args)
            for i, reply in zip(missing, pipe.execute(raise_on_error=False), strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    def run_script(
        self, name: str, args: Sequence[Any], client: Redis | None = None, *, keys: Sequence[str] = ()
    ) -> Any:
        """Run one Lua script by SHA1 (loading the scripts first, and after ``NOSCRIPT``)
        and return its reply. ``client``: the redis-py client to run it on (default: the
        repository's pooled one); ``keys``: its KEYS (names from :attr:`keys`)."""
        client = client or self.connection
        if not self.scripts_loaded:
            self.load_scripts()
        try:
            return client.evalsha(sha(name), len(keys), *keys, *args)
        except NoScriptError:
            self.load_scripts()
            return client.evalsha(sha(name), len(keys), *keys, *args)

    # -- writing ------------------------------------------------------------------
    def create_args(
        self, messages: Sequence[Message], now: float, due_slack: float, repeat: bool = True
    ) -> list[Any]:
        """ARGV of ``lua/create.lua`` for ``messages`` (see :meth:`create`; its KEYS:
        :meth:`create_keys`)."""
        args: list[Any] = named(
            idem_ttl=self.idempotency_ttl,
            wake_ttl_ms=self.wake_ttl_ms,
            now=repr(now),
            slack=repr(due_slack),
            repeat="1" if repeat else "0",
            fields=field_names(CREATE_FIELDS),
            n=len(messages),
        )
        for m in messages:
            idem = m.idempotency_key
            score = repr(m.next_attempt_at if m.next_attempt_at is not None else m.created_at)
            # The script writes these four resend fields from the arguments before them.
            rfields = m.resend_fields()
            for name in ("status", "destination", "queue", "next_attempt_at"):
                rfields.pop(name, None)
            args += [
                m.id,
                "1" if idem else "",
                m.fingerprint() if idem else "",
                m.destination,
                m.queue,
                m.status,
                score,
                repr(m.created_at),
                m.message_value(),
                len(rfields),
            ]
            for pair in rfields.items():
                args += pair
        return args

    def create_keys(self, messages: Sequence[Message]) -> list[str]:
        """KEYS of ``lua/create.lua`` for ``messages``: the destinations set, then per
        message its records, status, due and created index entries' sorted sets, its
        queue's wake-up flag and, if it has one, its idempotency key."""
        keys = [self.keys.destinations]
        for m in messages:
            status = m.status
            keys += [
                self.keys.message(m.id),
                self.keys.resend(m.id),
                self.keys.status(status, m.destination),
                self.keys.due(m.queue),
                self.keys.created(m.destination),
                self.keys.wake(m.queue),
            ]
            if m.idempotency_key:
                keys.append(self.keys.idempotency(m.destination, m.idempotency_key))
        return keys

    def create(
        self, messages: Sequence[Message], now: float, *, due_slack: float = 1.0, repeat: bool = True
    ) -> CreateResult:
        """Write new ``pending`` messages (one script call, atomic).

        Idempotent on the message id when ``repeat`` (the default): pushing the same
        message twice writes it once. ``repeat=False`` says the ids were never written
        (a fresh ``send()``) and skips that check. A
        message whose idempotency key (scoped to its destination) already names another
        message is not written (see :class:`Created`). Each queue that gets a message due
        by ``now + due_slack`` and has no wake-up flag gets one, and is listed in
        :attr:`CreateResult.woken`. The call runs on this thread's own connection
        (:mod:`.thread_client`): ``send()`` is the hottest path there is.
        """
        if not messages:
            return CreateResult([], [])
        args = self.create_args(messages, now, due_slack, repeat)
        keys = self.create_keys(messages)
        reply = self.thread_clients.run(lambda client: self.run_script("create", args, client, keys=keys))
        return self.parse_create(messages, reply)

    @staticmethod
    def parse_create(messages: Sequence[Message], reply: CreateReply) -> CreateResult:
        """Turn ``lua/create.lua``'s flat reply into a :class:`CreateResult`: the woken
        queues first, then (position, standing id, code) for each message not written
        as new."""
        n_woken = int(reply[0])
        woken = [q.decode() for q in reply[1 : 1 + n_woken]]
        created = [Created(m.id, m.id, "new") for m in messages]
        rest = reply[1 + n_woken :]
        for at in range(0, len(rest), 3):
            index = int(rest[at]) - 1
            created[index] = Created(messages[index].id, rest[at + 1].decode(), rest[at + 2].decode())
        return CreateResult(created, woken)

    def claim_args(
        self,
        queue: str,
        now: float,
        *,
        lease: str,
        deadline: float,
        limit: int,
        caps: dict[str, int] | None = None,
        due_slack: float = 0.0,
        scan: int | None = None,
        limits: str = "{}",
        quarantine: bool = False,
    ) -> list[Any]:
        """ARGV of ``lua/claim.lua`` (see :meth:`claim`; its KEYS: :meth:`claim_keys`)."""
        # Entries looked at: a few per message wanted. Messages of a destination at its
        # cap are skipped (they stay due), so the scan stays short when one destination
        # holds the head of the queue.
        scan = scan if scan is not None else limit * 2 + 8
        return named(
            prefix=self.keys.prefix,
            now=repr(now),
            queue=queue,
            lease=lease,
            deadline=repr(deadline),
            limit=limit,
            scan=scan,
            caps=json.dumps(caps or {}, separators=(",", ":")),
            slack=repr(due_slack),
            limits=limits,
            lane="q" if quarantine else "",
        )

    def claim_keys(self, queue: str) -> list[str]:
        """KEYS of ``lua/claim.lua``: the queue's due and quarantine indexes, ``outbox:probes``."""
        return [self.keys.due(queue), self.keys.quarantine(queue), self.keys.probes]

    def claim(self, queue: str, now: float, **options: Any) -> Claim:
        """Claim up to ``limit`` due messages of ``queue`` for delivery, in due order.

        ``pending``/``retrying`` -> ``sending`` with this claim's ``lease`` and the lease
        ``deadline`` as the score in the sending index (``lua/claim.lua``). A destination
        named in ``caps`` gives at most that many messages; its others stay due. The
        destination gates apply (parking, probe, ``Retry-After``, ``limits``: the JSON of
        :func:`outbox.destinations.health.limits_json`; see ``lua/claim.lua``).

        A suspect (a message taken back from a lost worker: its resend record has
        ``suspect``) is never claimed with others: met in the due index, it is moved to
        the queue's quarantine index. ``quarantine=True`` claims from that index instead
        (the caller asks for one message and has nothing else in flight).

        Keyword args: see :meth:`claim_args` (``lease``, ``deadline``, ``limit``,
        ``caps``, ``due_slack``, ``scan``, ``limits``, ``quarantine``).
        """
        return self.parse_claim(
            self.run_script("claim", self.claim_args(queue, now, **options), keys=self.claim_keys(queue))
        )

    @staticmethod
    def parse_claim(reply: ClaimReply) -> Claim:
        """Turn ``lua/claim.lua``'s raw reply into a :class:`Claim`."""
        flat, next_due, held, capped, next_suspect = reply
        messages = [Message.from_flat(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        return Claim(
            messages,
            float(next_due) if next_due else None,
            int(held),
            capped=[d.decode() for d in capped],
            next_suspect=float(next_suspect) if next_suspect else None,
        )

    def transition_args(self, changes: Sequence[Change], now: float) -> list[Any]:
        """ARGV of ``lua/transition.lua`` (see :meth:`transition` and :meth:`Change.args`;
        its KEYS: :meth:`transition_keys`)."""
        args: list[Any] = named(
            prefix=self.keys.prefix,
            now=repr(now),
            kept=self.attempts_kept,
            channel=self.events_channel,
            n=len(changes),
            fields=field_names(CHANGE_FIELDS),
        )
        for change in changes:
            args += change.args()
        return args

    def transition_keys(self, changes: Sequence[Change]) -> list[str]:
        """KEYS of ``lua/transition.lua``: per change, the message's resend record,
        attempts list and message record."""
        keys: list[str] = []
        for change in changes:
            keys += [self.keys.resend(change.id), self.keys.attempts(change.id), self.keys.message(change.id)]
        return keys

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
        return self.parse_transition(
            changes,
            self.run_script(
                "transition", self.transition_args(changes, now), keys=self.transition_keys(changes)
            ),
        )

    def outcomes_and_claim(
        self,
        changes: Sequence[Change],
        now: float,
        queue: str,
        *,
        outcomes: Sequence[Sequence[Any]] = (),
        health_config: str = "{}",
        **claim_options: Any,
    ) -> tuple[list[ChangeResult], Claim]:
        """Record attempt outcomes in destination health, write the outcomes, then claim
        the next messages, in one round trip.

        The scripts run in order in one pipeline: ``lua/health.lua`` (``outcomes``, see
        :meth:`health_args`; it may open a circuit breaker, so the transition that follows
        parks instead of charging a retry), ``lua/transition.lua`` (``changes``), then
        ``lua/claim.lua``. The destination events of the health script are in
        :attr:`Claim.events`.
        """
        calls: list[ScriptCall] = []
        if outcomes:
            calls.append(("health", self.health_args(outcomes, health_config, now), [self.keys.probes]))
        if changes:
            calls.append(("transition", self.transition_args(changes, now), self.transition_keys(changes)))
        calls.append(("claim", self.claim_args(queue, now, **claim_options), self.claim_keys(queue)))
        replies = self.run_scripts(calls)
        results = self.parse_transition(changes, replies[1 if outcomes else 0]) if changes else []
        claim = self.parse_claim(replies[-1])
        if outcomes:
            claim.events = [e.decode() for e in replies[0]]
        return results, claim

    def health_args(self, outcomes: Sequence[Sequence[Any]], config: str, now: float) -> list[Any]:
        """ARGV of ``lua/health.lua`` (its KEYS: ``[keys.probes]``).

        Args:
            outcomes: per attempt ``[destination, kind ("s", "r", "p"), duration ms,
                status code (0 = none), error class, error text, retry-after seconds
                (0 = none), message id, started_at (epoch seconds, optional)]``
                (:data:`OUTCOME_FIELDS`).
            config: JSON destination -> breaker settings (:data:`BREAKER_FIELDS`,
                :func:`outbox.destinations.health.health_config_json`).
            now: epoch seconds.
        """
        return named(
            prefix=self.keys.prefix,
            now=repr(now),
            channel=self.events_channel,
            config=config,
            config_fields=field_names(BREAKER_FIELDS),
            outcomes=json.dumps(list(outcomes), separators=(",", ":")),
            outcome_fields=field_names(OUTCOME_FIELDS),
        )

    def record_outcomes(self, outcomes: Sequence[Sequence[Any]], config: str, now: float) -> list[str]:
        """Record attempt outcomes in destination health alone (``lua/health.lua``);
        returns the destination events (JSON strings)."""
        if not outcomes:
            return []
        reply = self.run_script("health", self.health_args(outcomes, config, now), keys=[self.keys.probes])
        return [e.decode() for e in reply]

    def unpark(self, destination: str, now: float, batch: int = 1000) -> tuple[int, list[str], int]:
        """Put parked messages of ``destination`` back in their due index as far as its
        gate allows (``lua/unpark.lua``, one call, at most ``batch`` messages).

        Returns:
            (messages moved, queues whose wake-up flag the call set, messages still parked).
        """
        moved, woken, left = self.run_script(
            "unpark",
            named(
                prefix=self.keys.prefix,
                now=repr(now),
                destination=destination,
                batch=batch,
                wake_ttl_ms=self.wake_ttl_ms,
            ),
            keys=[self.keys.parked(destination), self.keys.probes, self.keys.dest(destination)],
        )
        return int(moved), [q.decode() for q in woken], int(left)

    def destination_action(self, destination: str, action: str, now: float, reason: str = "") -> str | None:
        """Pause, resume, disable or enable a destination (``lua/admin.lua``).

        Returns:
            The event published (JSON), or None when the state did not change.
        """
        reply = self.run_script(
            "admin",
            named(
                now=repr(now),
                channel=self.events_channel,
                destination=destination,
                action=action,
                reason=reason,
            ),
            keys=[self.keys.dest(destination)],
        )
        return bytes(reply).decode() if reply else None

    def due_probes(self, now: float, limit: int = 100) -> list[str]:
        """Destinations whose parked messages the wake check must look at now (``outbox:probes``)."""
        rows = cast(
            Members,
            self.connection.zrangebyscore(self.keys.probes, "-inf", repr(now), start=0, num=limit),
        )
        return [raw.decode() for raw in rows]

    def alert_window(
        self,
        event: str,
        destination: str,
        *,
        add: int,
        since: float,
        now: float,
        window: float,
        trailing: bool,
        last: str = "",
    ) -> AlertWindow | None:
        """Count ``add`` occurrences of ``event`` about ``destination`` and open its
        suppression window if none is open (``lua/alert.lua``, atomic across workers).

        Args:
            add: occurrences to count (0: a trailing flush, see :meth:`alerts_to_flush`).
            since: epoch seconds of the first of them.
            window: suppression window in seconds.
            trailing: when suppressed, schedule a flush at the window's end.
            last: JSON detail of the newest occurrence.

        Returns:
            An :class:`AlertWindow` when the alert goes now (the count is taken), None
            when suppressed or a flush has nothing to report.
        """
        reply = self.run_script(
            "alert",
            named(
                event=event,
                destination=destination,
                add=add,
                since=repr(since),
                now=repr(now),
                window_ms=max(1, int(window * 1000)),
                trailing="1" if trailing else "0",
                last=last,
            ),
            keys=[
                self.keys.alert_sent(event, destination),
                self.keys.alert_count(event, destination),
                self.keys.alert_flush,
            ],
        )
        if int(reply[0]) != 1:
            return None
        n, first, newest = reply[1:4]
        return AlertWindow(int(n or 0), float(first) if first else now, newest.decode() if newest else "")

    def alerts_to_flush(self, now: float, limit: int = 100) -> list[tuple[str, str]]:
        """(event, destination) pairs whose suppression window has ended with occurrences
        not reported yet (``outbox:alert:flush``), oldest first."""
        raw = cast(
            Members,
            self.connection.zrangebyscore(self.keys.alert_flush, "-inf", repr(now), start=0, num=limit),
        )
        pairs = [r.decode().split("|", 1) for r in raw]
        return [(p[0], p[1]) for p in pairs if len(p) == 2]

    def bulk_transition(
        self,
        ids: Sequence[str],
        *,
        from_statuses: Sequence[str],
        to: str,
        now: float,
        action: str,
        set: dict[str, str] | None = None,
        unset: Sequence[str] = (),
        step: float = 1e-6,
    ) -> BulkResult:
        """One compare-and-set applied to many messages (``lua/bulk.lua``, one call).

        Cheaper per message than :meth:`transition` for a user's bulk action: no
        per-message JSON, and one Pub/Sub event (``messages.<action>`` with the ids) per
        call instead of one per message. Messages that become ``pending`` enter their
        queue's due index and wake it.

        Args:
            ids: the messages.
            from_statuses: statuses a message must be in for the change to apply.
            to: the status after the change.
            now: epoch seconds (``updated_at``; the first index score).
            action: the event name, e.g. ``"requeued"``.
            set: other resend-record fields to write; unset: fields to delete.
            step: seconds between the index scores of successive messages (no ties).
        """
        args: list[Any] = named(
            prefix=self.keys.prefix,
            now=repr(now),
            channel=self.events_channel,
            action=action,
            to=to,
            **{"from": ",".join(from_statuses)},
            unset=",".join(unset),
            score=repr(now),
            step=repr(step),
            wake_ttl_ms=self.wake_ttl_ms,
        )
        set = set or {}
        args.append(len(set))
        for field_name, value in set.items():
            args += [field_name, value]
        args += [1, "", len(ids), *ids]  # one group, no job id
        reply: BulkReply = self.run_script("bulk", args, keys=[self.keys.resend(i) for i in ids])
        flags, woken = reply
        return BulkResult(
            [i for i, applied in zip(ids, flags, strict=True) if applied], [q.decode() for q in woken]
        )

    @staticmethod
    def parse_transition(changes: Sequence[Change], reply: list[TransitionRow]) -> list[ChangeResult]:
        """Turn the transition script's raw reply into :class:`ChangeResult` objects."""
        results = []
        for change, row in zip(changes, reply, strict=True):
            message = Message.from_flat(row[2], row[3]) if len(row) > 2 else None
            results.append(ChangeResult(change.id, bool(row[0]), row[1].decode(), message, row[0] == 2))
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
        reply: ReleaseReply = self.run_script(
            "release",
            [
                *named(
                    prefix=self.keys.prefix,
                    now=repr(now),
                    lease=lease,
                    deadline=repr(deadline),
                    wake_ttl_ms=self.wake_ttl_ms,
                ),
                *ids,
            ],
            keys=[self.keys.destinations, *(self.keys.resend(i) for i in ids)],
        )
        released, woken = reply
        return BulkResult([i.decode() for i in released], [q.decode() for q in woken])

    def wake_candidates(self, queues: Sequence[str], now: float, stale_after: float) -> list[str]:
        """The queues that need a wake-up job now (``lua/wake.lua``); their flags are set.

        A queue needs one when a message in its due index is due and its flag is absent
        or older than ``stale_after`` seconds.
        """
        if not queues:
            return []
        keys: list[str] = []
        for queue in queues:
            keys += [self.keys.due(queue), self.keys.quarantine(queue), self.keys.wake(queue)]
        reply: list[bytes] = self.run_script(
            "wake", [repr(now), self.wake_ttl_ms, repr(stale_after), *queues], keys=keys
        )
        return [q.decode() for q in reply]

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
        keys: list[str] = []
        for message_id in ids:
            keys += [
                self.keys.resend(message_id),
                self.keys.message(message_id),
                self.keys.attempts(message_id),
            ]
        reply: list[int] = self.run_script("delete", [self.keys.prefix, ",".join(statuses), *ids], keys=keys)
        return [bool(x) for x in reply]

    # -- reading ------------------------------------------------------------------
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
            out.append(Message.from_redis(record, resend, ids[i]) if record and resend else None)
        return out

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
        values = cast(
            "list[bytes | None]", self.connection.mget([self.keys.idempotency(d, k) for d, k in keys])
        )
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
        :meth:`~outbox.records.Attempt.inline_fields`). One round trip."""
        pipe = self.connection.pipeline(transaction=False)
        pipe.lrange(self.keys.attempts(message_id), 0, -1 if limit is None else limit - 1)
        pipe.hmget(self.keys.resend(message_id), INLINE_ATTEMPT_FIELDS)
        listed, inline_values = pipe.execute()  # LRANGE, HMGET
        found = [Attempt.from_json(raw) for raw in listed]
        inline = Attempt.from_inline(
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

    def index(self, status: str | None = None, destination: str | None = None) -> Index:
        """The index listing messages with this status and/or destination: the status
        index (or, without a status, the created index) of that destination, or of every
        destination ever used when ``destination`` is None (one ``SMEMBERS``).

        Raises:
            ValueError: an unknown status.
        """
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; expected one of {STATUSES}")
        names = [destination] if destination is not None else self.destinations()
        if status is None:
            return Index(tuple(self.keys.created(d) for d in names))
        return Index(tuple(self.keys.status(status, d) for d in names))

    def filter(
        self,
        status: str | None = None,
        destination: str | None = None,
        *,
        offset: int = 0,
        limit: int = 50,
        newest_first: bool = True,
        min_score: float | None = None,
        max_score: float | None = None,
    ) -> list[str]:
        """Ids with this status and/or destination, a page at a time.

        Ordered by the index score (see :mod:`outbox.store.keys`): created_at when no
        status is given. ``min_score``/``max_score`` bound the score (epoch seconds).
        See :meth:`range_by_rank` for what a deep page costs.
        """
        return self.range_by_rank(
            self.index(status, destination),
            min_score,
            max_score,
            offset=offset,
            limit=limit,
            descending=newest_first,
        )

    def range_by_rank(
        self, index: Index, lo: float | None, hi: float | None, *, offset: int, limit: int, descending: bool
    ) -> list[str]:
        """A page of an index within a score range, read by rank.

        One sorted set (one destination): unlike ``ZRANGEBYSCORE ... LIMIT offset`` (which
        walks ``offset`` entries), this finds the rank where the range starts with ZCOUNT
        and reads by rank, so a deep page costs O(log N) too; two round trips. Several
        (every destination): ``lua/filter.lua`` merges them in Redis in one round trip,
        reading ``offset + limit`` entries of each (O(destinations x (offset + limit))).
        """
        if limit <= 0 or not index.keys:
            return []
        if len(index.keys) > 1:
            return self.merged_range(index, lo, hi, offset=offset, count=limit, descending=descending)[0]
        key = index.keys[0]
        pipe = self.connection.pipeline(transaction=False)
        pipe.zcount(key, score_bound(lo, "-inf"), score_bound(hi, "+inf"))
        if descending:
            pipe.zcount(key, score_bound(hi, "+inf", exclusive=True), "+inf")
        else:
            pipe.zcount(key, "-inf", score_bound(lo, "-inf", exclusive=True))
        counts: list[int] = pipe.execute()  # ZCOUNT, ZCOUNT
        in_range, before = counts
        if (descending and hi is None) or (not descending and lo is None):
            before = 0
        end = min(offset + limit, in_range)
        if end <= offset:
            return []
        read = self.connection.zrevrange if descending else self.connection.zrange
        return [raw.decode() for raw in cast(Members, read(key, before + offset, before + end - 1))]

    def merged_range(
        self,
        index: Index,
        lo: float | None,
        hi: float | None,
        *,
        offset: int,
        count: int,
        descending: bool,
        checks: str = "{}",
        after: Cursor | None = None,
    ) -> tuple[list[str], int, Cursor | None]:
        """Entries ``offset`` to ``offset + count`` (by rank, in score order) of an index
        within a score range, its sorted sets merged in Redis as if they were one, that
        pass ``checks`` (the JSON of ``lua/filter.lua``'s per-record checks; none by
        default). One round trip, read only.

        ``after``: start right after this entry (the cursor a previous call returned)
        instead of at ``offset``: a walk in chunks then reads ``count`` entries of each
        sorted set per chunk instead of ``offset + count``.

        Returns (the ids that pass, in order; how many entries were examined: fewer than
        ``count`` at the end of the range; the cursor of the last entry examined, or None
        when none was or the index is one sorted set read without ``after``)."""
        matched, examined, last_score, last_id = self.run_script(
            "filter",
            named(
                prefix=self.keys.prefix,
                checks=checks,
                mode="range",
                lo=score_bound(lo, "-inf"),
                hi=score_bound(hi, "+inf"),
                offset=offset,
                count=count,
                descending=int(descending),
                after_score=after[0] if after else "",
                after_id=after[1] if after else "",
            ),
            keys=index.keys,
        )
        cursor = (last_score, last_id) if last_score is not None else None
        return [raw.decode() for raw in matched], int(examined), cursor

    def count(
        self,
        status: str | None = None,
        destination: str | None = None,
        *,
        min_score: float | None = None,
        max_score: float | None = None,
    ) -> int:
        """How many messages have this status and/or destination (ZCARD, or ZCOUNT with
        bounds, per destination: O(log N) each)."""
        return self.count_range(self.index(status, destination), min_score, max_score)

    def count_range(self, index: Index, lo: float | None = None, hi: float | None = None) -> int:
        """Entries of an index within a score range: ZCARD without bounds, else ZCOUNT
        (O(log N)), per sorted set, in one round trip."""
        pipe = self.connection.pipeline(transaction=False)
        for key in index.keys:
            if lo is None and hi is None:
                pipe.zcard(key)
            else:
                pipe.zcount(key, score_bound(lo, "-inf"), score_bound(hi, "+inf"))
        counts: list[int] = pipe.execute()  # ZCARD or ZCOUNT per sorted set
        return sum(counts)

    def counts(self, destination: str | None = None) -> dict[str, int]:
        """Message count per status, of one destination or all (one pipelined ZCARD per
        status and destination, O(1) each)."""
        names = [destination] if destination is not None else self.destinations()
        return sum_counts(self.counts_by_destination(names).values())

    def counts_by_destination(self, destinations: Iterable[str]) -> dict[str, dict[str, int]]:
        """Per destination, the message count per status: one pipeline of O(1) ZCARDs."""
        names = list(destinations)
        pipe = self.connection.pipeline(transaction=False)
        self.queue_status_counts(pipe, names)
        return self.parse_status_counts(names, pipe.execute())

    def queue_status_counts(self, pipe: Any, destinations: Sequence[str]) -> None:
        """Add to ``pipe`` one ZCARD per destination and status (in that order), for
        :meth:`parse_status_counts`: a caller that reads more in the same round trip."""
        for destination in destinations:
            for status in STATUSES:
                pipe.zcard(self.keys.status(status, destination))

    @staticmethod
    def parse_status_counts(destinations: Sequence[str], cards: Sequence[int]) -> dict[str, dict[str, int]]:
        """The replies of :meth:`queue_status_counts` as destination -> status -> count."""
        n = len(STATUSES)
        return {
            d: dict(zip(STATUSES, (int(c) for c in cards[i * n : (i + 1) * n]), strict=True))
            for i, d in enumerate(destinations)
        }

    def count_past_retention(self, retention: dict[str, float | None], now: float) -> int:
        """Messages kept longer than ``retention`` (status -> seconds, None = for ever)
        allows: the purge backlog. One ZCOUNT per status and destination (O(log N))."""
        names = self.destinations()
        pipe = self.connection.pipeline(transaction=False)
        for status, seconds in retention.items():
            if seconds is not None:
                for name in names:
                    pipe.zcount(self.keys.status(status, name), "-inf", repr(now - seconds))
        counts: list[int] = pipe.execute()  # ZCOUNT per status with a retention and destination
        return sum(counts)

    def destinations(self) -> list[str]:
        """Names of every destination a message was ever sent to, sorted."""
        return sorted(
            d.decode() for d in cast("set[bytes]", self.connection.smembers(self.keys.destinations))
        )

    def oldest(
        self, status: str, destination: str | None = None, *, among: Iterable[str] | None = None
    ) -> tuple[str, float] | None:
        """The (id, score) with the lowest score in a status index (of ``destination``,
        of the destinations ``among``, or of every one), or None if empty. One round trip
        (one ``ZRANGE`` of one entry per destination)."""
        keys = (
            self.index(status, destination).keys
            if among is None
            else tuple(self.keys.status(status, d) for d in among)
        )
        return self._lowest(keys)

    def oldest_parked(self, destinations: Iterable[str]) -> tuple[str, float] | None:
        """The (id, due score) of the parked message due first among ``destinations``
        (held while paused, disabled or its breaker is open), or None when none is
        parked. One round trip (one ``ZRANGE`` of one entry per destination)."""
        return self._lowest(tuple(self.keys.parked(d) for d in destinations))

    def beat(self, member: str, ttl: float, now: float) -> None:
        """Say that the ``outbox_worker`` ``member`` (``host:pid``) runs its housekeeping,
        for ``ttl`` seconds from ``now`` (epoch seconds): the shared heartbeat
        (``outbox:housekeeping``, expiring) and its own entry in ``outbox:workers`` (scored
        by when it expires); entries expired over :data:`WORKER_HEARTBEAT_KEPT` seconds ago
        are dropped. One round trip.

        Raises:
            redis.exceptions.RedisError: Redis could not be reached.
        """
        pipe = self.connection.pipeline(transaction=False)
        pipe.set(self.keys.heartbeat(), member, px=max(1, int(ttl * 1000)))
        pipe.zadd(self.keys.workers, {member: now + ttl})
        pipe.zremrangebyscore(self.keys.workers, "-inf", repr(now - WORKER_HEARTBEAT_KEPT))
        pipe.execute()

    def worker_heartbeats(self) -> dict[str, float]:
        """``host:pid`` of each ``outbox_worker`` that beat lately -> when its heartbeat
        expires (or expired), epoch seconds (one ``ZRANGE``; see :meth:`beat`).

        Raises:
            redis.exceptions.RedisError: Redis could not be reached.
        """
        rows = cast(ScoredMembers, self.connection.zrange(self.keys.workers, 0, -1, withscores=True))
        return {raw.decode(): score for raw, score in rows}

    def _lowest(self, keys: Sequence[str]) -> tuple[str, float] | None:
        """The (member, score) with the lowest score over the sorted sets ``keys``."""
        if not keys:
            return None
        pipe = self.connection.pipeline(transaction=False)
        for key in keys:
            pipe.zrange(key, 0, 0, withscores=True)
        firsts = [rows[0] for rows in cast(list[ScoredMembers], pipe.execute()) if rows]
        if not firsts:
            return None
        raw, score = min(firsts, key=lambda row: (row[1], row[0]))
        return raw.decode(), score

    def iter_ids(
        self,
        status: str | None = None,
        destination: str | None = None,
        *,
        batch: int = 1000,
        min_score: float | None = None,
        max_score: float | None = None,
    ) -> Iterator[list[str]]:
        """Yield every matching id, ``batch`` at a time: one destination after another
        (sorted by name), oldest score first within each.

        Walks each index by score with an exclusive lower bound, so ids that leave the
        index meanwhile (a bulk action moving them) do not make it skip others.
        """
        for key in self.index(status, destination).keys:
            yield from self._walk_by_score(key, batch, min_score, max_score)

    def _walk_by_score(
        self, key: str, batch: int, min_score: float | None, max_score: float | None
    ) -> Iterator[list[str]]:
        lo, hi = score_bound(min_score, "-inf"), score_bound(max_score, "+inf")
        seen_at_score: set[str] = set()
        last_score: float | None = None
        while True:
            rows = cast(
                ScoredMembers,
                self.connection.zrangebyscore(
                    key, lo, hi, start=0, num=batch + len(seen_at_score), withscores=True
                ),
            )
            ids = []
            for raw, score in rows:
                member = raw.decode()
                if score == last_score and member in seen_at_score:
                    continue
                if score != last_score:
                    last_score, seen_at_score = score, set()
                seen_at_score.add(member)
                ids.append(member)
                if len(ids) == batch:
                    break
            if not ids:
                return
            yield ids
            lo = repr(last_score)

    def due(self, status: str, before: float, limit: int = 1000) -> list[tuple[str, float]]:
        """Up to ``limit`` (id, score) pairs in a status index (every destination) with
        score <= ``before``, lowest score first. One round trip."""
        pipe = self.connection.pipeline(transaction=False)
        for key in self.index(status).keys:
            pipe.zrangebyscore(key, "-inf", repr(before), start=0, num=limit, withscores=True)
        rows = [row for found in cast(list[ScoredMembers], pipe.execute()) for row in found]
        rows.sort(key=lambda row: (row[1], row[0]))
        return [(raw.decode(), score) for raw, score in rows[:limit]]

    def stats(self, outcomes: Iterable[str], minutes: Sequence[int]) -> dict[str, list[int]]:
        """Per-minute outcome counters: outcome -> counts for each minute (epoch // 60)."""
        outcomes = list(outcomes)
        pipe = self.connection.pipeline(transaction=False)
        for outcome in outcomes:
            for minute in minutes:
                pipe.get(self.keys.stats(outcome, minute))
        values: list[bytes | None] = pipe.execute()  # GET per outcome and minute
        out: dict[str, list[int]] = {}
        for i, outcome in enumerate(outcomes):
            row = values[i * len(minutes) : (i + 1) * len(minutes)]
            out[outcome] = [int(v) if v else 0 for v in row]
        return out

    SCHEMA = 3  # 2: per-queue due indexes; 3: no index across destinations, message record a string

    def upgrade(self, batch: int = 1000) -> int:
        """Bring records written by an older version up to :attr:`SCHEMA` (idempotent).

        Version 0.1 kept no due index: its ``pending`` and ``retrying`` messages are put
        in their queue's due index (``lua/backfill.lua``). Older versions (schema < 3)
        also kept indexes across destinations (``outbox:created``,
        ``outbox:status:<status>``): every id in them is in its destination's index too,
        so they are deleted (``UNLINK``: freed in the background). Message records
        written as hashes by older versions stay as they are: every reader accepts them.
        Returns how many messages were put in a due index (0 when every one already was,
        as on a new Redis).
        """
        key = f"{self.keys.prefix}:schema"
        schema = int(self.connection.get(key) or 0)
        if schema >= self.SCHEMA:
            return 0
        added = 0
        if schema < 2:
            for status in ("pending", "retrying"):
                first = 0
                while True:
                    reply = self.run_script(
                        "backfill", [self.keys.prefix, first, batch], keys=[self.keys.legacy_status(status)]
                    )
                    read, put = (int(x) for x in reply)
                    added += put
                    first += batch
                    if read < batch:
                        break
        self.connection.unlink(*self.keys.legacy_indexes(STATUSES))
        self.connection.set(key, self.SCHEMA)
        return added

    def drop_index_entry(self, status: str, message_id: str) -> None:
        """Remove an id from a status index of every destination (repairing an entry
        without a record, whose destination is no longer known)."""
        pipe = self.connection.pipeline(transaction=False)
        for key in self.index(status).keys:
            pipe.zrem(key, message_id)
        pipe.execute()

    def acquire_lock(self, name: str, token: str, ttl: float) -> bool:
        """Take a short lock (``SET NX PX``); True if this caller holds it now."""
        return bool(self.connection.set(self.keys.lock(name), token, nx=True, px=max(1, int(ttl * 1000))))


def sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts per status (of several destinations) added up, status by status."""
    total = dict.fromkeys(STATUSES, 0)
    for one in counts:
        for status, n in one.items():
            total[status] += n
    return total


def score_bound(value: float | None, default: str, exclusive: bool = False) -> str:
    """A sorted-set score bound for ZCOUNT/ZRANGEBYSCORE: ``default`` when None, ``(x`` when exclusive."""
    if value is None:
        return default
    return f"({value!r}" if exclusive else repr(value)
