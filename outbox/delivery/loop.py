"""The claim loop: claim due messages, attempt them concurrently, record each outcome
(attempts: :mod:`outbox.delivery.attempts`; outcomes: :mod:`outbox.delivery.outcomes`).

:func:`run` is the body of the wake-up job ``outbox.jobs.deliver(queue)``. It repeats
one cycle until nothing is due (or its time budget is spent):

1. **one round trip** writes the outcomes decided since the last cycle (attempt record,
   status change, event: ``lua/transition.lua``, a compare-and-set on the lease) and
   claims as many due messages as there are free slots (``lua/claim.lua``:
   ``pending``/``retrying`` -> ``sending`` with a lease of ``VISIBILITY_TIMEOUT``);
2. the claimed messages start in attempt threads, ``CONCURRENCY`` at a time, at most
   ``MAX_IN_FLIGHT`` per destination (the claim skips a destination at its cap); a
   destination whose cap is the default, alone busy and succeeding quickly, may borrow
   the idle slots above its cap, up to ``CONCURRENCY`` minus a reserve (see
   :func:`lend_reserve`);
3. it waits until an attempt finishes (and, when that attempt took under
   ``GATHER_WAIT`` and fewer than half of those in flight have finished, ``GATHER_WAIT``
   more for the others, so quick attempts share one write) and decides its outcome
   (success, retry with backoff, or dead letter). An attempt still running
   ``WATCH_GRACE`` after its transport's deadline (``Transport.longest_attempt()``) is
   given up: a retryable ``deadline`` failure, its thread left to finish on its own (a
   callable or an email runs directly in the attempt thread, watched: see
   :mod:`outbox.transports.deadlines`).

No attempt starts while an outcome decided before it is unwritten, and outcomes are
written as soon as they are decided (the next cycle starts at once). So a process that
dies (SIGKILL, a poison message calling ``os._exit``) repeats only the attempts that
were in flight: the recovery sweep takes those back after their lease with a ``lost``
attempt. The exception: with partitions, outcomes a partition cannot take now (its slot
half-moved, its primary away) wait in the run (``WorkerRun.unwritten``) and are written again
by a later exchange, while the run goes on with the other partitions; at its end the run
waits for them within their lease, then leaves them to the recovery sweep
(``WorkerRun.finish``; docs/architecture.md, "Delivery: the claim loop").

Whatever escapes the loop (Redis errors, RQ's job timeout), :func:`run` first waits
briefly for attempts in flight, writes every decided outcome (retrying while Redis is
unreachable, up to the lease), releases claimed messages that never started (no
attempt charged), and then re-raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from outbox.conf import endpoint_setting, outbox_settings
from outbox.delivery import attempts
from outbox.delivery.outcomes import announce, decide, health_outcome, log_attempt, rules_for
from outbox.delivery.partitions import Ask, PartitionPlan
from outbox.destinations import config, controls
from outbox.destinations.config import usable_destinations
from outbox.events import DestinationEvent, send_destination_events
from outbox.records import Message, Outcome, partition_of
from outbox.store import (
    OTHERS,
    Change,
    ChangeResult,
    Claim,
    ClaimOptions,
    ExchangeRequest,
    MessageRepository,
    PartitionAsk,
    cap_of,
    get_repository,
)
from outbox.store.background import wakeups
from outbox.store.client.outages import CLUSTER_IN_FLUX
from outbox.store.decisions import Decision, change_of
from outbox.store.endpoint_versions import AdminState
from outbox.transports import deadlines

logger = logging.getLogger("outbox")

HELD_WAIT = 1.0  # most seconds a run waits for messages a limit rescheduled, before it ends
UNPARK_BUDGET = 1.0  # seconds a run spends putting back what waited behind a closed breaker
DUE_SLACK = wakeups.DUE_SLACK  # a claim takes messages due up to this many seconds from now
LEASE_BUDGET = 0.5  # share of VISIBILITY_TIMEOUT after which a run claims nothing new
RUN_BUDGET = 10.0  # seconds a wake-up job keeps claiming before it hands over to a new job
IDLE_POLL = 0.1  # seconds between claims while slots are free and attempts are in flight
FAILSAFE_WAIT = 5.0  # seconds an interrupted run waits for attempts in flight
WATCH_GRACE = 0.2  # seconds past its transport's deadline after which a run gives an attempt up
GATHER_WAIT = 0.001  # seconds a run waits for more quick attempts to finish when fewer than half have
LEND_LATENCY = 1.0  # seconds: a destination borrows idle slots only while its attempts finish within this
#: Errors on which a run's writes are retried with backoff: Redis unreachable, or a
#: cluster moving a slot or failing over (``TRYAGAIN`` while a legacy migration has split a
#: partition's keys, redis-py's redirects exhausted, ``CLUSTERDOWN``).
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, *CLUSTER_IN_FLUX)
#: Attempts of this process given up at their deadline whose threads may still run: a
#: suspect is attempted only when none does (it must be alone in its process).
_abandoned: set[Future[Outcome]] = set()
STOP_WRITE_GRACE = 5.0  # seconds a stopping run keeps trying to write outcomes to an unreachable Redis
UNWRITTEN_RETRY = 0.2  # first seconds before outcomes a partition could not take are written again
UNWRITTEN_MAX_DELAY = 2.0  # most seconds between those tries (and between claims of a moving partition)
LEASE_MARGIN = 1.0  # seconds before a lease ends at which a run stops trying to write its outcome


class Stopping:
    """Whether this worker process was asked to stop (:class:`outbox.delivery.worker.StopRequest`)
    and since when: a run then claims nothing more, ends once its attempts in flight are
    decided, and tries to write their outcomes for at most :data:`STOP_WRITE_GRACE` seconds
    after the request while Redis is unreachable (instead of up to half the lease): an
    outcome it could not write is an attempt in flight lost, taken back by the recovery
    sweep after its lease and attempted again (at-least-once, as after a crash)."""

    def __init__(self) -> None:
        self.event = threading.Event()  # set while stopping (the worker waits on it for Redis)
        self.since = 0.0  # time.time() of the request

    def set(self) -> bool:
        """Record the request; True the first time (False when it was already set)."""
        if self.event.is_set():
            return False
        self.since = time.time()
        self.event.set()
        return True

    def clear(self) -> None:
        self.event.clear()
        self.since = 0.0

    def is_set(self) -> bool:
        return self.event.is_set()

    def write_deadline(self, deadline: float) -> float:
        """``deadline`` (epoch seconds), shortened to the stop's write grace while stopping."""
        return min(deadline, self.since + STOP_WRITE_GRACE) if self.is_set() else deadline


