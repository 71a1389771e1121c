"""Bulk operations on messages, shared by the console and the management commands.

- :mod:`~outbox.operations.operation`: what each operation does, who may do it, what
  it acts on (:class:`Selection`) and running it (:func:`execute`); re-exported here.
- :mod:`~outbox.operations.actions`: requeue, retry now, cancel, delete, in batches.
- :mod:`~outbox.operations.batches`: the exact messages one operation acted on.
"""

from outbox.operations.operation import (
    CANCEL,
    DELETE,
    MAX_SELECTED,
    REQUEUE,
    RETRY_NOW,
    Operation,
    Selection,
    execute,
    recover_selection,
    recover_since,
    report,
)

__all__ = [
    "CANCEL",
    "DELETE",
    "MAX_SELECTED",
    "REQUEUE",
    "RETRY_NOW",
    "Operation",
    "Selection",
    "execute",
    "recover_selection",
    "recover_since",
    "report",
]
