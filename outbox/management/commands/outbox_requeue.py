"""``python manage.py outbox_requeue``: requeue messages matching a filter, in batches.

Requeued messages go back to ``pending`` with a fresh retry budget (retry count 0) and
are queued for delivery; their attempt history is kept. Default status: ``failed``.
Example::

    python manage.py outbox_requeue --destination orders --updated-after 2h --dry-run
    python manage.py outbox_requeue --destination orders --updated-after 2h --yes
    python manage.py outbox_requeue --destination orders --status-code 503 --yes
    python manage.py outbox_requeue --retry-now --destination orders --yes

``--retry-now`` acts on ``retrying`` messages instead: each is due now, its retry count
(its remaining budget) kept; only those whose next attempt is still to come.

See :mod:`outbox.management.bulk` for every option.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from outbox.management.bulk import BulkCommand
from outbox.operations.operation import REQUEUE, RETRY_NOW, Operation
from outbox.records import Status


class Command(BulkCommand):
    help = (
        "Requeue failed (or, with --status, cancelled or succeeded) messages matching the filters: "
        "back to pending with a fresh retry budget, attempt history kept. With --retry-now: make "
        "retrying messages due now, keeping their retry count."
    )
    operation = REQUEUE
    default_statuses = (Status.FAILED.value,)

    def statuses_of(self) -> tuple[str, ...]:
        return (*REQUEUE.statuses, *RETRY_NOW.statuses)

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--retry-now",
            action="store_true",
            help="retrying messages become due now, their retry count kept (instead of a requeue)",
        )

    def operation_for(self, options: dict[str, Any]) -> Operation:
        return RETRY_NOW if options.get("retry_now") else REQUEUE

    def default_statuses_for(self, op: Operation) -> tuple[str, ...]:
        return RETRY_NOW.statuses if op is RETRY_NOW else self.default_statuses
