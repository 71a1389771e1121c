"""A worker's round trip (:meth:`~outbox.store.repository.MessageRepository.outcomes_and_claim`):
record its attempts' outcomes in destination health, write the outcomes, and claim its
next messages, as named steps of one :class:`Exchange` on a typed
:class:`ExchangeRequest` (``docs/architecture.md``, "Delivery: the claim loop" and
"Partitions").

With one partition every key is in one place, and the exchange is one pipeline of three
scripts (:meth:`Exchange.one_round_trip`: ``lua/health.lua``, ``lua/transition.lua``, and
``lua/claim.lua`` per ask). With more, a message's keys are in its partition's slot and
its destination's state in the destination's home slot, so the same work is five steps,
one call per slot each (:meth:`Exchange.in_steps`):

1. :meth:`Exchange.write_health`: ``lua/health.lua`` per destination with outcomes (its
   home slot: health, breaker, the end of each attempt's grant); it says which
   destinations hold their messages;
2. :meth:`Exchange.write_and_pick`: ``lua/transition.lua`` per partition with outcomes,
   then ``lua/pick.lua`` per partition asked (read only: the due entries a claim would
   look at; after the transitions on each node, so a retry due at once is seen);
3. :meth:`Exchange.gate`: ``lua/gate.lua`` per destination met in the picks: what the
   claim may do with each message, the attempts it lets go granted;
4. :meth:`Exchange.apply_claims`: ``lua/claim_apply.lua`` per partition picked: the
   gates' answers applied to the messages still where the pick saw them;
5. :meth:`Exchange.give_back`: the grants the claims could not use given back, the
   probes claimed registered.

Each step handles the outage of one slot (``TRYAGAIN`` while a legacy migration holds it
half-moved, a primary away: :data:`~outbox.store.client.outages.PARTITION_UNAVAILABLE`) where it
happens, as that slot's alone; the other slots' writes stand:

* a destination whose health call fails: its changes are not sent (health goes first: it
  may open the breaker, which parks instead of charging a retry),
  ``ChangeResult.unwritten == "destination"``;
* a partition whose transition fails: its changes are unwritten (``"partition"``);
* a partition whose pick or claim fails: it claims nothing (:attr:`Claim.error`), and
  the grants its gate answers gave are given back (unless the call may have run);
* a destination whose gate fails: its messages are left due for a later claim.

The caller writes unwritten changes again later; each write is safe to run twice
(``lua/health.lua``'s per-run mark, :attr:`ChangeResult.earlier`). Any other error (a
bug) is raised.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox.store.base import ScriptCall, first_of, queue_first
from outbox.store.client.outages import PARTITION_UNAVAILABLE, may_have_run
from outbox.store.destination_state import DestinationState, RunMark, health_args
from outbox.store.endpoint_versions import AdminState
from outbox.store.keys import Keys
from outbox.store.messages import (
    Change,
    ChangeResult,
    Claim,
    ClaimOptions,
    MessageStore,
    parse_states,
    with_holding,
)
from outbox.store.scripts import named

logger = logging.getLogger("outbox")

#: What the pick reports per entry: id, score, status, destination, suspect ("1" or "").
PICK_WIDTH = 5

#: The entry of a claim's ``caps`` that caps each destination the caps do not name, each
#: on its own count (``lua/lib/gate.lua``): the worker names only the destinations it has
#: attempts of in flight (at most ``CONCURRENCY``) and the configured ones, so an
#: endpoint registered at runtime has the default share of ``MAX_IN_FLIGHT`` while the
#: claim's arguments do not grow with the number of endpoints. Not a valid destination
#: name (``outbox.destinations.config``).
OTHERS = "*"


def cap_of(caps: dict[str, int], destination: str) -> int | None:
    """Most messages of ``destination`` a claim under ``caps`` may take: its own entry,
    else the :data:`OTHERS` entry, else None (no cap)."""
    cap = caps.get(destination)
    return caps.get(OTHERS) if cap is None else cap


@dataclass(frozen=True)
class PartitionAsk:
    """One claim of an exchange: up to ``limit`` messages from ``partition`` (0 with one
    partition), at most ``caps[d]`` of destination ``d`` (``caps[OTHERS]`` of one not
    named; None: no caps). A ``limit`` of 0
    claims nothing and reports the partition's next due times."""

    partition: int
    limit: int
    caps: dict[str, int] | None = None


