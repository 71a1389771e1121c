"""``python manage.py outbox_purge``: delete messages matching a filter, in batches.

Deletes the records and attempt history for good. Default statuses: the finished
ones (``succeeded``, ``failed``, ``cancelled``); messages being sent are never deleted.
Example, to keep a week of delivered messages::

    python manage.py outbox_purge --status succeeded --updated-before 7d --yes

See :mod:`outbox.management.bulk` for every option.
"""

from __future__ import annotations

from outbox.management.bulk import BulkCommand
from outbox.operations.operation import DELETE
from outbox.records import Status


class Command(BulkCommand):
    help = (
        "Delete messages (default: succeeded, failed and cancelled ones) matching the filters, "
        "with their attempt history."
    )
    operation = DELETE
    default_statuses = (Status.SUCCEEDED.value, Status.FAILED.value, Status.CANCELLED.value)
