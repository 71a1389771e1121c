"""An attempt's outcome as decided, and how the store writes it.

:class:`Decision` is what :func:`outbox.delivery.outcomes.decide` returns: plain values
(the new status, retry count, due time, error, the attempt record), no Redis encoding,
no configuration read, nothing changed in place. :func:`change_of` encodes it as the
compare-and-set :class:`~outbox.store.messages.Change` that ``lua/transition.lua``
applies: the resend-record fields to set and delete, the index score, the events, and
the ``park`` alternative written instead while the destination holds its messages.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from outbox.events import DestinationEvent, MessageEvent
from outbox.records import Attempt, Message, Outcome, Status
from outbox.store.codec import attempt_json, inline_fields
from outbox.store.messages import Change


@dataclass(frozen=True)
class Decision:
    """What an attempt's outcome makes of its message.

    Attributes:
        claimed: the message as it was claimed (``sending``), unchanged.
        status: its new status: ``succeeded``, ``retrying`` or ``failed``.
        at: when it was decided (epoch seconds).
        attempt: the attempt record.
        retry_count: its retry count after the outcome.
        next_attempt_at: when its next attempt is due (``retrying``), else None.
        error: the failure's text ("" on success; a retry policy that could not be used
            adds why).
        error_class: the failure's kind ("" on success).
        status_code: the receiver's HTTP status, if any.
        suspect: its ``suspect`` mark after the outcome (0: cleared).
        parkable: a failure that is not permanent: written as parked, with no retry
            charged, when its destination holds its messages.
        skip: a dead letter of an ordering key leaves its key (policy ``"skip"``) instead
            of blocking it.
        exhausted: a dead letter whose retries ran out, or that blocks its ordering key:
            it has a ``message.exhausted`` event (:attr:`exhausted_event`).
        outcome: the attempt's result, when a worker's run decided it (logged once written).
        seq: its number in the worker run that decided it (health counts it once); 0 = none.
    """

    claimed: Message
    status: str
    at: float
    attempt: Attempt
    retry_count: int
    next_attempt_at: float | None
    error: str
    error_class: str
    status_code: int | None
    suspect: int
    parkable: bool
    skip: bool
    exhausted: bool
    outcome: Outcome | None = None
    seq: int = 0

    @property
    def ok(self) -> bool:
        return self.status == Status.SUCCEEDED.value

    @cached_property
    def message(self) -> Message:
        """The message as the decision leaves it (a copy of :attr:`claimed`): what the
        signals carry."""
        return dataclasses.replace(
            self.claimed,
            status=self.status,
            retry_count=self.retry_count,
            next_attempt_at=self.next_attempt_at,
            last_error="" if self.ok else self.error,
            last_error_class="" if self.ok else self.error_class,
            last_status_code=self.status_code,
            suspect=self.suspect,
        )

    @cached_property
    def exhausted_event(self) -> DestinationEvent | None:
        """Its ``message.exhausted`` event, when :attr:`exhausted`."""
        if not self.exhausted:
            return None
        m = self.claimed
        data: dict[str, Any] = {
            "id": m.id,
            "retry_count": self.retry_count,
            "status_code": self.status_code,
            "error": self.error,
        }
        if m.ordering_key:
            # a dead letter of an ordering key: with the policy "block" its key waits
            data.update(ordering_key=m.ordering_key, blocked=not self.skip)
        return DestinationEvent("message.exhausted", m.destination, self.at, data)


def change_of(decision: Decision) -> Change:
    """``decision`` as the compare-and-set change ``lua/transition.lua`` writes: from
    ``sending`` under the message's lease, the resend-record fields set and deleted, the
    score in its new status index (the due time of a retry, else the decision's time),
    the attempt (inline when a first success), its events, and the ``park`` alternative
    of a failure that is not permanent."""
    d, m = decision, decision.claimed
    fields, unset = _fields(d)
    exhausted = d.exhausted_event
    return Change(
        id=m.id,
        from_statuses=(Status.SENDING.value,),
        to=d.status,
        score=d.next_attempt_at if d.next_attempt_at is not None else d.at,
        set=fields,
        unset=unset,
        lease=m.lease,
        attempt=d.attempt,
        inline=inline_fields(d.attempt),
        event=MessageEvent(
            m.id,
            m.destination,
            d.status,
            d.retry_count,
            d.at,
            status_code=d.status_code,
            error=d.error,
            next_attempt_at=d.next_attempt_at,
        ).to_json(),
        stats_outcome=d.status,
        destination=m.destination,
        queue=m.queue,
        ordering_key=m.ordering_key or "",
        skip=d.skip,
        park=_park(d, fields, unset) if d.parkable else None,
        exhausted_event=None if exhausted is None else exhausted.to_json(),
    )


def _fields(d: Decision) -> tuple[dict[str, str], list[str]]:
    """The resend-record fields ``d`` sets, and those it deletes."""
    fields = {"last_status_code": str(d.status_code)} if d.status_code is not None else {}
    unset = [] if d.status_code is not None else ["last_status_code"]
    if not d.ok:
        fields["last_error_class"] = d.error_class
    if d.suspect:
        fields["suspect"] = str(d.suspect)
    elif d.claimed.suspect:
        unset.append("suspect")
    if d.ok:
        unset += ["next_attempt_at", "lease", "last_error", "last_error_class"]
    elif d.next_attempt_at is None:
        fields["last_error"] = d.error
        unset += ["next_attempt_at", "lease"]
    else:
        fields["last_error"] = d.error
        fields["retry_count"] = str(d.retry_count)
        fields["next_attempt_at"] = repr(d.next_attempt_at)
        unset += ["lease"]
    return fields, unset


def _park(d: Decision, fields: dict[str, str], unset: list[str]) -> dict[str, Any]:
    """The ``park`` alternative of a failed attempt's change (:attr:`Change.park`): back
    to waiting, due now, its retry count unchanged, an attempt recorded as ``parked``."""
    m = d.claimed
    to = Status.RETRYING.value if m.retry_count > 0 else Status.PENDING.value
    set_fields = {k: v for k, v in fields.items() if k not in ("retry_count", "next_attempt_at")}
    set_fields["next_attempt_at"] = repr(d.at)
    parked = dataclasses.replace(d.attempt, outcome="parked", retry_count=m.retry_count)
    return {
        "to": to,
        "score": repr(d.at),
        "set": set_fields,
        "unset": [f for f in unset if f != "next_attempt_at"] or ["lease"],
        "attempt": attempt_json(parked),
        "event": MessageEvent(
            m.id, m.destination, to, m.retry_count, d.at, error=d.error, event="message.parked"
        ).to_json(),
    }
