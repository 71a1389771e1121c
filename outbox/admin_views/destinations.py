"""One destination: its settings, health (state, windowed success rate, latency over
time, last success, failing since, parked messages, blocked ordering keys: a link to
them, :mod:`.ordering`), its most frequent errors (each a link to its messages), and the operator's actions on it: pause, resume, disable,
enable (``outbox.manage_destination``) and "Recover since" (requeue the dead letters
that failed since a time; ``outbox.requeue_message``).

Every action is a POST through the admin's CSRF protection, answered first with a
confirmation page (nothing changes), then done on the confirmation's POST
(``post=yes``), recorded in the admin history, and reported on the destination page.

Cost: a fixed number of small reads (:func:`outbox.destinations.health.get_health`, one pipeline for
the 60-minute timeline, one for the 24 hourly error hashes, one ZCOUNT, one pipeline of
a ZCARD per partition for the blocked keys), whatever the number of messages.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from outbox import webhooks
from outbox.admin_views.base import (
    TEMPLATES,
    BadRequest,
    console_view,
    context,
    list_url,
    problem_page,
    require_view,
    url,
    user_id,
)
from outbox.admin_views.chart import CHART_MINUTES, attempt_chart, latency_chart
from outbox.admin_views.confirm import batch_report
from outbox.admin_views.filters import parse_as_of
from outbox.admin_views.formatting import duration, moment
from outbox.admin_views.history import record_change
from outbox.conf import outbox_settings
from outbox.destinations import controls, health
from outbox.destinations import endpoints as endpoint_registry
from outbox.destinations.config import Destination, endpoint_as_destination, get_destination, get_transport
from outbox.endpoint_names import is_endpoint
from outbox.exceptions import UnknownDestination
from outbox.models import Endpoint
from outbox.operations.batches import BatchRecorder
from outbox.operations.operation import REQUEUE, execute, recover_selection, report
from outbox.redaction import destination_options, redact, secrets_for
from outbox.store import get_repository
from outbox.times import parse_time

if TYPE_CHECKING:
    from outbox.admin_views.base import ModelAdmin

#: The permission for pause, resume, disable and enable.
MANAGE_PERMISSION = "outbox.manage_destination"
#: Error groups listed.
ERROR_GROUPS = 10


@dataclass(frozen=True)
class StateAction:
    """An operator action on a destination's admin state."""

    name: str
    label: str | Promise
    explanation: str | Promise


STATE_ACTIONS = {
    "pause": StateAction(
        "pause",
        gettext_lazy("Pause"),
        gettext_lazy(
            "No new attempt goes to this destination: its due messages wait (parked, not failed, "
            "no retry charged) until it is resumed. Attempts in flight finish."
        ),
    ),
    "resume": StateAction(
        "resume",
        gettext_lazy("Resume"),
        gettext_lazy("Delivery starts again: the parked messages go back to their queue, oldest due first."),
    ),
    "disable": StateAction(
        "disable",
        gettext_lazy("Disable"),
        gettext_lazy(
            "Like pause, shown as disabled with a reason (for a receiver that is gone). "
            "Its messages wait until it is enabled."
        ),
    ),
    "enable": StateAction(
        "enable",
        gettext_lazy("Enable"),
        gettext_lazy(
            "Delivery starts again with a closed circuit breaker and the failure run forgotten: "
            "the parked messages go back to their queue, oldest due first."
        ),
    ),
}


PAUSED = gettext_lazy("Destination %(name)s paused")
DISABLED = gettext_lazy("Destination %(name)s disabled")
RESUMED = gettext_lazy("resumed")
ENABLED = gettext_lazy("enabled")


@dataclass
class ErrorRow:
    """One error group as shown, with the link to its messages."""

    status_code: int | None
    error_class: str
    count: int
    last_at: datetime | None
    last_error: str
    url: str


def known(name: str) -> bool:
    """True for a configured destination, an endpoint, or one messages were ever sent to
    (a fixed number of reads, whatever the number of destinations)."""
    return (
        name in outbox_settings.DESTINATIONS
        or _endpoint(name) is not None
        or get_repository().is_known_destination(name)
    )


def _endpoint(name: str) -> endpoint_registry.EndpointLabel | None:
    """The endpoint registered at runtime called ``name`` (one query), or None."""
    return endpoint_registry.describe([name]).get(name) if is_endpoint(name) else None


def _manageable(name: str) -> bool:
    """A settings destination or an existing endpoint: what pause, disable, recover act on."""
    return name in outbox_settings.DESTINATIONS or _endpoint(name) is not None