#: This process's stop request, as delivery runs see it.
STOPPING = Stopping()


# -- one attempt -----------------------------------------------------------------------


# -- deciding an outcome ------------------------------------------------------------------


def claim(queue: str, now: float | None = None, limit: int | None = None) -> list[Message]:
    """Claim up to ``limit`` (default ``BATCH_SIZE``) due messages of ``queue`` with a
    fresh lease, as a run does, without attempting them (for tools and tests).

    With more than one partition, the partitions are asked in turn.

    Returns:
        The claimed messages (status ``sending``).
    """
    now = time.time() if now is None else now
    repo = get_repository()
    lease, left = uuid.uuid4().hex, outbox_settings.BATCH_SIZE if limit is None else limit
    claimed: list[Message] = []
    for partition in repo.keys.partition_numbers():  # in turn, until the limit is reached
        if left <= 0:
            break
        options = ClaimOptions(
            lease=lease, deadline=now + outbox_settings.VISIBILITY_TIMEOUT, limit=left, due_slack=DUE_SLACK
        )
        messages = repo.claim(queue, now, partition, options).messages
        claimed += messages
        left -= len(messages)
    return claimed


# -- the run ------------------------------------------------------------------------------


def _quick(done: set[Future[Outcome]]) -> bool:
    """True when an attempt among ``done`` took less than :data:`GATHER_WAIT`."""
    return any(f.exception() is None and f.result().duration_ms < GATHER_WAIT * 1000 for f in done)


@dataclass
class RunReport:
    """What one :func:`run` did.

    Attributes:
        claimed: ids claimed and attempted.
        outcomes: id -> status written (``succeeded``, ``retrying``, ``failed``,
            ``parked``; also when a try of the exchange whose reply was lost wrote it),
            ``"stale"`` when the lease was lost before the outcome was written, or
            ``"unwritten"`` when its partition could not take it before its lease ended
            (a cluster slot moving): left ``sending`` for the recovery sweep.
        released: ids given back unattempted.
    """

    claimed: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "claimed": len(self.claimed),
            "released": len(self.released),
            "outcomes": dict(Counter(self.outcomes.values())),
        }


def _in_flight_limits() -> tuple[dict[str, int], set[str]]:
    """``MAX_IN_FLIGHT`` of each configured destination (a broken one is left uncapped:
    its attempts fail at once), and the names of those whose cap is the default (see
    :attr:`outbox.destinations.Destination.max_in_flight_default`)."""
    destinations = usable_destinations()
    return (
        {name: d.max_in_flight for name, d in destinations.items()},
        {name for name, d in destinations.items() if d.max_in_flight_default},
    )


def _endpoint_share() -> int | None:
    """``MAX_IN_FLIGHT`` of each endpoint registered at runtime (every destination not in
    settings: ``OUTBOX["MAX_IN_FLIGHT"]``, as
    :func:`outbox.destinations.config.endpoint_as_destination` gives it), or None when
    the project registers no endpoints (``OUTBOX["ENDPOINTS"]["SECRET_KEYS"]`` empty: none
    can be created), where a destination not in settings is one removed from them (left
    uncapped, as before endpoints). Claims pass it once, as the caps' :data:`OTHERS`
    entry, not once per endpoint."""
    if not endpoint_setting("SECRET_KEYS"):
        return None
    return max(1, int(outbox_settings.MAX_IN_FLIGHT))


