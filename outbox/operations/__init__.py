"""Bulk operations on messages, shared by the console and the management commands.

- :mod:`~outbox.operations.operation`: the catalogue: each operation's name and
  description, who may run it, what it acts on (:class:`Selection`) and running it
  (:func:`execute`); re-exported here.
- :mod:`~outbox.operations.actions`: the work: requeue, retry now, cancel, delete, in
  chunks of 1,000 ids per Lua call.
- :mod:`~outbox.operations.batches`: a *batch* is the record of the exact messages one
  operation acted on (``?batch=<token>`` in the console); the word means only that.
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
