"""The claim round trip of a partitioned deployment (``OUTBOX["PARTITIONS"]`` > 1), in
calls of one hash slot each, as a Redis Cluster requires: :meth:`outcomes_and_claim` runs
an :class:`~outbox.store.exchange.Exchange` (its steps and how each handles an outage of
its slot: :mod:`outbox.store.exchange`; ``docs/architecture.md``, "Partitions").

A limit is never exceeded: a concurrency slot is held from its grant to its attempt's
outcome (or release, or the end of its lease); a grant the claim could not use is given
back in the same exchange.
"""

from __future__ import annotations

from outbox.store.exchange import Exchange, ExchangeReply, ExchangeRequest, ExchangeStore, PartitionAsk
from outbox.store.messages import Claim, ClaimOptions


class PartitionedMessageStore(ExchangeStore):
    """:class:`~outbox.store.messages.MessageStore` with the partitioned delivery round
    trip (see the module)."""

    def claim(self, queue: str, now: float, partition: int, options: ClaimOptions) -> Claim:
        """See :meth:`~outbox.store.messages.MessageStore.claim`; with more than one partition, the steps of
        :meth:`outcomes_and_claim` without outcomes (a partition whose slot cannot be
        claimed from now answers a :class:`Claim` with its ``error``)."""
        if not self.keys.partitioned:
            return super().claim(queue, now, partition, options)
        request = ExchangeRequest(
            queue,
            now,
            options.lease,
            options.deadline,
            [PartitionAsk(partition, options.limit, options.caps)],
            limits=options.limits or "{}",
            quarantine=options.quarantine,
            slack=options.due_slack,
            scan=options.scan,
        )
        return self.outcomes_and_claim(request).claims[0]

    def outcomes_and_claim(self, request: ExchangeRequest) -> ExchangeReply:
        """Record a run's outcomes in destination health, write them, and claim its next
        messages: one :class:`~outbox.store.exchange.Exchange` (one round trip with one
        partition, five steps of one slot each with more; each step's outage handled where
        it happens).

        Returns:
            One :class:`ChangeResult` per change and one :class:`Claim` per ask, in order.

        Raises:
            redis.exceptions.RedisError: with one partition, the round trip failed; with
                more, a step failed for a reason other than an outage of its slot (see
                :mod:`outbox.store.exchange`)."""
        return Exchange(self, request).run()  # payloads came with each claim (parse_claim)
