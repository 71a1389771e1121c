"""Where the admin shows an endpoint's signing secret: on the page that answers the
request that made it (an endpoint added, secrets rotated) and on a page of its own for a
user holding ``outbox.view_endpoint_secret`` (a POST shows it). Nowhere else: not a
message of Django's messages framework (its cookie or session storage would keep the
secret in plain text), not the admin's history (its entries say what was done, never the
value). Each page is sent with ``Cache-Control: no-store`` (RFC 9111, 5.2.2.5): no browser
or proxy cache keeps a copy.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers

from outbox import webhooks
from outbox.admin_views.base import TEMPLATES
from outbox.destinations import secrets as secret_store
from outbox.destinations.secrets import SecretUnreadable
from outbox.exceptions import InvalidEndpoint

if TYPE_CHECKING:
    from django.contrib import admin

    from outbox import models

#: The permission that lets a user see (and so rotate) an endpoint's secret.
SECRET_PERMISSION = "outbox.view_endpoint_secret"


@dataclass(frozen=True)
class Shown:
    """One endpoint's secret(s) on a page: ``secret`` signs from now on; ``previous``
    lists ``(secret, until)`` of those still signing beside it (a rotation's overlap),
    ``until`` as UTC text."""

    endpoint: models.Endpoint
    secret: str
    previous: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:  # never the secrets
        return f"Shown(endpoint={self.endpoint!r}, secret='whsec_***')"


def _utc(epoch: float) -> str:
    try:
        return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # a time past datetime's year 9999
        return "a time past the year 9999"


def secret_page(
    model_admin: admin.ModelAdmin[Any],
    request: HttpRequest,
    title: str,
    shown: Sequence[Shown],
    *,
    note: str = "",
    continue_url: str = "",
    confirm: bool = False,
) -> HttpResponse:
    """The page that shows ``shown`` (or, with ``confirm``, the button that asks for the
    secret of ``shown[0].endpoint`` without it), never cached."""
    context = {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.model._meta,
        "shown": shown,
        "note": note,
        "continue_url": continue_url,
        "confirm": confirm,
    }
    response = TemplateResponse(request, f"{TEMPLATES}/endpoint_secret.html", context)
    add_never_cache_headers(response)
    return response


def show_secret_view(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, object_id: str
) -> HttpResponse:
    """``<endpoint id>/secret/``: GET asks (a button), POST shows the endpoint's secrets
    (the current one and those still signing beside it) and records in the admin's history
    that this user saw them.

    Raises:
        PermissionDenied: the user may not view endpoints or lacks ``SECRET_PERMISSION``.
        Http404: no such endpoint.
    """
    if not (model_admin.has_view_permission(request) and request.user.has_perm(SECRET_PERMISSION)):
        raise PermissionDenied
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    try:
        endpoint = webhooks.get_endpoint(object_id)
    except InvalidEndpoint:
        raise Http404("no such endpoint") from None
    back = "../change/"
    title = f"Signing secret of endpoint {endpoint}"
    if request.method == "GET":
        return secret_page(
            model_admin, request, title, [Shown(endpoint, "")], continue_url=back, confirm=True
        )
    try:
        secrets = secret_store.decrypt(endpoint.secrets)
    except SecretUnreadable as exc:
        return secret_page(model_admin, request, title, [], note=str(exc), continue_url=back)
    now = time.time()
    previous = tuple((s, _utc(until)) for s, until in secrets.previous if until > now)
    model_admin.log_change(request, endpoint, "Viewed the signing secret")
    return secret_page(
        model_admin, request, title, [Shown(endpoint, secrets.current, previous)], continue_url=back
    )
