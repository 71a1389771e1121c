"""``python manage.py outbox_requeue``: requeue messages matching a filter, in batches.

Requeued messages go back to ``pending`` with a fresh retry budget (retry count 0) and
are queued for delivery; their attempt history is kept. Default status: ``failed``.
Example::

    python manage.py outbox_requeue --destination orders --updated-after 2h --dry-run
    python manage.py outbox_requeue --destination orders --updated-after 2h --yes

See :mod:`outbox.management.bulk` for every option.
"""

from __future__ import annotations

from outbox.management.bulk import BulkCommand
from outbox.operations import REQUEUE
from outbox.records import Status


class Command(BulkCommand):
    help = (
        "Requeue failed (or, with --status, cancelled or succeeded) messages matching the filters: "
        "back to pending with a fresh retry budget, attempt history kept."
    )
    operation = REQUEUE
    default_statuses = (Status.FAILED.value,)
