"""What every console page shares: the admin context, URLs, permission checks, and the
answer when a page cannot be served (:func:`console_view`: Redis unreachable -> 503,
:class:`BadRequest` -> 400, with a page that says what to check; any other error, a
Redis ``ResponseError`` included, is a bug: Django's 500, logged by ``django.request``)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from outbox.operations.operation import OPERATIONS, Operation
from outbox.store.client.connection import redis_location
from outbox.store.client.outages import REDIS_UNAVAILABLE

if TYPE_CHECKING:
    from typing import TypeAlias

    from django.contrib import admin

    from outbox import models

    #: The console's admin (outbox.admin.MessageAdmin), as the console's views see it.
    ModelAdmin: TypeAlias = admin.ModelAdmin[models.Message]

#: Template directory of the console.
TEMPLATES = "admin/outbox"


def url(model_admin: ModelAdmin, name: str, *args: Any) -> str:
    """The URL of a console page, e.g. ``url(ma, "message_detail", message_id)``
    for the URL named ``admin:outbox_message_detail``."""
    return reverse(f"{model_admin.admin_site.name}:outbox_{name}", args=args)


def list_url(model_admin: ModelAdmin, **params: Any) -> str:
    """The URL of the message list filtered by ``params`` (those None or "" left out),
    e.g. ``list_url(ma, status="failed", destination=name)`` or ``list_url(ma, batch=token)``."""
    kept = {k: v for k, v in params.items() if v is not None and v != ""}
    return url(model_admin, "message_list") + ("?" + urlencode(kept) if kept else "")


def user_id(request: HttpRequest) -> int:
    """The signed-in user's primary key (the admin lets in only signed-in staff).

    Raises:
        PermissionDenied: nobody is signed in (an anonymous user has no primary key).
    """
    pk = request.user.pk
    if pk is None:
        raise PermissionDenied
    return pk


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


logger = logging.getLogger("outbox")


class BadRequest(ValueError):
    """A request the console cannot act on (a parameter out of range...): answered 400
    with the text."""


def redis_hints() -> list[str]:
    """What to check when Redis cannot be reached (the admin page and the commands)."""
    return [
        _(
            "Is the Redis server of %(location)s running, and reachable from this process "
            "(host, port, password, TLS)?"
        )
        % {"location": redis_location()},
        _("The outbox keeps its messages and RQ its queues there; nothing was changed."),
        _("Reload this page once Redis answers again."),
    ]


def problem_page(
    model_admin: ModelAdmin,
    request: HttpRequest,
    status: int,
    title: str,
    problem: str,
    hints: list[str] | None = None,
) -> HttpResponse:
    """A console page saying why a request cannot be served, with HTTP ``status``."""
    response = TemplateResponse(
        request,
        f"{TEMPLATES}/problem.html",
        context(model_admin, request, title, problem=problem, hints=hints or [], status=status),
        status=status,
    )
    return response.render()


def console_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a console view: render it now, and answer 503 when Redis is not serving
    (:data:`~outbox.store.client.outages.REDIS_UNAVAILABLE`: unreachable, timed out, loading,
    failing over; with what to check) or 400 (:class:`BadRequest`). Any other exception,
    a Redis ``ResponseError`` included, is a bug in the console, not an outage: it
    propagates to Django (a 500, logged with its traceback by ``django.request``)."""

    @functools.wraps(view)
    def wrapped(model_admin: ModelAdmin, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response = view(model_admin, request, *args, **kwargs)
            if isinstance(response, TemplateResponse) and not response.is_rendered:
                response.render()  # templates read lazily: a Redis error must surface here
            return response
        except REDIS_UNAVAILABLE as exc:
            logger.warning("outbox console: Redis unavailable: %s: %s", type(exc).__name__, exc)
            return problem_page(
                model_admin,
                request,
                503,
                _("Redis is unavailable"),
                _("The outbox cannot reach its Redis (%(error)s).")
                % {"error": f"{type(exc).__name__}: {str(exc)[:300]}"},
                redis_hints(),
            )
        except BadRequest as exc:
            return problem_page(model_admin, request, 400, _("Bad request"), str(exc))

    return wrapped