def lend_reserve(concurrency: int) -> int:
    """Attempt slots a run keeps free for other destinations while it lends idle slots
    to one busy destination: a quarter of ``concurrency``, at least 1 (8 of the default
    32, so a destination whose cap is the default 16 may borrow up to 24).

    Why a quarter. A run lends only while every due message its claims meet belongs to
    the one destination, and stops at the first claim that meets another destination's
    (within :data:`IDLE_POLL` of it coming due at the head of the queue). The attempts it
    lent slots to keep them until they finish: normally within :data:`LEND_LATENCY`
    (lending needs the destination's attempts to have finished that fast), but until its
    transport's deadline (25 s for a webhook's defaults) if the receiver hangs just then.
    The reserve is what another destination has at once in that worst case: 8 slots is
    half of its own share of 16, where a reserve of 1 would let it through one attempt at
    a time for up to a deadline. The price is the busy destination's: it gets 24 of the
    32 slots, not all of them. Where the worker's CPU binds first that price does not
    show (a webhook answering in 50 ms on the benchmark's 2-CPU VM: 354/s out of the box,
    384/s at a tuned 32, 0.92x); where the pool binds it is the full quarter (answering
    in 300 ms: 78/s against 104/s, 0.75x; ``docs/benchmarks.md``). Meeting 0.9x there
    too would take a reserve of at most 3 of 32.
    """
    return max(1, concurrency // 4)


def merge_claims(claims: Sequence[Claim]) -> Claim:
    """The claims of one round trip (one per partition asked) as one :class:`Claim`:
    messages in due order (as one partition's claim gives them: by next attempt time,
    then id), ``held`` summed, ``capped`` joined, the earliest due times, the first
    claim's destination events, the endpoints' states their gates read together."""
    if len(claims) == 1:
        return claims[0]
    capped: list[str] = []
    for c in claims:
        capped += [d for d in c.capped if d not in capped]
    due = [c.next_due for c in claims if c.next_due is not None]
    suspects = [c.next_suspect for c in claims if c.next_suspect is not None]
    return Claim(
        sorted((m for c in claims for m in c.messages), key=lambda m: (m.next_attempt_at or 0.0, m.id)),
        min(due) if due else None,
        sum(c.rescheduled for c in claims),
        events=claims[0].events,
        capped=capped,
        next_suspect=min(suspects) if suspects else None,
        states={name: state for c in claims for name, state in c.states.items()},
    )


class WorkerRun:
    """State of one :func:`run`: attempts in flight and outcomes not yet written."""

    def __init__(self, queue: str, repo: MessageRepository, budget: float) -> None:
        self.queue = queue
        self.repo = repo
        self.concurrency = max(1, int(outbox_settings.CONCURRENCY))
        self.started = time.time()
        lease_budget = outbox_settings.VISIBILITY_TIMEOUT * LEASE_BUDGET
        self.claim_until = self.started + min(budget, lease_budget)
        self.in_flight: dict[Future[Outcome], Message] = {}
        self.give_up_at: dict[Future[Outcome], tuple[float, float, float]] = {}  # (when, deadline, started)
        # attempts in flight per destination (only destinations with one: see collect())
        self.per_destination: Counter[str] = Counter()
        self.decided: list[Decision] = []
        # Outcomes a partition (or their destination's home slot) could not take now (a
        # slot moving, a primary away), with why ("partition", "destination"): written
        # again with the next exchange from ``write_at`` on (backoff), meanwhile the run
        # goes on with the other partitions; at its end, a last wait (see finish()).
        self.unwritten: dict[str, tuple[Decision, str]] = {}
        self.write_at = 0.0
        self.write_delay = UNWRITTEN_RETRY
        self.lease_ends: dict[str, float] = {}  # message id -> its lease's end (epoch s)
        # Partitions whose last claim met an outage, and until when they are not asked.
        self.moving: dict[int, float] = {}
        self.moving_delay: dict[int, float] = {}
        # This run's token and the number of its last decided outcome: health counts an
        # outcome once when an exchange is written again (lua/health.lua, "run", "seq")
        self.token = uuid.uuid4().hex[:16]
        self.decisions = 0
        self.sent = 0  # the highest decision number an exchange carried (lua/health.lua's "sent")
        self.report = RunReport()
        self.next_due: float | None = None
        self.next_suspect: float | None = None  # when the queue's first suspect is due (quarantine index)
        self.quarantine_after = 0.0  # a quarantine claim found none it could take: not before then
        self.shared = False  # this run woke another worker for the suspects it could not take
        self.rescheduled = 0
        self.plan = PartitionPlan(repo.keys.partitions)  # which partitions each claim asks
        # The last claim left due messages in partitions it asked for none (or for a share
        # of 0 of their destination's cap) while the run had slots for them; claims in a
        # row that took nothing for that reason (at most one per partition, see loop()).
        self.left_due = False
        self.empty_retries = 0
        # Destinations the last short claim skipped at their MAX_IN_FLIGHT cap, and until
        # when claims look only for their freed slots (see :meth:`want`).
        self.capped: set[str] = set()
        self.capped_until = 0.0
        # The endpoints' states in Redis the last claim's gate read (Claim.states), for
        # start() to check against their rows.
        self.states: dict[str, AdminState] = {}
        self.limits, self.lendable = _in_flight_limits()
        # Every other destination's share (endpoints registered at runtime), or None.
        self.others = _endpoint_share()
        self.others_lendable = "MAX_IN_FLIGHT" not in outbox_settings.user_settings
        self.reserve = lend_reserve(self.concurrency)
        # The destination the last short claim met alone, at its cap (see :meth:`lending`).
        self.lent: str | None = None
        # Per destination, its attempts in this run that succeeded within LEND_LATENCY
        # since its last one that did not.
        self.streak: Counter[str] = Counter()
        self.started_at: dict[Future[Outcome], float] = {}
        self.breaker_config = config.breaker_config_json()
        self.rate_limits = config.limits_json()

    def caps(self) -> dict[str, int]:
        """Free attempt slots per configured destination (what a claim may take of each),
        with the idle slots lent to one busy destination (see :meth:`lending`).

        Endpoints registered at runtime have the same share (:attr:`others`): one entry
        per endpoint with attempts in flight in this run (at most ``CONCURRENCY`` of
        them), and one :data:`OTHERS` entry for all the rest, so a claim's arguments do
        not grow with the number of endpoints registered."""
        caps = {name: max(0, limit - self.per_destination[name]) for name, limit in self.limits.items()}
        if self.others is not None:
            for name, n in self.per_destination.items():
                if n > 0 and name not in caps:
                    caps[name] = max(0, self.others - n)
            caps[OTHERS] = self.others
        lent = self.lending(time.time())
        if lent is not None:
            others = len(self.in_flight) - self.per_destination[lent]
            caps[lent] = max(
                cap_of(caps, lent) or 0, self.concurrency - self.reserve - others - self.per_destination[lent]
            )
        return caps

    def limit_of(self, destination: str) -> int | None:
        """``destination``'s ``MAX_IN_FLIGHT`` in this run (None: uncapped)."""
        return self.limits.get(destination, self.others)

    def lending(self, now: float) -> str | None:
        """The destination this run lends its idle slots to now, or None.

        A destination whose ``MAX_IN_FLIGHT`` is the default (none set for it, nor
        globally, nor by its transport) has that cap as its share of the worker while
        destinations compete, not as a ceiling while slots sit idle. So when a claim came
        up short having met due messages of that destination alone, all beyond its cap
        (:meth:`note_claim`), its cap rises to ``CONCURRENCY`` minus :func:`lend_reserve`
        minus the other destinations' attempts in flight (the reserve stays free for
        their messages), while both hold:

        * its last ``MAX_IN_FLIGHT`` attempts in this run all succeeded, each within
          :data:`LEND_LATENCY`: a failing receiver gets no more slots than its share (its
          failures are the breaker's to judge, and more of them in flight only means
          more retries), nor does a slow one (lent slots must come back soon when
          another destination needs them); the run's own record is used, not the
          destination's health in Redis, because it is current to the attempt and costs
          no read;
        * none of its attempts in flight has run longer than :data:`LEND_LATENCY`.

        Lending ends at the first claim that meets a due message of another destination
        (claimed, or skipped at its cap); the attempts already over the cap keep their
        slots until they finish, and no new one starts above the cap until a claim finds
        the destination alone again. An explicit ``MAX_IN_FLIGHT`` is never exceeded,
        and the limits kept in Redis across workers (``RATE_LIMIT``, ``MAX_CONCURRENCY``,
        the breaker) apply to lent slots as to any (``lua/claim.lua``).
        """
        lent = self.lent
        if lent is None or self.streak[lent] < (self.limit_of(lent) or 1):
            return None
        for future, message in self.in_flight.items():
            if message.destination == lent and now - self.started_at.get(future, now) > LEND_LATENCY:
                return None
        return lent

    def note_claim(self, want: int, claimed: Sequence[Message], capped: Sequence[str]) -> None:
        """Start or end lending (see :meth:`lending`) from what a claim met: the
        destinations of the messages it took and of those it skipped at their cap."""
        met = {m.destination for m in claimed}.union(capped)
        if self.lent is not None and met - {self.lent}:
            self.lent = None  # another destination's message is due: it gets its share
        # A claim narrowed to the slots capped destinations freed (see want()) scans a few
        # entries at the head of the queue: meeting one of them there does not show that
        # the others have nothing due (they were capped, so they had), and lending to it
        # took their share (two busy destinations, one past its cap).
        narrowed_to_others = bool(self.capped - met)
        if (
            want
            and len(claimed) < want
            and len(met) == 1
            and len(capped) == 1
            and not narrowed_to_others
            and self.may_lend(capped[0])
        ):
            self.lent = capped[0]

    def may_lend(self, destination: str) -> bool:
        """Whether ``destination``'s cap is a share a run may lend idle slots above: a
        configured destination whose ``MAX_IN_FLIGHT`` is the default, or an endpoint
        while ``OUTBOX["MAX_IN_FLIGHT"]`` is unset."""
        if destination in self.limits:
            return destination in self.lendable
        return self.others is not None and self.others_lendable

    def want(self, free: int, caps: dict[str, int], now: float) -> int:
        """How many messages the next claim asks for: as many as there are free slots
        within the destinations' caps, at most ``BATCH_SIZE``.

        After a claim that took fewer than it asked for and skipped messages of
        destinations at their cap, the head of the queue holds only those destinations'
        messages (everything else it scanned was taken, parked or rescheduled out of it;
        newer messages sort behind). Claiming again for the other destinations' free
        slots would read the same entries (a ``HGETALL`` each) and take nothing: with one
        busy callable at a cap of 1 and other destinations configured, that was 40-70
        reads per delivered message. So until :data:`IDLE_POLL` has passed, a claim asks
        only for the slots those destinations freed (none: the run waits for an attempt to
        finish); then one claim looks at every destination again (a message of another
        destination that became due behind them waits at most that long, as between
        idle polls before).
        """
        if now >= self.claim_until or STOPPING.is_set():
            return 0
        if self.capped and now < self.capped_until:
            return min(int(outbox_settings.BATCH_SIZE), free, sum(cap_of(caps, d) or 0 for d in self.capped))
        self.capped.clear()
        # with endpoints, any number of destinations beyond those named may have due work
        room = sum(caps.values()) if caps and OTHERS not in caps else self.concurrency
        return min(int(outbox_settings.BATCH_SIZE), free, room)

    def lane(self, want: int, now: float) -> tuple[int, bool]:
        """``(how many to claim, from the quarantine lane?)`` for a run that could claim
        ``want``. A suspect (taken back from a lost worker) is attempted alone in its
        process, so that a crash it causes takes nothing else with it and a crash it
        does not cause cannot be blamed on it: nothing starts beside a suspect in
        flight; a due suspect waits until the attempts in flight are decided (no new
        ones start), then is claimed by itself. While an attempt given up at its deadline
        may still run in this process, suspects are left to other workers."""
        if not want:
            return 0, False
        if any(m.suspect for m in self.in_flight.values()):
            return 0, False
        if self.next_suspect is None or self.next_suspect > now + DUE_SLACK or now < self.quarantine_after:
            return want, False
        if self.in_flight:
            return 0, False
        _abandoned.difference_update([f for f in _abandoned if f.done()])
        if _abandoned:
            return want, False
        return 1, True

    def pending_writes(self, now: float) -> list[Decision]:
        """The decisions the next exchange writes: those decided since the last one, and
        the unwritten ones once their backoff (``write_at``) has passed. A fresh outcome of
        a destination whose health write waits (its home slot moving) waits with it (its
        health is counted in the order decided: lua/health.lua's per-run mark)."""
        if self.unwritten and now >= self.write_at:
            return [d for d, _ in self.unwritten.values()] + self.decided
        waiting = {d.message.destination for d, why in self.unwritten.values() if why == "destination"}
        if waiting:
            for d in [d for d in self.decided if d.message.destination in waiting]:
                self.decided.remove(d)
                self.unwritten[d.message.id] = (d, "destination")
        return list(self.decided)

    def write_and_claim(
        self, want: int, caps: dict[str, int] | None = None, quarantine: bool = False
    ) -> list[Message]:
        """Write decided outcomes and claim up to ``want`` messages (from the quarantine
        lane when ``quarantine``: see :meth:`lane`): one round trip.

        With more than one partition, a partition (or a destination's home slot) that
        cannot take its writes now (a slot held half-moved answers ``TRYAGAIN``, a primary
        away) holds back only its own outcomes (kept in ``unwritten``, written again with
        a later exchange after a backoff) and claims nothing for a while (``moving``); the
        other partitions' outcomes are written and announced, and their claims stand.

        When the whole round trip fails (Redis unreachable; with one partition, a slot
        moving), it is retried with backoff up to the earliest lease of the outcomes being
        written (so a decided outcome is not given up lightly). Then a connection error is
        raised (``REDIS_ERRORS``); a cluster in flux (``CLUSTER_IN_FLUX``) is not: the
        outcomes stay unwritten, the run claims nothing more and ends (:meth:`finish`)."""
        decided = self.pending_writes(time.time())
        changes = [change_of(d) for d in decided]
        outcomes = [[*health_outcome(d.outcome), d.seq] for d in decided if d.outcome is not None]
        top = max((d.seq for d in decided), default=0)
        give_up_at = STOPPING.write_deadline(
            time.time() + (outbox_settings.VISIBILITY_TIMEOUT * LEASE_BUDGET if changes else 30.0)
        )
        delay, logged = 0.1, False
        while True:
            now = time.time()
            lease, deadline = uuid.uuid4().hex, now + outbox_settings.VISIBILITY_TIMEOUT
            asks = self.asks(want, caps, quarantine, changes, now)
            sent, self.sent = self.sent, max(self.sent, top)  # sent before this call, then with it
            try:
                reply = self.repo.outcomes_and_claim(
                    ExchangeRequest(
                        self.queue,
                        now,
                        lease,
                        deadline,
                        [PartitionAsk(a.partition, a.limit, a.caps or {}) for a in asks],
                        changes=changes,
                        outcomes=outcomes,
                        breaker_config=self.breaker_config,
                        limits=self.rate_limits,
                        quarantine=quarantine,
                        slack=DUE_SLACK,
                        run=self.token,
                        horizon=outbox_settings.VISIBILITY_TIMEOUT,
                        sent=sent,
                    )
                )
                results, claims = reply.results, reply.claims
                break
            except REDIS_ERRORS as exc:
                left = give_up_at - time.time()
                if left <= 0:
                    if not isinstance(exc, CLUSTER_IN_FLUX):
                        raise
                    self.hold_back(decided)
                    return []
                if not logged:
                    logger.warning(
                        "outbox: Redis unreachable (or a cluster slot moving) while writing outcomes (%s: %s); "
                        "retrying",
                        type(exc).__name__,
                        exc,
                    )
                    logged = True
                time.sleep(min(delay, left))  # the last try is at the deadline, not a delay before it
                delay = min(delay * 2, 5.0)
                if want:  # the lost call may have claimed: give that claim back first
                    with contextlib.suppress(*REDIS_ERRORS):
                        self.repo.release(lease, deadline, time.time())
        if logged:
            logger.warning("outbox: Redis reachable again; %d outcome(s) written", len(changes))
        self.decided.clear()
        self.written(decided, results)
        return self.took(want, caps, asks, claims, deadline, now)

    def asks(
        self, want: int, caps: dict[str, int] | None, quarantine: bool, changes: Sequence[Change], now: float
    ) -> list[Ask]:
        """The claims of one :meth:`write_and_claim`, one per partition asked: the
        quarantine lane's one partition, else the plan's (with the partitions that
        ``changes`` touch), each asking for no message while its partition's last claim
        met an outage and its backoff has not ended (``moving``)."""
        if quarantine:
            asks = [Ask(self.plan.suspect_partition(now, DUE_SLACK), want, caps)]
        else:
            touched = {partition_of(c.id) for c in changes} if self.plan.partitions > 1 else ()
            asks = self.plan.asks(want, caps, now, DUE_SLACK, touched)
        return [Ask(a.partition, 0, a.caps) if self.moving.get(a.partition, 0.0) > now else a for a in asks]

    def hold_back(self, decided: Sequence[Decision]) -> None:
        """A slot moving for longer than the lease budget: not a reason to end the job by
        an exception. What is decided stays unwritten (:meth:`finish`) and the run claims
        nothing more."""
        logger.warning(
            "outbox: a cluster slot still moving after %.0f s; %d outcome(s) left unwritten",
            outbox_settings.VISIBILITY_TIMEOUT * LEASE_BUDGET,
            len(decided),
        )
        for d in decided:
            self.unwritten.setdefault(d.message.id, (d, "partition"))
        self.decided.clear()
        self.claim_until = min(self.claim_until, time.time())

    def took(
        self,
        want: int,
        caps: dict[str, int] | None,
        asks: Sequence[Ask],
        claims: Sequence[Claim],
        deadline: float,
        now: float,
    ) -> list[Message]:
        """Take in the claims of one :meth:`write_and_claim` (leases ending at
        ``deadline``): the partitions met by an outage, the plan's due times, what was
        left behind and capped, and the destinations' events; the messages claimed."""
        self.note_moving([a.partition for a, one in zip(asks, claims, strict=True) if one.unavailable], now)
        for ask, one in zip(asks, claims, strict=True):
            self.plan.note(ask.partition, one.next_due, one.next_suspect, now, one.capped)
        claim = merge_claims(claims)
        for m in claim.messages:
            self.lease_ends[m.id] = deadline
        self.left_due = len(asks) > 1 and self.left_behind(asks, claims, claim.messages, caps or {}, now)
        self.next_due, self.rescheduled, self.next_suspect = (
            self.plan.earliest_due,
            claim.rescheduled,
            self.plan.earliest_suspect,
        )
        self.note_claim(want, claim.messages, claim.capped)
        self.states = claim.states
        if want and not self.capped and len(claim.messages) < want and claim.capped:
            # A claim for every destination came up short at caps: narrow (see want()).
            self.capped, self.capped_until = set(claim.capped), now + IDLE_POLL
        if claim.events:
            self.destination_events(controls.parse_events(claim.events))
        return claim.messages

    def written(self, decided: Sequence[Decision], results: Sequence[ChangeResult]) -> None:
        """Announce, report and log the outcomes an exchange wrote; keep those it could
        not write now (``unwritten``: their partition or home slot met an outage) for a
        later exchange, after a backoff (doubling from :data:`UNWRITTEN_RETRY` to
        :data:`UNWRITTEN_MAX_DELAY`)."""
        done = [(d, r) for d, r in zip(decided, results, strict=True) if not r.unwritten]
        held = [(d, r) for d, r in zip(decided, results, strict=True) if r.unwritten]
        announce([d for d, _ in done], [r for _, r in done])
        for d, r in done:
            self.unwritten.pop(d.message.id, None)
            self.lease_ends.pop(d.message.id, None)
            # earlier: applied by a try of this exchange whose reply was lost (or whose
            # later step failed), never reported: what it wrote, not "stale"
            status = ("parked" if r.parked else d.status) if r.applied or r.earlier else "stale"
            self.report.outcomes[d.message.id] = status
            if d.outcome is not None:
                log_attempt(d.outcome, d, status)
        if not held:
            self.write_delay = UNWRITTEN_RETRY
            return
        if not any(d.message.id in self.unwritten for d, _ in held):
            logger.warning(
                "outbox: %d outcome(s) not written now (a cluster slot moving, or a primary away: "
                "their partition or their destination's home slot); written again shortly, the other "
                "partitions' were",
                len(held),
            )
        for d, r in held:
            self.unwritten[d.message.id] = (d, r.unwritten)
        self.write_at = time.time() + self.write_delay
        self.write_delay = min(self.write_delay * 2, UNWRITTEN_MAX_DELAY)

    def note_moving(self, partitions: Sequence[int], now: float) -> None:
        """Partitions whose claim met an outage are not asked for messages for a while
        (each failed call costs redis-py's redirects, about 0.4 s), doubling up to
        :data:`UNWRITTEN_MAX_DELAY`; one that answered again is asked as usual."""
        for p in list(self.moving):
            if p not in partitions and self.moving[p] <= now:
                del self.moving[p]
                self.moving_delay.pop(p, None)
        for p in partitions:
            delay = self.moving_delay.get(p, UNWRITTEN_RETRY)
            self.moving[p] = now + delay
            self.moving_delay[p] = min(delay * 2, UNWRITTEN_MAX_DELAY)

    def write_deadline(self) -> float:
        """Until when (epoch s) the run tries to write its unwritten outcomes: a moment
        (:data:`LEASE_MARGIN`) before the first of their leases ends (after it, the
        recovery sweep may take the message back), at most ``VISIBILITY_TIMEOUT`` after the
        run started (RQ's job timeout is a minute later), shortened while stopping."""
        ends = [self.lease_ends.get(i) for i in self.unwritten]
        lease_end = min(
            (e for e in ends if e is not None), default=self.started + outbox_settings.VISIBILITY_TIMEOUT
        )
        return STOPPING.write_deadline(
            min(lease_end - LEASE_MARGIN, self.started + outbox_settings.VISIBILITY_TIMEOUT)
        )

    def finish(self) -> None:
        """The run's last step: write what is still unwritten (a partition that could not
        take it now), retrying with backoff until :meth:`write_deadline`. What is still
        unwritten then stays ``sending`` under its lease: the recovery sweep takes it back
        when the lease ends (a ``lost`` attempt, delivered again). Never raises for an
        outage: the job ends normally."""
        while self.unwritten or self.decided:
            left = self.write_deadline() - time.time()
            if left <= 0:
                break
            if not self.decided:
                time.sleep(min(max(0.0, self.write_at - time.time()), left))
                self.write_at = 0.0
            try:
                self.write_and_claim(0)
            except REDIS_ERRORS:
                logger.warning("outbox: could not write outcomes now", exc_info=True)
                self.write_at = time.time() + self.write_delay
                self.write_delay = min(self.write_delay * 2, UNWRITTEN_MAX_DELAY)
        left_over = [d for d, _ in self.unwritten.values()] + self.decided
        if left_over:
            logger.warning(
                "outbox: %d outcome(s) could not be written before their lease ends (a cluster slot "
                "still moving); the messages stay sending and the recovery sweep takes them back "
                "after their lease (delivered again): %s",
                len(left_over),
                ", ".join(d.message.id for d in left_over),
            )
            for d in left_over:
                self.report.outcomes[d.message.id] = "unwritten"

    @staticmethod
    def left_behind(
        asks: Sequence[Ask],
        claims: Sequence[Claim],
        taken: Sequence[Message],
        caps: dict[str, int],
        now: float,
    ) -> bool:
        """True when a claim of several partitions left messages due now in a partition
        it asked for none (a ``limit`` of 0: the run wanted fewer than the partitions asked)
        or skipped them at a destination's share of its cap while the run took fewer of that
        destination than its cap (see :mod:`outbox.delivery.partitions`)."""
        per_destination = Counter(m.destination for m in taken)
        for ask, one in zip(asks, claims, strict=True):
            if one.unavailable or one.next_due is None or one.next_due > now + DUE_SLACK:
                continue
            if ask.limit == 0 or any(per_destination[d] < (cap_of(caps, d) or 0) for d in one.capped):
                return True
        return False

    def destination_events(self, events: Sequence[DestinationEvent]) -> None:
        """Hand destination events to alerts; a breaker that closed gets its parked
        messages put back at once (the wake check would within ``WAKE_INTERVAL``)."""
        send_destination_events(events)
        for event in events:
            if event.event == "destination.closed":
                try:
                    controls.unpark_all(event.destination, budget=UNPARK_BUDGET)
                except Exception:
                    logger.warning(
                        "outbox: could not unpark %s now; the wake check will",
                        event.destination,
                        exc_info=True,
                    )

    def start(self, messages: Sequence[Message]) -> None:
        # endpoints' configurations: together, checked against the states the claim's gate read
        attempts.prepare([m.destination for m in messages], self.states)
        self.states = {}
        for index, message in enumerate(messages):
            seconds = attempts.deadline_of(message.destination)  # transports are built once and kept
            try:
                now = time.time()
                started = now + attempts.early_by(message, now, DUE_SLACK)  # never before it is due
                future = deadlines.attempt_threads.submit(
                    functools.partial(attempts.watched_attempt, message, seconds, started)
                )
            except BaseException:
                self.release_unstarted(messages[index:])
                raise
            if seconds is not None:
                self.give_up_at[future] = (started + seconds + WATCH_GRACE, seconds, started)
            self.in_flight[future] = message
            self.started_at[future] = started
            self.per_destination[message.destination] += 1
            self.report.claimed.append(message.id)

    def collect(self, timeout: float, return_when: str = FIRST_COMPLETED) -> None:
        """Wait up to ``timeout`` seconds for attempts to finish; decide each finished one,
        and each one given up at its deadline (see :data:`WATCH_GRACE`)."""
        if self.give_up_at:
            timeout = max(0.0, min(timeout, min(g[0] for g in self.give_up_at.values()) - time.time()))
        done, _ = wait(list(self.in_flight), timeout=timeout, return_when=return_when)
        if done and return_when == FIRST_COMPLETED and len(done) * 2 < len(self.in_flight) and _quick(done):
            # Quick attempts finish together: a moment more gathers them into one write
            # and one claim (fewer round trips and script calls per message). Slow ones
            # (a webhook) finish apart, and waiting would only delay their outcomes.
            others = [f for f in self.in_flight if f not in done]
            more, _ = wait(others, timeout=GATHER_WAIT, return_when=ALL_COMPLETED)
            done |= more
        now = time.time()
        for future in list(self.in_flight):
            if future in done:
                outcome = future.result()
            else:
                given = self.give_up_at.get(future)
                if given is None or now < given[0]:
                    continue
                outcome = self.given_up(self.in_flight[future], given[1], given[2], now)
                _abandoned.add(future)
            message = self.in_flight.pop(future)
            self.give_up_at.pop(future, None)
            self.started_at.pop(future, None)
            self.per_destination[message.destination] -= 1
            if not self.per_destination[message.destination]:
                # none in flight: no entry, so caps() walks only the destinations with
                # attempts in flight, not every endpoint this run has met
                del self.per_destination[message.destination]
            if outcome.ok and outcome.duration_ms <= LEND_LATENCY * 1000:
                self.streak[message.destination] += 1
            else:
                self.streak[message.destination] = 0
            self.decisions += 1
            decision = decide(outcome, time.time(), rules_for(outcome.message))
            self.decided.append(dataclasses.replace(decision, outcome=outcome, seq=self.decisions))

    @staticmethod
    def given_up(message: Message, seconds: float, started: float, now: float) -> Outcome:
        """The outcome of an attempt still running past its deadline: a retryable
        ``deadline`` failure. Its thread is left to finish; what it returns is ignored."""
        logger.warning(
            "outbox attempt id=%s destination=%s still running %.1f s after it started: given up "
            "at its %gs deadline (it may still complete in the background)",
            message.id,
            message.destination,
            now - started,
            seconds,
        )
        error = deadlines.deadline_error(f"the attempt to {message.destination!r}", seconds)
        return Outcome(
            message,
            started,
            (now - started) * 1000,
            error=str(error),
            error_class=error.error_class,
        )

    def release_unstarted(self, messages: Sequence[Message]) -> None:
        by_lease: dict[str, list[Message]] = {}
        for m in messages:
            by_lease.setdefault(m.lease, []).append(m)
        for lease, group in by_lease.items():
            result = self.repo.release(lease, 0.0, time.time(), [m.id for m in group])
            self.report.released += result.applied
            wakeups.enqueue_wakeups(result.woken)

    def loop(self) -> None:
        while True:
            free = self.concurrency - len(self.in_flight)
            caps = self.caps()
            want, quarantine = self.lane(self.want(free, caps, time.time()), time.time())
            if want or self.decided or (self.unwritten and time.time() >= self.write_at):
                claimed = self.write_and_claim(want, caps if want else None, quarantine)
                self.start(claimed)
                if claimed:
                    self.empty_retries = 0
                if quarantine and not claimed:
                    # None could be taken (another worker took it, or a limit held it):
                    # claim from the due index, and look at suspects again a moment later.
                    self.quarantine_after = time.time() + IDLE_POLL
                    continue
                if (
                    quarantine
                    and not self.shared
                    and (self.next_suspect or math.inf) <= time.time() + DUE_SLACK
                ):
                    # More suspects wait: a wake-up job lets another worker take them too,
                    # each alone in its own process (once per run; that run does the same).
                    self.shared = True
                    wakeups.wake([self.queue])
                if not claimed and not self.in_flight and not self.decided:
                    if self.lane(1, time.time())[1]:
                        continue  # a suspect is due: claim it, alone
                    if (
                        self.left_due
                        and self.empty_retries < self.plan.partitions
                        and time.time() < self.claim_until
                    ):
                        # Due messages waited in partitions asked for none of them: the
                        # plan knows them now and gives them shares.
                        self.empty_retries += 1
                        continue
                    wait_for = self.next_due - time.time() if self.next_due is not None else HELD_WAIT + 1
                    if self.rescheduled and wait_for <= HELD_WAIT and time.time() < self.claim_until:
                        # Messages a rate or concurrency limit moved a moment later: wait for them.
                        time.sleep(max(0.01, wait_for))
                        continue
                    return  # nothing due, nothing running
            if not self.in_flight:
                if want == 0 and not self.capped:
                    return  # the budget is spent
                self.capped.clear()  # nothing in flight: no cap is reached
                continue
            timeout = IDLE_POLL if free > 0 and time.time() < self.claim_until else 1.0
            if self.unwritten:  # wake for their next try
                timeout = max(0.0, min(timeout, self.write_at - time.time()))
            self.collect(timeout)

    def fail_safe(self) -> None:
        """After an exception: keep what was decided, charge only what was in flight."""
        if self.in_flight:
            self.collect(FAILSAFE_WAIT, ALL_COMPLETED)
        self.finish()
        if self.in_flight:
            logger.warning(
                "outbox: %d attempt(s) still in flight when the run stopped; the recovery sweep "
                "takes them back after their lease",
                len(self.in_flight),
            )


def run(queue: str, *, budget: float = RUN_BUDGET) -> RunReport:
    """Deliver the due messages of ``queue`` until none is due or ``budget`` seconds
    have passed (see the module docstring). The wake-up job calls this.

    When the budget ends with messages still due, a new wake-up job is enqueued, so a
    busy queue hands over between jobs (and other queues get their turn in RQ).

    Returns:
        A :class:`RunReport`.

    Raises:
        redis.exceptions.RedisError: Redis stayed unreachable (after the fail-safe
            steps above).
    """
    repo = get_repository()
    repo.clear_wake_flag(queue)
    state = WorkerRun(queue, repo, budget)
    try:
        state.loop()
        state.finish()
    except BaseException:
        try:
            state.fail_safe()
        except Exception:
            logger.exception("outbox: could not write every decided outcome after a failed run")
        raise
    due = [t for t in (state.next_due, state.next_suspect) if t is not None]
    if due and min(due) <= time.time() + DUE_SLACK:
        wakeups.wake([queue])
    return state.report