def endpoint_admin_url(model_admin: ModelAdmin, pk: Any) -> str:
    """The admin's change page of endpoint ``pk``."""
    return reverse(f"{model_admin.admin_site.name}:outbox_endpoint_change", args=[pk])


def _endpoint_settings(model_admin: ModelAdmin, label: endpoint_registry.EndpointLabel) -> dict[str, Any]:
    """What the page shows of an endpoint's configuration: its application, uid, URL,
    the admin's link, and the policies it has as a destination (retries, ordering,
    limits: the global ones and its own rate and concurrency limits)."""
    row = Endpoint.objects.only("rate_limit", "max_concurrency").get(pk=label.id)
    out: dict[str, Any] = {
        "configured": True,
        "endpoint": label,
        "admin_url": endpoint_admin_url(model_admin, label.id),
        "application_url": reverse(
            f"{model_admin.admin_site.name}:outbox_application_change", args=[label.application_pk]
        ),
        "transport": "endpoint",
        "transport_class": "EndpointTransport",
        "host": label.host,
    }
    try:
        dest = endpoint_as_destination(
            SimpleNamespace(
                name=label.name, rate_limit=row.rate_limit, max_concurrency=row.max_concurrency, options={}
            )
        )
    except ImproperlyConfigured as exc:
        out["error"] = str(exc)[:300]
        return out
    return {**out, **_policies(dest)}


def allowed_state_actions(admin: str) -> list[StateAction]:
    """The actions that make sense in a destination's current admin state."""
    if admin == "disabled":
        return [STATE_ACTIONS["enable"]]
    if admin == "paused":
        return [STATE_ACTIONS["resume"], STATE_ACTIONS["disable"]]
    return [STATE_ACTIONS["pause"], STATE_ACTIONS["disable"]]


def _settings(model_admin: ModelAdmin, name: str) -> dict[str, Any]:
    """What the page shows of a destination's settings (only names that exist);
    ``breaker_off`` is True for a configured destination without a circuit breaker (its
    page then says so instead of a breaker state)."""
    label = _endpoint(name)
    if label is not None:
        return _endpoint_settings(model_admin, label)
    config = outbox_settings.DESTINATIONS.get(name)
    if config is None:
        return {"configured": False, "endpoint_gone": is_endpoint(name)}
    out: dict[str, Any] = {"configured": True, "transport": config.get("TRANSPORT", "")}
    try:
        dest = get_destination(name)
        transport = get_transport(name)
    except (UnknownDestination, ImproperlyConfigured) as exc:
        out["error"] = str(exc)[:300]
        return out
    out["host"] = getattr(transport, "host", "")
    out["transport_class"] = type(transport).__name__
    return {**out, **_policies(dest)}


def _policies(dest: Destination) -> dict[str, Any]:
    """A destination's retries, ordering policy and limits as the page shows them."""
    out: dict[str, Any] = {}
    out["max_retries"] = dest.max_retries
    out["retry_policy"] = json.dumps(dest.retry_policy.to_dict(), sort_keys=True)
    out["max_in_flight"] = dest.max_in_flight
    out["max_in_flight_default"] = dest.max_in_flight_default
    out["breaker_off"] = dest.breaker is None
    out["ordering"] = dest.ordering
    limits = []
    for label, attr in (
        ("circuit breaker", "breaker"),
        ("rate limit", "rate_limit"),
        ("max concurrency (all workers)", "max_concurrency"),
        ("disable after failing for", "disable_after"),
    ):
        value = getattr(dest, attr)
        if attr == "disable_after" and value:
            value = duration(value)
        limits.append((label, "none" if value in (None, False) else value))
    out["limits"] = limits
    return out


def _error_rows(model_admin: ModelAdmin, name: str, secrets: list[str]) -> list[ErrorRow]:
    rows = []
    for g in health.error_groups(name, limit=ERROR_GROUPS):
        rows.append(
            ErrorRow(
                g.status_code,
                g.error_class,
                g.count,
                moment(g.last_at) if g.last_at else None,
                redact(g.last_error or "", secrets=secrets),
                list_url(model_admin, destination=name, status_code=g.status_code, error_class=g.error_class),
            )
        )
    return rows


def _default_since(h: health.DestinationHealth, now: float) -> float:
    """Recover since: when it started failing; after it recovered, when its last run of
    failures started; else an hour ago."""
    return h.failing_since or h.last_failing_since or now - 3600


