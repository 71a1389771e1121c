"""The endpoints registered at runtime, paginated (``admin:outbox_endpoints``): per page
of at most :data:`PER_PAGE`, each endpoint's application, URL host, registration
(enabled or disabled) and delivery state from Redis (healthy, failing, open ...), last
success and failure, parked messages, with links to its destination page and the
admin's page; filters by application uid, registration and search by URL or uid.

Order: disabled endpoints first across pages (the database knows them), then by
application and age; within a page, the failing ones first (:data:`outbox.destinations.
health.TROUBLE_STATES`). A global "failing first" over every endpoint would read the
health of all of them; a page reads only its own.

Cost per page, whatever the number of endpoints: two database queries (the count and
the page) and one Redis round trip (:func:`outbox.destinations.health.get_all_health`
of the page's rows).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext as _

from outbox.admin_views.base import TEMPLATES, console_view, context, require_view, url
from outbox.admin_views.formatting import moment
from outbox.destinations import health
from outbox.models import Endpoint

if TYPE_CHECKING:
    from outbox.admin_views.base import ModelAdmin

#: Endpoints per page (the most one Redis round trip reads).
PER_PAGE = 100
#: Endpoints the dashboard shows, failing first (the rest: this page).
ON_DASHBOARD = 20


@dataclass
class EndpointRow:
    """One endpoint as listed."""

    name: str
    label: str
    application: str
    host: str
    disabled: bool
    disabled_reason: str
    state: str
    state_reason: str
    failing: bool
    last_success: Any
    last_failure: Any
    parked: int
    page_url: str
    admin_url: str


def endpoint_queryset(params: Any) -> QuerySet[Endpoint]:
    """The endpoints matching the page's filters (``application``: a uid; ``state``:
    ``enabled`` or ``disabled``; ``q``: part of the URL or uid), disabled first."""
    rows = Endpoint.objects.select_related("application").only(
        "id",
        "uid",
        "url",
        "disabled",
        "disabled_reason",
        "created_at",
        "application__uid",
        "application__name",
    )
    if application := (params.get("application") or "").strip():
        rows = rows.filter(application__uid=application)
    state = params.get("state")
    if state in ("enabled", "disabled"):
        rows = rows.filter(disabled=state == "disabled")
    if q := (params.get("q") or "").strip():
        rows = rows.filter(Q(url__icontains=q) | Q(uid__icontains=q))
    return rows.order_by("-disabled", "application__uid", "created_at", "id")


def endpoint_rows(model_admin: ModelAdmin, endpoints: list[Endpoint]) -> list[EndpointRow]:
    """Rows of ``endpoints`` with their health (one Redis round trip), failing first."""
    healths = health.get_all_health([e.destination for e in endpoints])
    site = model_admin.admin_site.name
    rows = []
    for e in endpoints:
        h = healths[e.destination]
        rows.append(
            EndpointRow(
                name=e.destination,
                label=e.uid or e.pk.hex[:12],
                application=e.application.uid,
                host=urlsplit(e.url).netloc.rpartition("@")[2],
                disabled=e.disabled,
                disabled_reason=e.disabled_reason,
                state=h.state,
                state_reason=h.state_reason,
                failing=h.failing,
                last_success=moment(h.last_success_at),
                last_failure=moment(h.last_failure_at),
                parked=h.parked,
                page_url=url(model_admin, "destination", e.destination),
                admin_url=reverse(f"{site}:outbox_endpoint_change", args=[e.pk]),
            )
        )
    rows.sort(key=lambda r: not r.failing)  # stable: the query's order within each group
    return rows


@console_view
def endpoint_list(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the endpoints, paginated (``admin:outbox_endpoints``). Needs ``outbox.view_message``."""
    require_view(model_admin, request)
    paginator = Paginator(endpoint_queryset(request.GET), PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    filters = {k: request.GET.get(k, "") for k in ("application", "state", "q")}
    query = urlencode({k: v for k, v in filters.items() if v})
    return TemplateResponse(
        request,
        f"{TEMPLATES}/endpoints.html",
        context(
            model_admin,
            request,
            _("Endpoints"),
            rows=endpoint_rows(model_admin, list(page.object_list)),
            page=page,
            total=paginator.count,
            filters=filters,
            page_base=url(model_admin, "endpoints") + "?" + (f"{query}&" if query else ""),
            admin_list_url=reverse(f"{model_admin.admin_site.name}:outbox_endpoint_changelist"),
            now=time.time(),
        ),
    )
