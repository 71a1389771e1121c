"""Which partitions a run's next claim asks, and for how many messages each.

With one partition (``OUTBOX["PARTITIONS"]`` = 1) a claim asks partition 0 for all it
wants, as always. With more, a run of the claim loop claims from every partition with
due work of its queue, in one round trip (one ``lua/claim.lua`` call per partition asked,
pipelined): this plan remembers, per partition, when its earliest due message is due
(each claim's reply says). A run's first claim asks every partition for none: it only
learns when each one's earliest message is due, so that the claims after it go to the
partitions with due work, oldest first (a first claim that split the run's slots, and a
cap of 1, among partitions it knew nothing of took the oldest message of whichever
partition came first, not the oldest due). Then it asks

* the partitions with a message due now, or whose next due time is unknown (never asked
  in this run, or last asked more than :data:`REPOLL` seconds ago, since a new message
  may have arrived: the wake-up job of the queue is already running, this run);
* for shares of what the run wants (and of each destination's cap) that add up to it, so
  a claim never takes more than the run has slots for; the partition that gets the
  first share rotates, so no partition is starved when the run wants fewer messages
  than partitions have due ones. When the run wants fewer messages than there are
  partitions to ask, the others are asked for none: their claims only report when their
  earliest message is due, so the run learns where due work waits (a run wanting one
  message once asked one partition, found nothing there and ended, its queue's due
  work left in the others). A destination's cap smaller than the partitions asked
  leaves some of them a share of 0: its share goes first to the partitions whose last
  claim skipped its due messages at their share (:attr:`PartitionPlan.capped`), so they
  are not left behind for as long as other partitions come first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: Seconds after which a partition found without due work is asked again.
REPOLL = 0.1


@dataclass
class Ask:
    """One partition's part of a claim: ``limit`` messages at most, ``caps`` (destination
    -> most messages of it; None: no caps)."""

    partition: int
    limit: int
    caps: dict[str, int] | None


@dataclass
class PartitionPlan:
    """The claim plan of one run over ``partitions`` partitions (see the module)."""

    partitions: int
    #: partition -> when its earliest due message is due (epoch s), None: it has none
    next_due: dict[int, float | None] = field(default_factory=dict)
    #: partition -> when its earliest suspect is due (quarantine index), None: none
    next_suspect: dict[int, float | None] = field(default_factory=dict)
    #: partition -> when it was last asked (epoch s)
    asked_at: dict[int, float] = field(default_factory=dict)
    #: partition -> destinations its last claim skipped at their (share of the) cap
    capped: dict[int, tuple[str, ...]] = field(default_factory=dict)
    turn: int = 0

    def due(self, now: float, slack: float, touched: Iterable[int] = ()) -> list[int]:
        """The partitions worth asking now, earliest due first (rotating among the rest).
        ``touched``: partitions where this round trip writes outcomes, before the claims
        (a retry due at once is due again there).

        A partition known to hold due work keeps its place by that due time even when
        what was learnt of it is older than :data:`REPOLL` (it is asked again in any
        case): on a loaded machine the claim after a run's first one can come later than
        that, and the rotation then gave the first share to a partition with newer work."""
        if self.partitions == 1:
            return [0]
        touched = set(touched)
        known, unknown = [], []
        for k in self._rotation():
            at = self.next_due.get(k)
            if at is not None and at <= now + slack and k in self.asked_at:
                known.append((at, k))
            elif k in touched or k not in self.asked_at or now - self.asked_at[k] >= REPOLL:
                unknown.append(k)
        known.sort(key=lambda pair: pair[0])  # stable: ties keep the rotation's order
        return [k for _, k in known] + unknown

    def _rotation(self) -> list[int]:
        first = self.turn % self.partitions
        return [*range(first, self.partitions), *range(first)]

    def asks(
        self, want: int, caps: dict[str, int] | None, now: float, slack: float, touched: Iterable[int] = ()
    ) -> list[Ask]:
        """The claim calls for ``want`` messages under ``caps``: shares adding up to them
        (``touched``: see :meth:`due`).

        Returns at least one :class:`Ask` (with ``limit`` 0 when ``want`` is 0: the claim
        still reports the partition's next due time)."""
        self.turn += 1
        order = self.due(now, slack, touched)
        if not order or want <= 0:
            order = order[:1] or [self.turn % self.partitions]
            return [Ask(order[0], 0, caps)]
        if self.partitions > 1 and not self.asked_at:  # a run's first claim: where is due work, since when?
            return [Ask(k, 0, None) for k in order]
        order, probes = order[:want], order[want:]
        n = len(order)
        asks = []
        shares: list[dict[str, int]] = [{} for _ in order]
        for d, c in (caps or {}).items() if n > 1 else ():  # one partition asked: all of each cap
            # the partitions that last skipped this destination's messages at their share first
            first = [i for i, k in enumerate(order) if d in self.capped.get(k, ())]
            ranked = [*first, *(i for i in range(n) if i not in first)] if first else range(n)
            for rank, i in enumerate(ranked):
                shares[i][d] = _share(c, n, rank)
        if n == 1:
            shares[0] = dict(caps or {})
        for i, k in enumerate(order):
            asks.append(Ask(k, _share(want, n, i), None if caps is None else shares[i]))
        return asks + [Ask(k, 0, None) for k in probes]

    def suspect_partition(self, now: float, slack: float) -> int:
        """The partition whose quarantine index has the suspect due first (0 if none is known)."""
        due = [(at, k) for k, at in self.next_suspect.items() if at is not None and at <= now + slack]
        return min(due)[1] if due else 0

    def note(
        self,
        partition: int,
        next_due: float | None,
        next_suspect: float | None,
        now: float,
        capped: Iterable[str] = (),
    ) -> None:
        """Remember what a claim of ``partition`` reported (``capped``: the destinations
        whose due messages it skipped at their cap)."""
        self.next_due[partition] = next_due
        self.next_suspect[partition] = next_suspect
        self.asked_at[partition] = now
        self.capped[partition] = tuple(capped)

    def earliest(self, values: Iterable[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    @property
    def earliest_due(self) -> float | None:
        """When the earliest due message among the partitions asked is due, or None."""
        return self.earliest(self.next_due.values())

    @property
    def earliest_suspect(self) -> float | None:
        """When the earliest suspect among the partitions asked is due, or None."""
        return self.earliest(self.next_suspect.values())


def _share(total: int, n: int, i: int) -> int:
    """The i-th of ``n`` shares of ``total`` (they add up to ``total``; the first ones get
    the remainder)."""
    return total // n + (1 if i < total % n else 0)