@console_view
def destination_page(model_admin: ModelAdmin, request: HttpRequest, name: str) -> HttpResponse:
    """GET: one destination (``admin:outbox_destination``). Needs ``outbox.view_message``;
    404 for a name neither configured nor ever used."""
    require_view(model_admin, request)
    if not known(name):
        if is_endpoint(name):  # a page that says why (Django's own 404 page shows no reason)
            return problem_page(
                model_admin,
                request,
                404,
                _("No such endpoint"),
                _("Endpoint %(name)s was deleted (its deliveries and its state with it) or never registered.")
                % {"name": name},
            )
        raise Http404(_("No such destination."))
    now = time.time()
    h = health.get_health(name)
    minutes = health.timeline(name, CHART_MINUTES)
    chart = attempt_chart(minutes)
    latency = latency_chart(minutes)
    secrets = secrets_for(None, destination_options(name))
    can_manage = request.user.has_perm(MANAGE_PERMISSION)
    can_recover = request.user.has_perm(REQUEUE.permission)
    since = _default_since(h, now)
    repo = get_repository()
    counts = repo.counts(name)
    window = h.window
    settings = _settings(model_admin, name)
    manageable = settings.get("configured", False)
    return TemplateResponse(
        request,
        f"{TEMPLATES}/destination.html",
        context(
            model_admin,
            request,
            _("Destination %(name)s") % {"name": name},
            name=name,
            h=h,
            window=window,
            success_rate=None if not window.attempts else round(100 * window.succeeded / window.attempts, 1),
            window_minutes=window.seconds // 60,
            settings=settings,
            last_success=moment(h.last_success_at),
            last_failure=moment(h.last_failure_at),
            failing_since=moment(h.failing_since),
            failing_for=duration(now - h.failing_since) if h.failing_since else "",
            opened_at=moment(h.opened_at),
            next_probe=moment(h.next_probe_at),
            blocked_until=moment(h.blocked_until) if h.blocked_until and h.blocked_until > now else None,
            chart=chart,
            latency=latency,
            errors=_error_rows(model_admin, name, secrets),
            state_actions=allowed_state_actions(h.admin) if can_manage and manageable else [],
            can_recover=can_recover and manageable,
            since=moment(since),
            status_links=[
                (s, n, list_url(model_admin, destination=name, status=s)) for s, n in counts.items()
            ],
            action_url=url(model_admin, "destination_action", name),
            recover_url=url(model_admin, "destination_recover", name),
            blocked_keys=repo.blocked_key_count(name),
            blocked_keys_url=url(model_admin, "blocked_keys", name),
            refresh_seconds=15,
        ),
    )


@console_view
def destination_action(model_admin: ModelAdmin, request: HttpRequest, name: str) -> HttpResponse:
    """POST only (``admin:outbox_destination_action``): pause, resume, disable or enable.

    Needs ``outbox.view_message`` and ``outbox.manage_destination`` (403 otherwise).
    Without ``post=yes``: the confirmation page. 404 for an unconfigured destination.
    """
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    require_view(model_admin, request)
    if not request.user.has_perm(MANAGE_PERMISSION):
        raise PermissionDenied
    if not _manageable(name):
        raise Http404(_("No such destination (only configured destinations and endpoints can be paused)."))
    action = STATE_ACTIONS.get(request.POST.get("action", ""))
    if action is None:
        raise BadRequest(_("Unknown destination action; expected pause, resume, disable or enable."))
    reason = (request.POST.get("reason") or "").strip()[:200]
    back = url(model_admin, "destination", name)
    if request.POST.get("post") != "yes":
        return TemplateResponse(
            request,
            f"{TEMPLATES}/destination_confirm.html",
            context(
                model_admin,
                request,
                _("%(label)s destination %(name)s: are you sure?") % {"label": action.label, "name": name},
                name=name,
                action=action,
                reason=reason,
                with_reason=action.name in ("pause", "disable"),
                hidden_fields=[("action", action.name)],
                form_url=url(model_admin, "destination_action", name),
                cancel_url=back,
                parked=health.get_health(name).parked,
            ),
        )
    if is_endpoint(name) and action.name in ("disable", "enable"):
        # an endpoint's row says whether it is disabled (workers follow it): change it there
        text = _endpoint_state(name, action.name, reason or f"disabled in the console by {request.user}")
    elif action.name in ("pause", "disable"):
        getattr(controls, action.name)(name, reason=reason)
        text = (PAUSED if action.name == "pause" else DISABLED) % {"name": name}
        text = text + (f" ({reason})" if reason else "") + "."
    else:
        moved = getattr(controls, action.name)(name)
        text = ngettext(
            "Destination %(name)s %(done)s: %(n)s parked message put back.",
            "Destination %(name)s %(done)s: %(n)s parked messages put back.",
            moved,
        ) % {"name": name, "done": RESUMED if action.name == "resume" else ENABLED, "n": f"{moved:,}"}
    record_change(user_id(request), text, f"destination {name}")
    messages.success(request, text)
    return HttpResponseRedirect(back)


