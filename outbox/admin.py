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
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.functional import lazy
from django.utils.html import format_html
from redis.exceptions import RedisClusterException, RedisError

from outbox import models, webhooks
from outbox.admin_views import (
    confirm,
    dashboard,
    destinations,
    detail,
    endpoint_secrets,
    endpoints,
    listing,
    ordering,
)
from outbox.conf import endpoint_setting
from outbox.destinations import endpoints as endpoint_registry
from outbox.destinations import health
from outbox.destinations.secrets import SecretUnreadable
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
# Every change goes through outbox.webhooks / outbox.destinations.endpoints (validation,
# the secret encrypted, the workers told on commit); each form runs the same checks first,
# so bad input is a form error. A secret is never a form field nor a message of Django's
# messages framework (its cookie or session would keep it in plain text): it is shown on
# the page that answers the request that made it, and on the endpoint's own secret page
# to a user holding outbox.view_endpoint_secret (outbox.admin_views.endpoint_secrets). The
# admin's history (LogEntry) says what was done, never a secret.


def _form_errors(form: forms.BaseForm, checks: dict[str, Callable[[Any], Any]], data: dict[str, Any]) -> None:
    """Run each field's check on its cleaned value (the checked value replaces it); an
    ``InvalidMessage`` becomes that field's form error."""
    for name, check in checks.items():
        if name in data:
            try:
                data[name] = check(data[name])
            except InvalidMessage as exc:
                form.add_error(name, ValidationError(str(exc)))


class _RegistryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A registry model's admin: what its form cannot check beforehand (another request's
    change in between) is refused by the registry in ``save_model``; that becomes an error
    message on the form's page, with nothing saved (the admin's view is atomic), not a 500."""

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except (InvalidMessage, SecretUnreadable) as exc:
            self.message_user(request, f"Nothing was saved: {exc}", admin_messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


class ApplicationForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = models.Application
        fields = ("uid", "name", "metadata", "max_endpoints")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        _form_errors(
            self, {"uid": endpoint_registry.clean_uid, "metadata": endpoint_registry.clean_metadata}, data
        )
        return data


@admin.register(models.Application)
class ApplicationAdmin(_RegistryAdmin):
    form = ApplicationForm
    list_display = ("uid", "name", "max_endpoints", "created_at")
    search_fields = ("uid", "name")
    readonly_fields = ("created_at", "updated_at")

    def save_model(self, request: HttpRequest, obj: models.Application, form: Any, change: bool) -> None:
        data = form.cleaned_data
        endpoint_registry.save_application(
            obj,
            uid=data["uid"],
            name=data["name"],
            metadata=data["metadata"],
            max_endpoints=data["max_endpoints"],
        )

    def delete_model(self, request: HttpRequest, obj: models.Application) -> None:
        webhooks.delete_application(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[models.Application]) -> None:
        for app in queryset:
            webhooks.delete_application(app)


def _clean_schema(schema: Any) -> Any:
    if schema is not None and not isinstance(schema, dict):
        raise InvalidMessage("schema must be a JSON Schema (an object) or empty", field="schema")
    return endpoint_registry.clean_json(schema, "schema")


class EventTypeForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = models.EventType
        fields = ("name", "description", "schema", "example", "archived")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        checks: dict[str, Callable[[Any], Any]] = {
            "schema": _clean_schema,
            "example": lambda example: endpoint_registry.clean_json(example, "example"),
        }
        if "name" in self.fields:  # a new type (the name of one that exists is read-only)
            checks["name"] = lambda name: endpoint_registry.clean_event_type_name(name, "name")
        _form_errors(self, checks, data)
        return data


@admin.register(models.EventType)
class EventTypeAdmin(_RegistryAdmin):
    form = EventTypeForm
    list_display = ("name", "description", "archived", "updated_at")
    list_filter = ("archived",)
    search_fields = ("name", "description")
    readonly_fields = ("created_at", "updated_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return (*self.readonly_fields, "name") if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: models.EventType, form: Any, change: bool) -> None:
        data = form.cleaned_data
        saved = endpoint_registry.save_event_type(
            obj.name,
            description=data["description"],
            schema=data["schema"],
            example=data["example"],
            archived=data["archived"],
            create=not change,
        )
        obj.pk, obj._state.adding = saved.pk, False


class EndpointForm(forms.ModelForm):  # type: ignore[type-arg]
    """The endpoint's fields, checked by :mod:`outbox.destinations.endpoints` (the URL
    with the private-network guard, event types in the catalogue, headers, limits,
    metadata, the application's room for one more)."""

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
            "uid": lambda uid: None if uid in (None, "") else endpoint_registry.clean_uid(uid),
            "url": endpoint_registry.clean_url,
            "filter_types": endpoint_registry.clean_filter_types,
            "channels": endpoint_registry.clean_channels,
            "headers": endpoint_registry.clean_endpoint_headers,
            "metadata": endpoint_registry.clean_metadata,
        }
        _form_errors(
            self, {k: v for k, v in checks.items() if k in self.changed_data or k == "metadata"}, data
        )
        try:
            endpoint_registry.limits_of(data.get("rate_limit") or "", data.get("max_concurrency"))
        except InvalidMessage as exc:
            field = exc.field if exc.field in self.fields else "rate_limit"
            self.add_error(field, ValidationError(str(exc)))
        app = data.get("application") if self.instance._state.adding else self.instance.application
        if app is not None and self.instance._state.adding:
            try:
                endpoint_registry.check_room(app, app.endpoints.count())
            except InvalidMessage as exc:
                self.add_error("application", ValidationError(str(exc)))
        uid = data.get("uid")
        if app is not None and uid and "uid" not in self.errors:
            taken = models.Endpoint.objects.filter(application=app, uid=uid).exclude(pk=self.instance.pk)
            if taken.exists():
                self.add_error(
                    "uid", ValidationError(f"application {app.uid!r} has an endpoint with uid {uid!r}")
                )
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


