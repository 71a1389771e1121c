"""The outbox's only Django model: an unmanaged, table-less :class:`Message` that puts
"Outbox" in the admin index and carries the console's permissions.

Messages live in Redis (see :mod:`outbox.store`), not in the database. The model has
no table (``managed = False``); its migration exists so that Django creates its
content type and permissions:

==========================  =====================================================
permission                  lets a staff user
==========================  =====================================================
``outbox.view_message``     open the dashboard, the message list and details
``outbox.requeue_message``  requeue failed, cancelled or succeeded messages
``outbox.cancel_message``   cancel pending or retrying messages
``outbox.delete_message``   delete messages and their attempt history
==========================  =====================================================
"""

from __future__ import annotations

from django.db import models


class Message(models.Model):
    """Admin anchor for outbox messages (no table; never query it)."""

    class Meta:
        managed = False
        default_permissions = ("view",)
        permissions = (
            ("requeue_message", "Can requeue messages"),
            ("cancel_message", "Can cancel messages"),
            ("delete_message", "Can delete messages"),
        )
        verbose_name = "message"
        verbose_name_plural = "messages"
