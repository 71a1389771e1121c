"""Redis key names. Nothing outside :mod:`outbox.store` builds an outbox key.

Layout, for prefix ``outbox`` (see ``docs/architecture.md``):

==================================  ===========  ============================================
key                                 type         holds
==================================  ===========  ============================================
``outbox:message:<id>``             string       the message record: a JSON header line, then
                                                 the body (older versions: a hash)
``outbox:resend:<id>``              hash         the resend record (delivery state)
``outbox:attempts:<id>``            list         attempt records, newest first, capped
``outbox:status:<status>:dest:<d>`` sorted set   ids of destination ``d`` in that status
                                                 (score: see below)
``outbox:created:dest:<d>``         sorted set   every id of destination ``d``, by created_at
``outbox:destinations``             set          destination names ever used: the indexes
                                                 across destinations are the union of theirs
``outbox:due:<queue>``              sorted set   pending and retrying ids of a queue, by due
                                                 time: what workers claim from
``outbox:quarantine:<queue>``       sorted set   suspects of a queue (pending/retrying ids
                                                 taken back from lost workers), by due time:
                                                 each is claimed alone
``outbox:wake:<queue>``             string       set while a wake-up job for the queue waits
``outbox:idempotency:<n>:<d>:<key>`` string      ``<id>|<fingerprint>`` sent under that key to
                                                 destination ``d`` (``n`` = len(d)); expires
``outbox:lock:<name>``              string       short-lived locks (recovery sweep)
``outbox:housekeeping``             string       host:pid of an outbox_worker whose housekeeping
                                                 ran lately (expires: 2 recovery intervals + 5 s)
``outbox:workers``                  sorted set   host:pid of each outbox_worker -> when its
                                                 heartbeat expires (epoch s; written with the
                                                 one above; dropped an hour after expiring)
``outbox:stats:<outcome>:<minute>`` string       outcome counters per minute (expire)
``outbox:dest:<d>``                 hash         destination health: admin and breaker
                                                 state, counters, totals, latency histogram
``outbox:health:<d>:<minute>``      hash         attempts per minute by outcome (s, r, p)
                                                 and latency buckets (b0..b16); expire 2 h
``outbox:errors:<d>:<hour>``        hash         failures per (status code, error class)
                                                 in an hour: count, last time, last error;
                                                 expire 25 h
``outbox:parked:<d>``               sorted set   pending/retrying ids of a destination held
                                                 while it is paused, disabled or its breaker
                                                 open (not in a due index), by due time
``outbox:probes``                   sorted set   destination -> when the wake check must look
                                                 at its parked messages (probe or unpark)
``outbox:gcra:<d>``                 string       GCRA theoretical arrival time (rate limit)
``outbox:alert:sent:<e>:<d>``       string       set (NX, expiring) while alerts of event
                                                 ``e`` about ``d`` are suppressed
``outbox:alert:count:<e>:<d>``      hash         occurrences of ``e`` about ``d`` no alert
                                                 reported yet: n, since, last; expire 7 days
``outbox:alert:flush``              sorted set   ``<e>|<d>`` -> when its suppression ends and
                                                 the counted occurrences must be reported
``outbox:batch:<token>``            sorted set   ids one bulk action acted on, scored by
                                                 order (expires; see ``outbox.operations.batches``)
``outbox:task:<job id>``            string       a background action the console started:
                                                 JSON (operation, state, progress, report);
                                                 expires 7 days after its last write (see
                                                 ``outbox.store.tasks``)
==================================  ===========  ============================================

There is no index across destinations (older versions: ``outbox:status:<status>`` and
``outbox:created``): a list or count over every destination reads the destinations'
indexes together (:class:`~outbox.store.indexes.Index`), so a status change moves a
message in two sorted sets, not four, and a finished message has two index entries.

Status index scores: ``pending`` and ``retrying`` by next_attempt_at (so due messages
are a range query), ``sending`` by lease deadline (claim time + visibility timeout),
the others by the time they entered the status.

Every key a Lua script (``lua/``) can know before it runs is built here and passed to
it in ``KEYS``. Keys a script finds only at run time (ids it reads from an index, the
destination or queue a resend record names) are built by one Lua helper,
``lua/lib/keys.lua``, from the prefix the script is given: ``tests/store/test_lua_keys.py``
runs it in Redis and checks each name against the method of the same name here. Those
run-time keys are what still keeps the multi-key scripts off Redis Cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix."""

    prefix: str

    def message(self, message_id: str) -> str:
        return f"{self.prefix}:message:{message_id}"

    def resend(self, message_id: str) -> str:
        return f"{self.prefix}:resend:{message_id}"

    def attempts(self, message_id: str) -> str:
        return f"{self.prefix}:attempts:{message_id}"

    def status(self, status: str, destination: str) -> str:
        return f"{self.prefix}:status:{status}:dest:{destination}"

    def created(self, destination: str) -> str:
        return f"{self.prefix}:created:dest:{destination}"

    def legacy_indexes(self, statuses: Iterable[str]) -> list[str]:
        """The indexes across destinations that older versions kept (``outbox:created``
        and ``outbox:status:<status>``): read by the 0.1 upgrade, deleted by the schema 3 one."""
        return [f"{self.prefix}:created", *(self.legacy_status(s) for s in statuses)]

    def legacy_status(self, status: str) -> str:
        """The index across destinations of one status that older versions kept
        (``outbox:status:<status>``): read by ``lua/backfill.lua``."""
        return f"{self.prefix}:status:{status}"

    @property
    def destinations(self) -> str:
        return f"{self.prefix}:destinations"

    def due(self, queue: str) -> str:
        return f"{self.prefix}:due:{queue}"

    def wake(self, queue: str) -> str:
        return f"{self.prefix}:wake:{queue}"

    @staticmethod
    def idempotency_scope(destination: str, key: str) -> str:
        """An idempotency key scoped to its destination, unambiguously (length-prefixed)."""
        return f"{len(destination)}:{destination}:{key}"

    def idempotency(self, destination: str, key: str) -> str:
        return f"{self.prefix}:idempotency:{self.idempotency_scope(destination, key)}"

    def heartbeat(self) -> str:
        """The housekeeping heartbeat: set, with a TTL, by each ``outbox_worker``."""
        return f"{self.prefix}:housekeeping"

    @property
    def workers(self) -> str:
        """Each ``outbox_worker``'s own heartbeat: ``host:pid`` -> when it expires."""
        return f"{self.prefix}:workers"

    def lock(self, name: str) -> str:
        return f"{self.prefix}:lock:{name}"

    def batch(self, token: str) -> str:
        return f"{self.prefix}:batch:{token}"

    def task(self, job_id: str) -> str:
        """The registry entry of a background action the console started (RQ job id)."""
        return f"{self.prefix}:task:{job_id}"

    def quarantine(self, queue: str) -> str:
        """A queue's suspects (taken back from lost workers), by due time: each is claimed
        alone (``lua/claim.lua``)."""
        return f"{self.prefix}:quarantine:{queue}"

    def stats(self, outcome: str, minute: int) -> str:
        return f"{self.prefix}:stats:{outcome}:{minute}"

    def dest(self, destination: str) -> str:
        return f"{self.prefix}:dest:{destination}"

    def health(self, destination: str, minute: int) -> str:
        return f"{self.prefix}:health:{destination}:{minute}"

    def errors(self, destination: str, hour: int) -> str:
        return f"{self.prefix}:errors:{destination}:{hour}"

    def parked(self, destination: str) -> str:
        return f"{self.prefix}:parked:{destination}"

    @property
    def probes(self) -> str:
        return f"{self.prefix}:probes"

    def gcra(self, destination: str) -> str:
        return f"{self.prefix}:gcra:{destination}"

    def alert_sent(self, event: str, destination: str) -> str:
        return f"{self.prefix}:alert:sent:{event}:{destination}"

    def alert_count(self, event: str, destination: str) -> str:
        return f"{self.prefix}:alert:count:{event}:{destination}"

    @property
    def alert_flush(self) -> str:
        return f"{self.prefix}:alert:flush"