@dataclass(frozen=True)
class ExchangeRequest:
    """What one exchange writes and claims.

    Attributes:
        queue: the queue claimed from.
        now: epoch seconds of the exchange (``updated_at``, due times, health minute).
        lease: the claim's lease token (also the gates' grants: ``lease|id``).
        deadline: epoch seconds when the claim's lease ends.
        asks: the claims, one per partition asked (at least one).
        changes: the outcomes' status changes (compare-and-set on their lease).
        outcomes: the outcomes as ``lua/health.lua`` records them
            (:func:`~outbox.store.destination_state.health_args`).
        breaker_config: JSON destination -> breaker settings.
        limits: JSON of the destinations' limits
            (:func:`outbox.destinations.config.limits_json`).
        quarantine: claim from the quarantine lane (a suspect, alone).
        slack: seconds ahead of now a message counts as due.
        scan: due entries a claim looks at (None: ``limit * 2 + 8``).
        run: the worker run's token; ``horizon``: its lease (seconds): health counts an
            outcome written again once; ``sent``: the highest outcome number an earlier
            exchange of the run carried, None if unknown
            (:class:`~outbox.store.destination_state.RunMark`).
    """

    queue: str
    now: float
    lease: str
    deadline: float
    asks: Sequence[PartitionAsk]
    changes: Sequence[Change] = ()
    outcomes: Sequence[Sequence[Any]] = ()
    breaker_config: str = "{}"
    limits: str = "{}"
    quarantine: bool = False
    slack: float = 0.0
    scan: int | None = None
    run: str = ""
    horizon: float = 0.0
    sent: int | None = None

    def __post_init__(self) -> None:
        if not self.asks:
            raise ValueError("an exchange asks at least one partition (limit 0: its due times only)")

    @property
    def run_mark(self) -> RunMark:
        """The run's part in ``lua/health.lua``."""
        return RunMark(self.run, self.horizon, self.sent)

    @property
    def lane(self) -> str:
        """The lane argument of the claim scripts: "q" (quarantine) or ""."""
        return "q" if self.quarantine else ""


@dataclass
class ExchangeReply:
    """What an exchange did: one :class:`ChangeResult` per change and one :class:`Claim`
    per ask, in order; the health script's destination events are in the first claim's
    :attr:`Claim.events`."""

    results: list[ChangeResult]
    claims: list[Claim]


@dataclass
class _Picked:
    """Step 2 to 4's state for one partition asked: what its pick saw and what its claim
    applies (per entry ``[id, action, at]``; an action "" is the gate's answer)."""

    limit: int
    rows: list[bytes] = field(default_factory=list)
    next_due: bytes | None = None
    next_suspect: bytes | None = None
    plan: list[list[str]] = field(default_factory=list)
    touched: dict[str, None] = field(default_factory=dict)  # keys its claim_apply may touch
    capped: set[str] = field(default_factory=set)  # destinations met at their cap, left due


