"""The catalogue of operations the admin console and the management commands offer (one
domain module both use): each operation's name and description, who may run it, what
it acts on (:class:`Selection`), and running it (:func:`execute`).

The work itself is :mod:`outbox.operations.actions` (1,000 ids per Lua call, compare-and-set):
here an operation is only named, described and fed with ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any

from django.utils.functional import Promise
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _

from outbox.operations import actions
from outbox.operations.actions import ActionResult, Applied, Progress
from outbox.records import CANCELLABLE_STATUSES, DELETABLE_STATUSES, REQUEUEABLE_STATUSES, Status
from outbox.store import MessageRepository
from outbox.store.reads.queries import (
    CHUNK,
    Count,
    MessageFilter,
    TimeRange,
    count_matching,
    eligible_statuses,
    iter_matching,
)

#: Most ids an action on selected messages accepts (a page holds far fewer).
MAX_SELECTED = 10_000


@dataclass(frozen=True)
class Operation:
    """A bulk operation.

    Attributes:
        name: ``requeue``, ``retry_now``, ``cancel`` or ``delete`` (the function in
            :mod:`outbox.operations.actions`).
        label: the verb for buttons and menus.
        past: the past participle for reports.
        codename: the permission codename on ``outbox.Message``.
        statuses: the statuses it acts on; messages in others are skipped.
        consequences: what happens, for the confirmation page.
        not_yet_due: "all matching" acts only on messages whose next attempt is after
            the time the user confirmed (those already due need nothing).
    """

    name: str
    label: str | Promise
    past: str | Promise
    codename: str
    statuses: tuple[str, ...]
    consequences: tuple[str | Promise, ...]
    not_yet_due: bool = False

    @property
    def permission(self) -> str:
        """The permission name for ``user.has_perm``."""
        return f"outbox.{self.codename}"

    def run(
        self,
        ids: Iterable[str],
        progress: Progress | None = None,
        applied: Applied | None = None,
        **options: Any,
    ) -> ActionResult:
        """Act on ``ids`` in chunks; see :mod:`outbox.operations.actions`."""
        action: Callable[..., ActionResult] = getattr(actions, self.name)
        return action(ids, progress=progress, applied=applied, **options)


REQUEUE = Operation(
    name="requeue",
    label=_("Requeue"),
    past=_("requeued"),
    codename="requeue_message",
    statuses=REQUEUEABLE_STATUSES,
    consequences=(
        _("Each message goes back to pending and is queued for delivery now."),
        _("Its retry count is reset to 0: it gets a fresh retry budget (its max retries)."),
        _("Its attempt history is kept; new attempts are added to it."),
        _(
            "Only failed, cancelled and succeeded messages are requeued; requeuing a succeeded "
            "message delivers it again. Messages in other statuses are skipped."
        ),
    ),
)
RETRY_NOW = Operation(
    name="retry_now",
    label=_("Retry now"),
    past=_("made due now"),
    codename="requeue_message",
    statuses=(Status.RETRYING.value,),
    consequences=(
        _("Each retrying message is due now: its backoff wait is skipped and its queue is woken."),
        _("Its retry count is kept: the retries it has left are unchanged (requeue would reset them)."),
        _(
            "A message of a destination that is paused, disabled, blocked by a Retry-After or "
            "whose circuit breaker is open still waits until that destination delivers again."
        ),
        _(
            "Only retrying messages are affected; with “all matching”, only those whose next "
            "attempt was still to come. Messages in other statuses are skipped."
        ),
    ),
    not_yet_due=True,
)
CANCEL = Operation(
    name="cancel",
    label=_("Cancel"),
    past=_("cancelled"),
    codename="cancel_message",
    statuses=CANCELLABLE_STATUSES,
    consequences=(
        _(
            "Pending, retrying and waiting messages become cancelled and are not delivered; "
            "delivery jobs already queued for them do nothing."
        ),
        _(
            "A cancelled message of an ordering key leaves its key: when it was the head, the "
            "next message of the key becomes the head and is due."
        ),
        _("Their records and attempt history are kept; they can be requeued later."),
        _("Messages in other statuses (being sent right now, or finished) are skipped."),
    ),
)
DELETE = Operation(
    name="delete",
    label=_("Delete"),
    past=_("deleted"),
    codename="delete_message",
    statuses=DELETABLE_STATUSES,
    consequences=(
        _(
            "The messages, their delivery state and their attempt history are removed "
            "from Redis for good. This cannot be undone."
        ),
        _("An idempotency key that points at a deleted message is released."),
        _("Messages being sent right now are skipped."),
    ),
)
OPERATIONS: dict[str, Operation] = {op.name: op for op in (REQUEUE, RETRY_NOW, CANCEL, DELETE)}


@dataclass
class Selection:
    """What an operation acts on: listed ids, or every message matching a filter.

    Attributes:
        ids: the selected ids, or None for "all matching".
        filter: the filter, when ``ids`` is None.
        as_of: epoch seconds the user confirmed at: "all matching" skips messages
            created later, and in finished statuses those that finished later.
        description: a short human description (for reports and the admin history).
    """

    ids: list[str] | None = None
    filter: MessageFilter = field(default_factory=MessageFilter)
    as_of: float = field(default_factory=time.time)
    description: str = ""

    @property
    def all_matching(self) -> bool:
        return self.ids is None

    def filter_for(self, op: Operation) -> MessageFilter:
        """The filter "all matching" walks for ``op`` (an operation on messages not yet
        due looks only after :attr:`as_of`, a microsecond later)."""
        if not op.not_yet_due:
            return self.filter
        due = self.filter.due
        start = self.as_of + 1e-6 if due.start is None else max(due.start, self.as_of + 1e-6)
        return replace(self.filter, due=TimeRange(start, due.end))

    def count(self, repo: MessageRepository, op: Operation) -> Count:
        """How many of the selected messages ``op`` would act on now."""
        if self.ids is not None:
            n = 0
            for start in range(0, len(self.ids), CHUNK):
                n += sum(
                    s in op.statuses for s in repo.resend_field(self.ids[start : start + CHUNK], "status")
                )
            return Count(n, True)
        flt = self.filter_for(op)
        return count_matching(repo, flt, eligible_statuses(flt, op.statuses))

    def iter_ids(self, repo: MessageRepository, op: Operation) -> Iterator[str]:
        """Every selected id ``op`` may act on, walking indexes a chunk at a time."""
        if self.ids is not None:
            return iter(self.ids)
        flt = self.filter_for(op)
        chunks = iter_matching(repo, flt, eligible_statuses(flt, op.statuses), as_of=self.as_of)
        return chain.from_iterable(chunks)

    # -- for background jobs (RQ pickles arguments; keep them plain) ---------------
    def to_dict(self) -> dict[str, Any]:
        f = self.filter
        return {
            "ids": self.ids,
            "filter": {
                "status": f.status,
                "destination": f.destination,
                "queue": f.queue,
                "created": [f.created.start, f.created.end],
                "updated": [f.updated.start, f.updated.end],
                "status_code": f.status_code,
                "error_class": f.error_class,
                "due": [f.due.start, f.due.end],
                "batch": f.batch,
            },
            "as_of": self.as_of,
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Selection:
        f = data["filter"]
        flt = MessageFilter(
            status=f["status"],
            destination=f["destination"],
            queue=f["queue"],
            created=TimeRange(*f["created"]),
            updated=TimeRange(*f["updated"]),
            status_code=f.get("status_code"),
            error_class=f.get("error_class"),
            due=TimeRange(*f.get("due", (None, None))),
            batch=f.get("batch"),
        )
        return cls(ids=data["ids"], filter=flt, as_of=data["as_of"], description=data["description"])


def execute(
    repo: MessageRepository,
    op: Operation,
    selection: Selection,
    progress: Progress | None = None,
    applied: Applied | None = None,
) -> ActionResult:
    """Run ``op`` on the selection now, in batches of 1,000 ids; ``progress(acted, skipped)``
    is called after each batch, ``applied(ids)`` with the ids each batch acted on (e.g. a
    :class:`outbox.operations.batches.BatchRecorder`, to list exactly those messages afterwards).

    Returns:
        How many messages were acted on, and how many were skipped (in another status,
        changed meanwhile, or gone).
    """
    options: dict[str, Any] = {}
    if op.not_yet_due and selection.all_matching:
        options["due_by"] = selection.as_of  # moved messages land before the walk (see retry_now)
    return op.run(selection.iter_ids(repo, op), progress, applied, **options)


def report(op: Operation, result: ActionResult, description: str) -> str:
    """The one-line report of a finished operation, for the user and the admin history."""
    text = _g("%(label)s %(description)s: %(acted)s %(past)s") % {
        "label": op.label,
        "description": description,
        "acted": f"{result.acted:,}",
        "past": op.past,
    }
    if result.skipped:
        text += _g(", %(skipped)s skipped (in another status or changed meanwhile)") % {
            "skipped": f"{result.skipped:,}"
        }
    return text + "."


def recover_selection(destination: str, since: float, as_of: float | None = None) -> Selection:
    """The dead letters of ``destination`` that failed at or after ``since`` (epoch
    seconds) and up to ``as_of`` (default now): what "Recover since" requeues.

    The ``failed`` index of one destination is scored by the time a message failed, so
    this is an exact score range (ZCOUNT / ZRANGEBYSCORE), whatever the number of messages.
    """
    return Selection(
        filter=MessageFilter(
            status=Status.FAILED.value, destination=destination, updated=TimeRange(since, None)
        ),
        as_of=time.time() if as_of is None else as_of,
        description=_g("dead letters of %(destination)s failed since %(since)s")
        % {"destination": destination, "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))},
    )


def recover_since(
    repo: MessageRepository,
    destination: str,
    since: float,
    *,
    as_of: float | None = None,
    progress: Progress | None = None,
    applied: Applied | None = None,
) -> ActionResult:
    """Requeue the dead letters of ``destination`` that failed since ``since`` (see
    :func:`recover_selection`): each goes back to pending with a fresh retry budget.
    Typically ``since`` is when the destination started failing
    (:attr:`outbox.destinations.health.DestinationHealth.failing_since`), after it recovered.

    Returns:
        How many were requeued and how many skipped (changed meanwhile).
    """
    return execute(repo, REQUEUE, recover_selection(destination, since, as_of), progress, applied)
