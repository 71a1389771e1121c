"""The outbox console in the Django admin.

"Outbox › Messages" in the admin index leads to the dashboard. The pages live under
the admin (``/admin/outbox/message/`` with the default site) and are named in the
admin site's namespace:

=========================================  ============================  ==========
URL name (``admin:...``)                   path                          method
=========================================  ============================  ==========
``outbox_dashboard``                       ``""``                        GET
``outbox_message_changelist`` (= dashboard)  ``""``                      GET
``outbox_message_list``                    ``messages/``                 GET
``outbox_message_detail``                  ``messages/<id>/``            GET
``outbox_message_change``                  ``messages/<id>/change/``     GET (redirect)
``outbox_message_body``                    ``messages/<id>/body/``       GET
``outbox_message_action``                  ``action/``                   POST
``outbox_message_action_status``           ``action/<job id>/``          GET
``outbox_endpoints``                       ``endpoints/``                GET
``outbox_destination``                     ``destinations/<name>/``      GET
``outbox_destination_action``              ``destinations/<name>/state/``  POST
``outbox_destination_recover``             ``destinations/<name>/recover/``  POST
``outbox_blocked_keys``                    ``destinations/<name>/blocked-keys/``  GET
``outbox_release_key``                     ``destinations/<name>/blocked-keys/release/``  POST
=========================================  ============================  ==========

Permissions (see :mod:`outbox.models`): every page needs ``view_message``; each
action its own ``requeue_message`` (requeue, retry now, recover since, requeue the
head of a blocked ordering key), ``cancel_message`` (cancel, cancel the head of a
blocked ordering key) or ``delete_message``; pausing, resuming, disabling and enabling a
destination needs ``manage_destination``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from functools import update_wrapper
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib import messages as admin_messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from redis.exceptions import RedisClusterException, RedisError

from outbox import models, webhooks
from outbox.admin_views import confirm, dashboard, destinations, detail, endpoints, listing, ordering
from outbox.destinations import endpoints as endpoint_registry
from outbox.destinations import health
from outbox.exceptions import InvalidMessage

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[models.Message]
else:  # Django's ModelAdmin is generic only in its stubs
    _ModelAdmin = admin.ModelAdmin


@admin.register(models.Message)
class MessageAdmin(_ModelAdmin):
    """Admin pages over the messages in Redis (no database rows).

    Attributes:
        list_per_page: rows per page of the message list.
        sync_action_limit: "select all matching" actions on more messages than this
            run as a background RQ job with a progress page; smaller ones run in the
            request (about 10,000 requeues per second; see ``docs``).

    A destination's one state comes from its holds and recent attempts
    (:func:`outbox.destinations.health.destination_state`), not from the messages kept.
    """

    list_per_page = 50
    sync_action_limit = 20_000

    # The admin's own add/change/delete views do not apply: messages are not rows.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return dashboard.dashboard(self, request)

    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            def bound(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                return view(self, request, *args, **kwargs)

            return self.admin_site.admin_view(update_wrapper(bound, view))

        return [
            path("", wrap(dashboard.dashboard), name="outbox_dashboard"),
            path("", wrap(dashboard.dashboard), name="outbox_message_changelist"),
            path("messages/", wrap(listing.message_list), name="outbox_message_list"),
            path("messages/<str:message_id>/", wrap(detail.message_detail), name="outbox_message_detail"),
            # The admin history links an entry about one message here (with an admin-quoted id).
            path("messages/<str:object_id>/change/", wrap(detail.history_link), name="outbox_message_change"),
            path("messages/<str:message_id>/body/", wrap(detail.message_body), name="outbox_message_body"),
            path("action/", wrap(confirm.message_action), name="outbox_message_action"),
            path("action/<str:job_id>/", wrap(confirm.action_status), name="outbox_message_action_status"),
            path("endpoints/", wrap(endpoints.endpoint_list), name="outbox_endpoints"),
            path("destinations/<str:name>/", wrap(destinations.destination_page), name="outbox_destination"),
            path(
                "destinations/<str:name>/state/",
                wrap(destinations.destination_action),
                name="outbox_destination_action",
            ),
            path(
                "destinations/<str:name>/recover/",
                wrap(destinations.destination_recover),
                name="outbox_destination_recover",
            ),
            path(
                "destinations/<str:name>/blocked-keys/",
                wrap(ordering.blocked_keys_page),
                name="outbox_blocked_keys",
            ),
            path(
                "destinations/<str:name>/blocked-keys/release/",
                wrap(ordering.release_key_view),
                name="outbox_release_key",
            ),
        ]


# -- webhooks for customers: applications, endpoints, event types (docs/webhooks.md) ---------
#
# Every change goes through outbox.webhooks (validation, the secret encrypted, the workers
# told on commit). The secret is never a form field: it appears once, in the message
# shown to the user who created the endpoint or rotated its secret (a rotation's only to a
# user holding outbox.view_endpoint_secret), so the admin's history (LogEntry) names
# changed fields, never values of secrets.


@admin.register(models.Application)
class ApplicationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("uid", "name", "max_endpoints", "created_at")
    search_fields = ("uid", "name")
    readonly_fields = ("created_at", "updated_at")

    def delete_model(self, request: HttpRequest, obj: models.Application) -> None:
        webhooks.delete_application(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[models.Application]) -> None:
        for app in queryset:
            webhooks.delete_application(app)


@admin.register(models.EventType)
class EventTypeAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "description", "archived", "updated_at")
    list_filter = ("archived",)
    search_fields = ("name", "description")
    readonly_fields = ("created_at", "updated_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (*self.readonly_fields, "name") if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: models.EventType, form: Any, change: bool) -> None:
        if not change:
            endpoint_registry.clean_event_type_name(obj.name, "name")
        obj.save()


class EndpointForm(forms.ModelForm):  # type: ignore[type-arg]
    """The endpoint's fields, checked by :mod:`outbox.destinations.endpoints` (the URL
    with the private-network guard, event types in the catalogue, headers, limits)."""

    class Meta:
        model = models.Endpoint
        fields = (
            "application",
            "uid",
            "url",
            "description",
            "filter_types",
            "channels",
            "rate_limit",
            "max_concurrency",
            "headers",
            "metadata",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        checks: dict[str, Callable[[Any], Any]] = {
            "url": endpoint_registry.clean_url,
            "filter_types": endpoint_registry.clean_filter_types,
            "channels": endpoint_registry.clean_channels,
            "headers": endpoint_registry.clean_endpoint_headers,
        }
        for name, check in checks.items():
            if name in data and name in self.changed_data:
                try:
                    data[name] = check(data[name])
                except InvalidMessage as exc:
                    self.add_error(name, ValidationError(str(exc)))
        try:
            endpoint_registry.limits_of(data.get("rate_limit") or "", data.get("max_concurrency"))
        except InvalidMessage as exc:
            self.add_error("rate_limit", ValidationError(str(exc)))
        return data


class EndpointChangeList(ChangeList):
    """The endpoint list, each row with its destination's health from Redis: one round
    trip per page (:func:`outbox.destinations.health.get_all_health` of the page's rows),
    whatever the number of endpoints registered."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        try:
            healths = health.get_all_health([e.destination for e in rows])
        except (RedisError, RedisClusterException):  # the list still shows the database's columns
            healths = {}
        for e in rows:
            e._outbox_health = healths.get(e.destination)


def _health_of(obj: models.Endpoint) -> health.DestinationHealth | None:
    return getattr(obj, "_outbox_health", None)


def _when(epoch: float | None) -> str:
    if not epoch:
        return "never"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@admin.register(models.Endpoint)
class EndpointAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Endpoints: their state, last success and failure (from Redis, one round trip per
    page of at most 100), filters by application and state, search by URL and uid."""

    form = EndpointForm
    list_display = (
        "__str__",
        "application",
        "url",
        "state",
        "delivery",
        "last_success",
        "last_failure",
        "console",
        "created_at",
    )
    list_filter = (("disabled", admin.BooleanFieldListFilter), "application")
    list_select_related = ("application",)
    search_fields = ("url", "uid", "application__uid")
    readonly_fields = ("id", "destination", "disabled", "disabled_reason", "created_at", "updated_at")
    actions = ("enable", "disable", "send_test_event", "rotate_secret")
    list_per_page = 100
    list_max_show_all = 100  # "show all" reads the health of every row: at most a page's worth

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return EndpointChangeList

    @admin.display(description="state")
    def state(self, obj: models.Endpoint) -> str:
        return f"disabled ({obj.disabled_reason})" if obj.disabled else "enabled"

    @admin.display(description="delivery")
    def delivery(self, obj: models.Endpoint) -> str:
        """Its destination's one state (healthy, failing, open, paused ...) and why."""
        h = _health_of(obj)
        return "–" if h is None else h.state

    @admin.display(description="last success")
    def last_success(self, obj: models.Endpoint) -> str:
        h = _health_of(obj)
        return "–" if h is None else _when(h.last_success_at)

    @admin.display(description="last failure")
    def last_failure(self, obj: models.Endpoint) -> str:
        h = _health_of(obj)
        return "–" if h is None else _when(h.last_failure_at)

    @admin.display(description="console")
    def console(self, obj: models.Endpoint) -> str:
        link = reverse(f"{self.admin_site.name}:outbox_destination", args=[obj.destination])
        return format_html('<a href="{}">{}</a>', link, "deliveries")

    def save_model(self, request: HttpRequest, obj: models.Endpoint, form: Any, change: bool) -> None:
        values = {
            name: form.cleaned_data.get(name) for name in EndpointForm.Meta.fields if name != "application"
        }
        if change:
            webhooks.update_endpoint(obj.pk, **{k: v for k, v in values.items() if k in form.changed_data})
            return
        created = webhooks.create_endpoint(obj.application, **values)
        obj.pk = created.endpoint.pk
        obj._state.adding = False
        self.message_user(
            request,
            f"Endpoint {created.endpoint} created. Its signing secret, shown this once: {created.secret}",
            admin_messages.WARNING,
        )

    def delete_model(self, request: HttpRequest, obj: models.Endpoint) -> None:
        webhooks.delete_endpoint(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        for endpoint in queryset:
            webhooks.delete_endpoint(endpoint)

    @admin.action(description="Enable selected endpoints")
    def enable(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        for endpoint in queryset:
            webhooks.enable_endpoint(endpoint)
        self.message_user(request, f"{queryset.count()} endpoint(s) enabled.")

    @admin.action(description="Disable selected endpoints")
    def disable(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        for endpoint in queryset:
            webhooks.disable_endpoint(endpoint, reason=f"disabled in the admin by {request.user}")
        self.message_user(request, f"{queryset.count()} endpoint(s) disabled.")

    @admin.action(description="Send a test event")
    def send_test_event(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        sent = [webhooks.send_test_event(endpoint) for endpoint in queryset]
        self.message_user(request, f"{len(sent)} test event(s) sent: {', '.join(e.id for e in sent)}.")

    @admin.action(description="Rotate the signing secret (the old one signs 24 hours more)")
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        show = request.user.has_perm("outbox.view_endpoint_secret")
        for endpoint in queryset:
            secret = webhooks.rotate_secret(endpoint)
            text = f"Secret of endpoint {endpoint} rotated" + (
                f"; the new one, shown this once: {secret}" if show else "."
            )
            self.message_user(request, text, admin_messages.WARNING if show else admin_messages.INFO)