class ExchangeStore(MessageStore, DestinationState):
    """What an :class:`Exchange` runs on: the message and destination-state parts of the
    repository, and the reads only the exchange needs
    (:class:`~outbox.store.partitioned.PartitionedMessageStore` is one)."""

    def claim_apply_keys(self, message_id: str, destination: str) -> list[str]:
        """The keys ``lua/claim_apply.lua`` may touch for a message its pick saw, declared
        after its two (the script reads only those): the message's records and its
        partition's status and parked indexes of its destination. Declared, a slot held
        half-moved answers ``TRYAGAIN`` before the script runs, instead of the script
        aborting at the first key that moved ("non local key"), its earlier writes kept."""
        part = self.keys.of(message_id)
        return [
            self.keys.resend(message_id),
            self.keys.message(message_id),
            *(part.status(status, destination) for status in ("pending", "retrying", "sending")),
            part.parked(destination),
        ]

    def first_scores(
        self, queue: str, partitions: Sequence[int]
    ) -> dict[int, tuple[float | None, float | None]]:
        """Per partition of ``partitions``: when its first due message and its first suspect
        are due (None: none). One round trip."""
        if not partitions:
            return {}
        pipe = self.connection.pipeline(transaction=False)
        for partition in partitions:
            part = self.keys.partition(partition)
            queue_first(pipe, part.due(queue))
            queue_first(pipe, part.quarantine(queue))
        firsts = [first_of(reply) for reply in pipe.execute()]
        out: dict[int, tuple[float | None, float | None]] = {}
        for i, p in enumerate(partitions):
            due, suspect = firsts[2 * i], firsts[2 * i + 1]
            out[p] = (due[1] if due else None, suspect[1] if suspect else None)
        return out


