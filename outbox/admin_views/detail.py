"""One message: both records, masked headers, the body, the attempt history, and the
actions this user may take on it; plus the raw body as a download. A message of an
ordering key shows its key (a link to every message of the key), its sequence in the
key, the sequence delivered before it and, while it is not settled, the key's head
(:func:`outbox.admin_views.ordering.key_state`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch
from django.utils.translation import gettext as _

from outbox.admin_views.base import TEMPLATES, allowed_operations, console_view, context, require_view, url
from outbox.admin_views.formatting import mask_headers, moment, preview_body, safe_content_type
from outbox.admin_views.ordering import KeyState, key_list_url, key_state
from outbox.exceptions import MessageNotFound
from outbox.records import ACTIVE_STATUSES, Attempt, Message, Status
from outbox.redaction import destination_options, redact, secrets_for
from outbox.store import get_repository

if TYPE_CHECKING:
    from outbox.admin_views.base import ModelAdmin

#: File name extensions for downloads, by content type.
EXTENSIONS = {
    "application/json": "json",
    "text/plain": "txt",
    "text/html": "html",
    "application/xml": "xml",
    "text/xml": "xml",
}


@dataclass
class AttemptRow:
    """One attempt as shown: when, how long (ms), outcome, HTTP status, error, worker,
    the kind of error and the host it went to ("" when not recorded)."""

    started: datetime | None
    duration_ms: float
    outcome: str
    status_code: int | None
    error: str
    worker: str
    retry_count: int
    error_class: str = ""
    host: str = ""


def _get(message_id: str) -> Message:
    try:
        return get_repository().get(message_id)
    except MessageNotFound:
        raise Http404("No such message.") from None


def _attempt_row(a: Attempt, secrets: list[str]) -> AttemptRow:
    error = redact(a.error or "", secrets=secrets)
    return AttemptRow(
        moment(a.started_at),
        a.duration_ms,
        a.outcome,
        a.status_code,
        error,
        a.worker,
        a.retry_count,
        a.error_class or "",
        a.host or "",
    )


def _key_state(model_admin: ModelAdmin, message: Message) -> KeyState | None:
    """The state of the message's ordering key while the message is in its key's queue
    (not settled, or the dead letter blocking it); None otherwise."""
    if not message.ordering_key:
        return None
    if message.status not in (*ACTIVE_STATUSES, Status.FAILED.value):
        return None
    return key_state(model_admin, message.destination, message.ordering_key)


@console_view
def message_detail(model_admin: ModelAdmin, request: HttpRequest, message_id: str) -> HttpResponse:
    """GET: one message (``admin:outbox_message_detail``). Needs ``outbox.view_message``; 404 if gone."""
    require_view(model_admin, request)
    message = _get(message_id)
    secrets = secrets_for(message.headers, destination_options(message.destination))
    detail_url = url(model_admin, "message_detail", message.id)
    actions = [
        {
            "op": op,
            # After a delete the detail page is gone: go back to the list.
            "next": url(model_admin, "message_list") if op.name == "delete" else detail_url,
        }
        for op in allowed_operations(request)
        if message.status in op.statuses
    ]
    return TemplateResponse(
        request,
        f"{TEMPLATES}/message_detail.html",
        context(
            model_admin,
            request,
            _("Message %(id)s") % {"id": message.id},
            message=message,
            created=moment(message.created_at),
            send_time=moment(message.send_time),
            next_attempt=moment(message.next_attempt_at),
            last_attempt=moment(message.last_attempt_at),
            updated=moment(message.updated_at),
            headers=mask_headers(message.headers),
            last_error=redact(message.last_error or "", secrets=secrets),
            retry_policy=json.dumps(message.retry_policy, sort_keys=True),
            body=preview_body(message.body, message.content_type),
            body_url=url(model_admin, "message_body", message.id),
            attempts=[_attempt_row(a, secrets) for a in get_repository().attempts(message.id)],
            attempts_kept=get_repository().attempts_kept,
            actions=actions,
            action_url=url(model_admin, "message_action"),
            destination_url=url(model_admin, "destination", message.destination),
            key=_key_state(model_admin, message),
            key_url=key_list_url(model_admin, message.destination, message.ordering_key)
            if message.ordering_key
            else "",
        ),
    )


@console_view
def message_body(model_admin: ModelAdmin, request: HttpRequest, message_id: str) -> HttpResponse:
    """GET: the raw body as an attachment with its content type (``admin:outbox_message_body``).

    Served with ``Content-Disposition: attachment``, ``X-Content-Type-Options: nosniff``
    and a sandboxing Content-Security-Policy, so an HTML body never runs in the admin's origin.
    """
    require_view(model_admin, request)
    message = _get(message_id)
    content_type = safe_content_type(message.content_type)
    extension = EXTENSIONS.get(content_type.split(";")[0].strip().lower(), "bin")
    response = HttpResponse(message.body, content_type=content_type)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", message.id)
    response["Content-Disposition"] = f'attachment; filename="{name}.{extension}"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    return response


def history_link(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """GET: where the admin history links an entry about one message
    (``admin:outbox_message_change``, the id admin-quoted): a redirect to its detail page,
    or 404 for an id no detail page can have (one that unquotes to a ``/``)."""
    require_view(model_admin, request)
    try:
        target = url(model_admin, "message_detail", unquote(object_id))
    except NoReverseMatch:
        raise Http404("No such message.") from None
    return HttpResponseRedirect(target)