def _overlap_text() -> str:
    """``ENDPOINTS["SECRET_OVERLAP"]`` in words, for the rotate action's label."""
    seconds = endpoint_setting("SECRET_OVERLAP")
    seconds = seconds.total_seconds() if hasattr(seconds, "total_seconds") else float(seconds)
    if seconds <= 0:
        return "replaced at once"
    if seconds % 3600 == 0:
        return f"signs {int(seconds // 3600)} hour(s) more"
    return f"signs {seconds:g} s more"


@admin.register(models.Endpoint)
class EndpointAdmin(_RegistryAdmin):
    """Endpoints: their state, last success and failure (from Redis, one round trip per
    page of at most 100), filters by application and state, search by URL and uid. The
    actions need the change permission; rotating a secret also ``view_endpoint_secret``
    (the new secret is shown to the user who rotated it: one nobody could see would be of
    no use to the customer). An endpoint's application is set when it is added."""

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

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # moving an endpoint to another application would move a customer's endpoint,
        # its secret and its deliveries to another tenant: register a new one there
        if obj is None:
            return self.readonly_fields
        # the link to its secret page, for a user who may see it
        secret = ("signing_secret",) if request.user.has_perm(endpoint_secrets.SECRET_PERMISSION) else ()
        return (*self.readonly_fields, *secret, "application")

    def get_urls(self) -> list[URLPattern]:
        def secret(request: HttpRequest, object_id: str) -> HttpResponse:
            return endpoint_secrets.show_secret_view(self, request, object_id)

        return [
            path(
                "<path:object_id>/secret/", self.admin_site.admin_view(secret), name="outbox_endpoint_secret"
            ),
            *super().get_urls(),
        ]

    def has_rotate_secret_permission(self, request: HttpRequest) -> bool:
        """Change the endpoint and see its secret (Django's action permissions are "any of")."""
        return self.has_change_permission(request) and bool(
            request.user.has_perm(endpoint_secrets.SECRET_PERMISSION)
        )

    @admin.display(description="signing secret")
    def signing_secret(self, obj: models.Endpoint) -> str:
        link = reverse(f"{self.admin_site.name}:outbox_endpoint_secret", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', link, "show it")

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
        request._outbox_created = created  # type: ignore[attr-defined]  # shown by response_add

    def response_add(
        self, request: HttpRequest, obj: models.Endpoint, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The page that shows the new endpoint's secret (once), instead of a redirect
        whose message would carry it in the messages cookie or the session."""
        created = getattr(request, "_outbox_created", None)
        if created is None:
            return super().response_add(request, obj, post_url_continue)
        change = reverse(f"{self.admin_site.name}:outbox_endpoint_change", args=[obj.pk])
        return endpoint_secrets.secret_page(
            self,
            request,
            f"Endpoint {created.endpoint} added",
            [endpoint_secrets.Shown(created.endpoint, created.secret)],
            note="Give the secret to the endpoint's owner: it verifies every request with it.",
            continue_url=change,
        )

    def delete_model(self, request: HttpRequest, obj: models.Endpoint) -> None:
        webhooks.delete_endpoint(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        for endpoint in queryset:
            webhooks.delete_endpoint(endpoint)

    @admin.action(description="Enable selected endpoints", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        for endpoint in queryset:
            webhooks.enable_endpoint(endpoint)
            self.log_change(request, endpoint, "Enabled")
        self.message_user(request, f"{queryset.count()} endpoint(s) enabled.")

    @admin.action(description="Disable selected endpoints", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        reason = f"disabled in the admin by {request.user}"
        for endpoint in queryset:
            webhooks.disable_endpoint(endpoint, reason=reason)
            self.log_change(request, endpoint, f"Disabled ({reason})")
        self.message_user(request, f"{queryset.count()} endpoint(s) disabled.")

    @admin.action(description="Send a test event", permissions=["change"])
    def send_test_event(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> None:
        sent = []
        for endpoint in queryset:
            event = webhooks.send_test_event(endpoint)
            sent.append(event)
            self.log_change(request, endpoint, f"Sent the test event {event.id}")
        self.message_user(request, f"{len(sent)} test event(s) sent: {', '.join(e.id for e in sent)}.")

    @admin.action(
        description=lazy(lambda: f"Rotate the signing secret (the old one {_overlap_text()})", str)(),
        permissions=["rotate_secret"],
    )
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[models.Endpoint]) -> HttpResponse | None:
        """Each endpoint's secret rotated; the new ones shown on the page this answers
        with (never in a message); an endpoint whose stored secret no key decrypts is
        left as it is, named in an error message."""
        shown = []
        for endpoint in queryset.select_related("application"):
            try:
                secret = webhooks.rotate_secret(endpoint)
            except SecretUnreadable as exc:
                self.message_user(request, f"Endpoint {endpoint}: not rotated: {exc}", admin_messages.ERROR)
                continue
            self.log_change(request, endpoint, f"Rotated the signing secret (the old one {_overlap_text()})")
            shown.append(endpoint_secrets.Shown(endpoint, secret))
        if not shown:
            return None
        return endpoint_secrets.secret_page(
            self,
            request,
            f"Signing secret of {len(shown)} endpoint(s) rotated",
            shown,
            note=f"The old secret of each {_overlap_text()}: give the new one to the endpoint's owner now.",
            continue_url=request.get_full_path(),
        )
