"""What every console page shares: the admin context, URLs and permission checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.urls import reverse

from .operations import OPERATIONS, Operation

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

#: Template directory of the console.
TEMPLATES = "admin/outbox"


def url(model_admin: ModelAdmin, name: str, *args: Any) -> str:
    """The URL of a console page, e.g. ``url(ma, "message_detail", message_id)``
    for the URL named ``admin:outbox_message_detail``."""
    return reverse(f"{model_admin.admin_site.name}:outbox_{name}", args=args)


def require_view(model_admin: ModelAdmin, request: HttpRequest) -> None:
    """Raise PermissionDenied (403) unless the user may view messages."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


def allowed_operations(request: HttpRequest) -> list[Operation]:
    """The operations the user holds the permission for, in menu order."""
    return [op for op in OPERATIONS.values() if request.user.has_perm(op.permission)]


def context(model_admin: ModelAdmin, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
    """The admin's page context plus the console's navigation."""
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "app_label": model_admin.model._meta.app_label,
        "title": title,
        "dashboard_url": url(model_admin, "dashboard"),
        "list_url": url(model_admin, "message_list"),
        **extra,
    }
