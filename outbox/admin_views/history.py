"""Recording bulk operations in the admin's history (``django.contrib.admin.models.LogEntry``)."""

from __future__ import annotations

from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType

from outbox import models
from outbox.operations.operation import Operation

#: The admin history's action flag per operation.
LOG_FLAGS = {"requeue": CHANGE, "retry_now": CHANGE, "cancel": CHANGE, "delete": DELETION}


def record_change(user_id: int, text: str, object_repr: str) -> LogEntry:
    """Write one CHANGE LogEntry about something that is not one message (a destination
    paused, resumed ...): ``object_repr`` names it, e.g. ``destination hook``."""
    return LogEntry.objects.create(
        user_id=user_id,
        content_type=ContentType.objects.get_for_model(models.Message, for_concrete_model=False),
        object_id=None,
        object_repr=object_repr[:200],
        action_flag=CHANGE,
        change_message=text,
    )


def record(user_id: int, op: Operation, text: str, object_id: str | None = None) -> LogEntry:
    """Write one LogEntry for an operation by ``user_id``.

    Args:
        user_id: the acting user's primary key.
        op: the operation (:data:`LOG_FLAGS` gives the entry's action flag).
        text: the report (see :func:`~outbox.operations.report`).
        object_id: the message id when the operation was on one message, else None.

    The object type is the unmanaged :class:`outbox.models.Message`; the object
    representation is the message id, or "messages" for a bulk operation.
    """
    return LogEntry.objects.create(
        user_id=user_id,
        content_type=ContentType.objects.get_for_model(models.Message, for_concrete_model=False),
        object_id=object_id,
        object_repr=(object_id or "messages")[:200],
        action_flag=LOG_FLAGS[op.name],
        change_message=text,
    )
