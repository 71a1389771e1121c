"""Redis key names. Nothing outside :mod:`outbox.store` builds an outbox key.

Layout, for prefix ``outbox`` (see ``docs/architecture.md``):

==================================  ===========  ============================================
key                                 type         holds
==================================  ===========  ============================================
``outbox:message:<id>``             hash         the message record
``outbox:resend:<id>``              hash         the resend record (delivery state)
``outbox:attempts:<id>``            list         attempt records, newest first, capped
``outbox:status:<status>``          sorted set   ids in that status (score: see below)
``outbox:status:<status>:dest:<d>`` sorted set   the same, for one destination
``outbox:created``                  sorted set   every id, scored by created_at
``outbox:created:dest:<d>``         sorted set   every id of one destination, by created_at
``outbox:destinations``             set          destination names ever used
``outbox:due:<queue>``              sorted set   pending and retrying ids of a queue, by due
                                                 time: what workers claim from
``outbox:wake:<queue>``             string       set while a wake-up job for the queue waits
``outbox:idempotency:<n>:<d>:<key>`` string      ``<id>|<fingerprint>`` sent under that key to
                                                 destination ``d`` (``n`` = len(d)); expires
``outbox:lock:<name>``              string       short-lived locks (recovery sweep)
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
==================================  ===========  ============================================

Status index scores: ``pending`` and ``retrying`` by next_attempt_at (so due messages
are a range query), ``sending`` by lease deadline (claim time + visibility timeout),
the others by the time they entered the status.

The Lua scripts in ``lua/`` build the same names from the prefix; keep both in step.
Multi-key scripts that build names make the outbox unsuitable for Redis Cluster.
"""

from __future__ import annotations

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

    def status(self, status: str, destination: str | None = None) -> str:
        if destination is None:
            return f"{self.prefix}:status:{status}"
        return f"{self.prefix}:status:{status}:dest:{destination}"

    def created(self, destination: str | None = None) -> str:
        if destination is None:
            return f"{self.prefix}:created"
        return f"{self.prefix}:created:dest:{destination}"

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

    def lock(self, name: str) -> str:
        return f"{self.prefix}:lock:{name}"

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