def _endpoint_state(name: str, action: str, reason: str) -> str:
    """Disable or enable endpoint ``name`` through :mod:`outbox.webhooks` (its row, then
    Redis on commit); the text reported."""
    if action == "disable":
        webhooks.disable_endpoint(name, reason=reason)
        return (DISABLED % {"name": name}) + f" ({reason})."
    parked = health.get_health(name).parked
    webhooks.enable_endpoint(name)
    return ngettext(
        "Destination %(name)s %(done)s: %(n)s parked message put back.",
        "Destination %(name)s %(done)s: %(n)s parked messages put back.",
        parked,
    ) % {"name": name, "done": ENABLED, "n": f"{parked:,}"}


def _parse_since(raw: str | None, now: float) -> float | None:
    """The "since" of a recovery: a time as the list's filters take it (epoch seconds,
    a date-time, ``2h`` ago ...), not in the future and not before 1970 (no message
    failed earlier; the page can show any time from then in every time zone); None when
    none is given.

    Raises:
        BadRequest: it cannot be read.
    """
    if raw is None or raw.strip() == "":
        return None
    try:
        since = parse_time(raw.strip(), now)
    except ValueError as exc:
        raise BadRequest(_("Recover since: %(error)s; nothing was changed.") % {"error": exc}) from None
    return min(max(since, 0.0), now)


@console_view
def destination_recover(model_admin: ModelAdmin, request: HttpRequest, name: str) -> HttpResponse:
    """POST only (``admin:outbox_destination_recover``): requeue the destination's dead
    letters that failed since a time (``since``; default: when it started failing).

    Needs ``outbox.view_message`` and ``outbox.requeue_message``. Without ``post=yes``:
    the confirmation page with the count. Then runs in the request and reports with a
    link to exactly the messages requeued (a batch).
    """
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    require_view(model_admin, request)
    if not request.user.has_perm(REQUEUE.permission):
        raise PermissionDenied
    if not _manageable(name):
        raise Http404(_("No such destination (only configured destinations and endpoints can be recovered)."))
    now = time.time()
    since = _parse_since(request.POST.get("since"), now)
    if since is None:
        since = _default_since(health.get_health(name), now)
    repo = get_repository()
    back = url(model_admin, "destination", name)
    if request.POST.get("post") != "yes":
        count = recover_selection(name, since, now).count(repo, REQUEUE)
        return TemplateResponse(
            request,
            f"{TEMPLATES}/destination_confirm.html",
            context(
                model_admin,
                request,
                _("Recover destination %(name)s: are you sure?") % {"name": name},
                name=name,
                action=StateAction(
                    "recover",
                    _("Requeue"),
                    _(
                        "Each dead letter goes back to pending with a fresh retry budget and is delivered "
                        "again; its attempt history is kept."
                    ),
                ),
                recover=True,
                count=count.n,
                since=moment(since),
                list_url_since=list_url(
                    model_admin, status="failed", destination=name, updated_from=repr(since)
                ),
                hidden_fields=[("since", repr(since)), ("as_of", repr(now))],
                form_url=url(model_admin, "destination_recover", name),
                cancel_url=back,
            ),
        )
    try:
        as_of = parse_as_of(request.POST.get("as_of"), now)
    except ValueError as exc:
        raise BadRequest(_("%(error)s; nothing was changed.") % {"error": exc}) from None
    recorder = BatchRecorder(repo)
    selection = recover_selection(name, since, as_of)
    result = execute(repo, REQUEUE, selection, applied=recorder)  # what recover_since() does
    text = report(REQUEUE, result, selection.description)
    record_change(user_id(request), text, f"destination {name}")
    if result.acted:
        messages.success(request, batch_report(model_admin, text, recorder.token, result.acted, REQUEUE.past))
    else:
        messages.warning(request, text)
    return HttpResponseRedirect(back)