class Exchange:
    """One exchange of ``store`` for ``request`` (see the module). :meth:`run` once."""

    def __init__(self, store: ExchangeStore, request: ExchangeRequest) -> None:
        self.store = store
        self.request = request
        self.keys = store.keys
        self.results = [ChangeResult(c.id, False, "") for c in request.changes]
        self.events: list[str] = []
        self.holding: set[str] = set()
        self.picked: dict[int, _Picked] = {}  # partition -> its pick, for the asks with a limit
        self.refused: dict[int, Exception] = {}  # partition -> the outage its pick or claim met
        # destination -> [(partition, id, score)] the gate is asked about
        self.candidates: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
        self.answers: dict[str, tuple[str, str]] = {}  # id -> the gate's (action, at)
        self.unused: dict[str, list[str]] = defaultdict(list)  # destination -> ids whose grant goes back
        self.applied: dict[int, Any] = {}  # partition -> claim_apply's reply
        self.states: dict[str, AdminState] = {}  # endpoints' states the gates read

    def run(self) -> ExchangeReply:
        """The exchange: one round trip with one partition, else the five steps."""
        if not self.keys.partitioned:
            return self.one_round_trip()
        return self.in_steps()

    # -- one partition ------------------------------------------------------------------

    def one_round_trip(self) -> ExchangeReply:
        """With one partition: ``lua/health.lua``, ``lua/transition.lua`` and
        ``lua/claim.lua`` per ask, in order, in one pipeline.

        Raises:
            redis.exceptions.RedisError: the pipeline failed (all of it is then to be
                sent again: every write in it is safe to run twice)."""
        r, store = self.request, self.store
        calls: list[ScriptCall] = []
        if r.outcomes:
            args = health_args(
                self.keys, store.events_channel, r.outcomes, r.breaker_config, r.now, r.run_mark
            )
            calls.append(("health", args, [self.keys.probes]))
        if r.changes:
            calls.append(
                (
                    "transition",
                    store.transition_args(r.changes, r.now),
                    store.transition_keys(r.changes, r.now),
                )
            )
        for ask in r.asks:
            options = ClaimOptions(
                lease=r.lease,
                deadline=r.deadline,
                limit=ask.limit,
                caps=ask.caps,
                due_slack=r.slack,
                scan=r.scan,
                limits=r.limits,
                quarantine=r.quarantine,
            )
            args = store.claim_args(r.queue, r.now, options, ask.partition)
            calls.append(("claim", args, store.claim_keys(r.queue, ask.partition)))
        replies = store.run_scripts(calls)
        first = len(calls) - len(r.asks)
        results = store.parse_transition(r.changes, replies[1 if r.outcomes else 0]) if r.changes else []
        claims = [store.parse_claim(reply) for reply in replies[first:]]
        if r.outcomes:
            claims[0].events = [e.decode() for e in replies[0]]
        return ExchangeReply(results, claims)

    # -- more partitions ----------------------------------------------------------------

    def in_steps(self) -> ExchangeReply:
        """With more than one partition: the five steps of the module, in order."""
        sent = self.write_health()
        self.write_and_pick(sent)
        self.gate()
        self.apply_claims()
        claims = self.claims()
        self.give_back(claims)
        if claims:
            claims[0].events = self.events
        return ExchangeReply(self.results, claims)

    def write_health(self) -> list[int]:
        """Step 1: the outcomes' health, one call per destination in its home slot
        (:meth:`~outbox.store.destination_state.DestinationState.record_health`); sets
        ``events`` and ``holding`` (the destinations that hold their messages now).

        Returns:
            The positions of the changes to write now: those of a destination whose health
            call met an outage are marked ``unwritten = "destination"`` and left out.

        Raises:
            redis.exceptions.RedisError: a call failed for another reason (a bug), or the
                probe times (a key across the deployment) could not be written."""
        r = self.request
        unhealthy: dict[str, Exception] = {}
        if r.outcomes:
            self.events, self.holding, unhealthy = self.store.record_health(
                r.outcomes, r.breaker_config, r.now, r.run_mark
            )
        sent = []
        for i, change in enumerate(r.changes):
            if change.destination and change.destination in unhealthy:
                self.results[i].unwritten = "destination"
            else:
                sent.append(i)
        return sent

    def write_and_pick(self, sent: Sequence[int]) -> None:
        """Step 2: the changes at positions ``sent``, one ``lua/transition.lua`` call per
        partition (told which destinations hold their messages), then one read-only
        ``lua/pick.lua`` per partition asked for messages, in one round trip (after the
        transitions on each node, so a retry due at once is seen). Sets ``results`` (a
        partition whose transition met an outage: ``unwritten = "partition"``) and
        ``picked`` (a partition whose pick met an outage: in ``refused``).

        Raises:
            redis.exceptions.RedisError: a call failed for another reason (a bug)."""
        r, store = self.request, self.store
        changes = r.changes
        groups = (
            [[sent[j] for j in g] for g in store.by_partition([changes[i].id for i in sent])] if sent else []
        )
        calls: list[ScriptCall] = []
        for positions in groups:
            chunk = [changes[i] for i in positions]
            args = with_holding(store.transition_args(chunk, r.now), self.holding)
            calls.append(("transition", args, store.transition_keys(chunk, r.now)))
        asked = [a for a in r.asks if a.limit > 0]
        for ask in asked:
            part = self.keys.partition(ask.partition)
            args = named(
                prefix=self.keys.prefix,
                parts=self.keys.partitions,
                now=repr(r.now),
                slack=repr(r.slack),
                scan=r.scan or ask.limit * 2 + 8,
                lane=r.lane,
            )
            calls.append(("pick", args, [part.due(r.queue), part.quarantine(r.queue)]))
        replies = store.run_scripts(calls, errors=True) if calls else []
        for reply in replies:
            if isinstance(reply, Exception) and not isinstance(reply, PARTITION_UNAVAILABLE):
                raise reply  # a bug, not an outage
        for positions, reply in zip(groups, replies[: len(groups)], strict=True):
            if isinstance(reply, Exception):  # its partition cannot take it now: written later
                for i in positions:
                    self.results[i].unwritten = "partition"
                continue
            for i, result in zip(
                positions, store.parse_transition([changes[i] for i in positions], reply), strict=True
            ):
                self.results[i] = result
        for ask, reply in zip(asked, replies[len(groups) :], strict=True):
            if isinstance(reply, Exception):
                self.refused[ask.partition] = reply
            else:
                rows, next_due, next_suspect = reply
                self.picked[ask.partition] = _Picked(ask.limit, rows, next_due, next_suspect)

    def gate(self) -> None:
        """Step 3: plan each picked partition's claim (an entry that moved on: "stale"; a
        suspect in the due index or the reverse: "lane"; up to its ask's limit: the
        gate's answer), then ask each destination met its gate (``lua/gate.lua``, in its
        home slot, under the asks' caps summed), in one round trip. Sets ``answers``; a
        destination whose gate met an outage has its messages answered "stale" (a
        message still due is left as it is), and, when the call may have run, their
        grants given back (step 5).

        Raises:
            redis.exceptions.RedisError: a call failed for another reason (a bug)."""
        r, store = self.request, self.store
        caps: dict[str, int] = {}
        for ask in r.asks:
            for d, c in (ask.caps or {}).items():
                caps[d] = caps.get(d, 0) + c
        planned: Counter[str] = Counter()  # candidates of each destination, across partitions
        for partition, picked in self.picked.items():
            wanted = 0
            for i in range(0, len(picked.rows), PICK_WIDTH):
                mid, score, status, dest, suspect = (v.decode() for v in picked.rows[i : i + PICK_WIDTH])
                picked.touched.update(dict.fromkeys(store.claim_apply_keys(mid, dest)))
                if status not in ("pending", "retrying"):
                    picked.plan.append([mid, "stale", ""])
                elif (suspect == "1") != (r.lane == "q"):
                    picked.plan.append([mid, "lane", ""])
                elif (cap := cap_of(caps, dest)) is not None and planned[dest] >= cap:
                    # at its cap in this exchange: left due (not in the plan: its claim
                    # would read it for nothing), reported capped, and not counted against
                    # the limit, so the claim goes on to other destinations' messages (as
                    # claim.lua's scan does with one partition)
                    picked.capped.add(dest)
                elif wanted < picked.limit:
                    wanted += 1
                    planned[dest] += 1
                    picked.plan.append([mid, "", ""])  # the gate's answer
                    self.candidates[dest].append((partition, mid, score))
        limits = json.loads(r.limits or "{}")
        names = list(self.candidates)
        calls: list[ScriptCall] = []
        for d in names:
            cap = cap_of(caps, d)
            args = named(
                prefix=self.keys.prefix,
                parts=self.keys.partitions,
                destination=d,
                now=repr(r.now),
                lease=r.lease,
                deadline=repr(r.deadline),
                limits=json.dumps({d: limits[d]} if d in limits else {}),
                cap="" if cap is None else cap,
            )
            for _, mid, score in self.candidates[d]:
                args += [mid, score]
            calls.append(("gate", args, [self.keys.dest(d), self.keys.gcra(d), self.keys.inflight(d)]))
        for d, reply in zip(names, store.run_scripts(calls, errors=True) if calls else [], strict=True):
            if isinstance(reply, Exception):
                if not isinstance(reply, PARTITION_UNAVAILABLE):
                    raise reply  # a bug, not an outage
                for _, mid, _ in self.candidates[d]:
                    self.answers[mid] = ("stale", "")
                    if may_have_run(reply):
                        self.unused[d].append(mid)
                continue
            *answers, states = reply
            self.states.update(parse_states(states))
            for (_, mid, _), j in zip(self.candidates[d], range(0, len(answers), 2), strict=True):
                self.answers[mid] = (answers[j].decode(), answers[j + 1].decode())

    def apply_claims(self) -> None:
        """Step 4: each picked partition's plan, with the gates' answers, applied by
        ``lua/claim_apply.lua`` in its slot (one round trip, one pipeline per primary).
        Sets ``applied``; a partition whose call met an outage claims nothing now (in
        ``refused``) and, unless its call may have run (a timeout), the grants its
        messages got are given back (step 5).

        Raises:
            redis.exceptions.RedisError: a call failed for another reason (a bug)."""
        r = self.request
        calls: list[ScriptCall] = []
        order = []
        for partition, picked in self.picked.items():
            if not picked.plan:
                continue
            flat: list[str] = []
            for mid, action, at in picked.plan:
                if not action:
                    action, at = self.answers[mid]
                flat += [mid, action, at]
            part = self.keys.partition(partition)
            args = named(
                prefix=self.keys.prefix,
                parts=self.keys.partitions,
                now=repr(r.now),
                lease=r.lease,
                deadline=repr(r.deadline),
                lane=r.lane,
                **self.store.payloads_held(partition),
            )
            calls.append(
                (
                    "claim_apply",
                    [*args, *flat],
                    [part.due(r.queue), part.quarantine(r.queue), *picked.touched],
                )
            )
            order.append(partition)
        destination_of = self.destination_of()
        for partition, reply in zip(
            order, self.store.run_scripts(calls, errors=True) if calls else [], strict=True
        ):
            if not isinstance(reply, Exception):
                self.applied[partition] = reply
                continue
            if not isinstance(reply, PARTITION_UNAVAILABLE):
                raise reply  # a bug, not an outage
            self.refused[partition] = reply
            if not may_have_run(reply):
                for mid, _, _ in self.picked[partition].plan:
                    if mid in destination_of:
                        self.unused[destination_of[mid]].append(mid)

    def destination_of(self) -> dict[str, str]:
        """id -> destination of each message a gate was asked about."""
        return {mid: d for d, rows in self.candidates.items() for _, mid, _ in rows}

    def claims(self) -> list[Claim]:
        """One :class:`Claim` per ask, in order: the messages its partition's claim took;
        for a partition asked for none, its first due times (one round trip for those);
        for one whose pick or claim failed, none (with its ``error``; still due: what it
        picked). Adds the grants a claim could not use to ``unused``."""
        r = self.request
        destination_of = self.destination_of()
        idle = [
            a.partition for a in r.asks if a.partition not in self.picked and a.partition not in self.refused
        ]
        firsts = self.store.first_scores(r.queue, idle)
        claims: list[Claim] = []
        for ask in r.asks:
            p = ask.partition
            if p in self.applied:
                reply = self.applied[p]
                claim = self.store.parse_claim(reply[:6])
                claim.states = self.states
                claim.capped += sorted(self.picked[p].capped - set(claim.capped))
                for mid in reply[6]:
                    self.unused[destination_of[mid.decode()]].append(mid.decode())
            elif p in self.picked:
                picked = self.picked[p]
                next_due = picked.rows[1] if p in self.refused and picked.rows else picked.next_due
                claim = Claim(
                    [],
                    float(next_due) if next_due else None,
                    next_suspect=float(picked.next_suspect) if picked.next_suspect else None,
                    error=self.refused.get(p),
                    capped=sorted(picked.capped),
                )
            elif p in self.refused:
                claim = Claim([], None, error=self.refused[p])
            else:
                first_due, first_suspect = firsts[p]
                claim = Claim([], first_due, next_suspect=first_suspect)
            claims.append(claim)
        return claims

    def give_back(self, claims: Sequence[Claim]) -> None:
        """Step 5: the grants in ``unused`` given back (their ``lease|id`` entries removed
        from each destination's in-flight set) and the probes the ``claims`` took
        registered (``outbox:{g}:probes``), in one round trip of single-key writes. An
        outage here is logged, not raised: the grants end with the lease, and the next
        claim finds the probe."""
        r = self.request
        destination_of = self.destination_of()
        probed = {mid for mid, (action, _) in self.answers.items() if action == "probe"}
        taken = [m.id for c in claims for m in c.messages if m.id in probed]
        if not self.unused and not taken:
            return
        pipe = self.store.connection.pipeline(transaction=False)
        for d, ids in self.unused.items():  # this claim's own grants (lease|id: lua/gate.lua)
            if ids:
                pipe.zrem(self.keys.inflight(d), *(Keys.inflight_member(r.lease, i) for i in ids))
        for mid in taken:
            pipe.zadd(self.keys.probes, {destination_of[mid]: r.deadline})
        try:
            pipe.execute()
        except PARTITION_UNAVAILABLE:
            logger.warning("outbox: could not give back unused grants now", exc_info=True)
