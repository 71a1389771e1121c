"""The console's permissions: what the migration gives the outbox's unmanaged model."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

pytestmark = pytest.mark.django_db(transaction=True)  # send() writes at once (no atomic block)

PERMISSIONS = ("view_message", "requeue_message", "cancel_message", "delete_message", "manage_destination")
#: Webhooks for customers (docs/webhooks.md): the models' own and the secret's.
WEBHOOK_PERMISSIONS = {
    f"{action}_{model}"
    for action in ("add", "change", "delete", "view")
    for model in ("application", "endpoint", "eventtype")
} | {"view_endpoint_secret"}


def test_permissions_exist():
    """The migration gives the unmanaged model its content type and four permissions."""
    codenames = set(
        Permission.objects.filter(content_type__app_label="outbox").values_list("codename", flat=True)
    )
    assert codenames == set(PERMISSIONS) | WEBHOOK_PERMISSIONS
