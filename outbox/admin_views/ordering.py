"""Ordered delivery in the console: the state of one ordering key (for a message's page
and the list of the key's messages), a destination's blocked keys, and releasing one
("requeue head", "cancel head"; :func:`outbox.operations.ordering.release_key`).

A key is blocked when the message at its head became a dead letter under the ``ORDERING``
policy ``"block"`` (the default): its later messages stay ``waiting`` until the head is
requeued (delivered first, then the rest in order) or cancelled (the next one becomes
the head). Releasing is a POST through the admin's CSRF protection, answered first with
a confirmation page (nothing changes), done on the confirmation's POST (``post=yes``),
recorded in the admin history and reported on the blocked keys page. It needs
``outbox.requeue_message`` (requeue) or ``outbox.cancel_message`` (cancel).

Cost: a key's state is two small reads (its queue, its head's status); the blocked keys
page four pipelined rounds however many keys it shows
(:func:`outbox.operations.ordering.blocked_keys`), at most :data:`SHOWN` of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from outbox.admin_views.base import (
    TEMPLATES,
    BadRequest,
    console_view,
    context,
    list_url,
    require_view,
    url,
    user_id,
)
from outbox.admin_views.destinations import known
from outbox.admin_views.filters import KEY_PARAM
from outbox.admin_views.formatting import moment
from outbox.admin_views.history import record_change
from outbox.exceptions import InvalidMessage, MessageNotFound
from outbox.operations.operation import CANCEL, REQUEUE, Operation
from outbox.operations.ordering import RELEASES, blocked_key_count, blocked_keys, release_key
from outbox.records import Status
from outbox.redaction import destination_options, redact, secrets_for
from outbox.sending.validation import clean_ordering_key
from outbox.store import get_repository

if TYPE_CHECKING:
    from outbox.admin_views.base import ModelAdmin

#: Blocked keys listed on a destination's page of them (the longest blocked first).
SHOWN = 500
#: The operation (its permission) of each way to release a key.
RELEASE_OPERATIONS: dict[str, Operation] = {"requeue": REQUEUE, "cancel": CANCEL}


def key_list_url(model_admin: ModelAdmin, destination: str, key: str) -> str:
    """The URL of the list of every message of ordering ``key`` of ``destination``."""
    return list_url(model_admin, destination=destination, **{KEY_PARAM: key})


@dataclass
class KeyState:
    """One ordering key as it is now.

    Attributes:
        destination, key: the key.
        list_url: the list of every message of the key.
        blocked_url: the destination's blocked keys page.
        unsettled: messages in the key's queue, head included (0: all settled).
        head_id: the message at its head, or None when the queue is empty.
        head_url: its detail page ("" when none).
        head_status: its status ("" when none, or when it was deleted meanwhile).
    """

    destination: str
    key: str
    list_url: str
    blocked_url: str
    unsettled: int
    head_id: str | None
    head_url: str
    head_status: str

    @property
    def blocked(self) -> bool:
        """True when a dead letter at its head blocks the key (only a blocking dead
        letter stays in a key's queue: one skipped by policy ``"skip"`` leaves it)."""
        return self.head_status == Status.FAILED.value

    @property
    def waiting(self) -> int:
        """Messages behind the head."""
        return max(0, self.unsettled - 1)


def key_state(model_admin: ModelAdmin, destination: str, key: str) -> KeyState:
    """The state of ordering ``key`` of ``destination`` (two round trips: its head and
    length, its head's status)."""
    repo = get_repository()
    head, length = repo.key_head(destination, key)
    status = repo.resend_field([head], "status")[0] if head else ""
    return KeyState(
        destination,
        key,
        key_list_url(model_admin, destination, key),
        url(model_admin, "blocked_keys", destination),
        length,
        head,
        url(model_admin, "message_detail", head) if head else "",
        status,
    )


@dataclass
class BlockedRow:
    """One blocked key as the page shows it (times are aware datetimes)."""

    key: str
    head_id: str
    head_url: str
    error: str
    retry_count: int | None
    max_retries: int | None
    since: datetime
    waiting: int
    key_url: str


def _rows(model_admin: ModelAdmin, name: str) -> list[BlockedRow]:
    rows = []
    secrets_of_destination = destination_options(name)
    for b in blocked_keys(name, limit=SHOWN):
        head = b.head
        rows.append(
            BlockedRow(
                key=b.key,
                head_id=head.id if head else "",
                head_url=url(model_admin, "message_detail", head.id) if head else "",
                error=redact(head.last_error or "", secrets=secrets_for(head.headers, secrets_of_destination))
                if head
                else "",
                retry_count=head.retry_count if head else None,
                max_retries=head.max_retries if head else None,
                since=moment(b.since),
                waiting=b.waiting,
                key_url=key_list_url(model_admin, name, b.key),
            )
        )
    return rows


def _require_known(name: str) -> None:
    """Raise Http404 for a destination neither configured nor ever used."""
    if not known(name):
        raise Http404(_("No such destination."))


@console_view
def blocked_keys_page(model_admin: ModelAdmin, request: HttpRequest, name: str) -> HttpResponse:
    """GET: a destination's blocked ordering keys (``admin:outbox_blocked_keys``), the
    longest blocked first, each with its dead letter (id, error, retries, since when),
    how many messages wait behind it, and the buttons to release it that the user may
    use. Needs ``outbox.view_message``; 404 for a name neither configured nor ever used."""
    require_view(model_admin, request)
    _require_known(name)
    rows = _rows(model_admin, name)
    total = blocked_key_count(name) if len(rows) >= SHOWN else len(rows)
    return TemplateResponse(
        request,
        f"{TEMPLATES}/blocked_keys.html",
        context(
            model_admin,
            request,
            _("Blocked ordering keys of %(name)s") % {"name": name},
            name=name,
            rows=rows,
            total=total,
            shown=SHOWN,
            destination_url=url(model_admin, "destination", name),
            release_url=url(model_admin, "release_key", name),
            can_requeue=request.user.has_perm(REQUEUE.permission),
            can_cancel=request.user.has_perm(CANCEL.permission),
            refresh_seconds=15,
        ),
    )


def _released(how: str, key: str, name: str, head: str, waiting: int) -> str:
    """The report of a release."""
    if how == "requeue":
        return ngettext(
            "Ordering key %(key)s of %(name)s released: its dead letter %(head)s requeued; "
            "%(n)s message waiting behind it follows in order.",
            "Ordering key %(key)s of %(name)s released: its dead letter %(head)s requeued; "
            "%(n)s messages waiting behind it follow in order.",
            waiting,
        ) % {"key": key, "name": name, "head": head, "n": f"{waiting:,}"}
    return ngettext(
        "Ordering key %(key)s of %(name)s released: its dead letter %(head)s cancelled; "
        "the next of the %(n)s message waiting behind it is due now.",
        "Ordering key %(key)s of %(name)s released: its dead letter %(head)s cancelled; "
        "the next of the %(n)s messages waiting behind it is due now.",
        waiting,
    ) % {"key": key, "name": name, "head": head, "n": f"{waiting:,}"}


@console_view
def release_key_view(model_admin: ModelAdmin, request: HttpRequest, name: str) -> HttpResponse:
    """POST only (``admin:outbox_release_key``): release a blocked ordering key, ``key``,
    by ``how`` = ``requeue`` (its dead letter is delivered again, first; then the rest in
    order) or ``cancel`` (the next message becomes the head).

    Needs ``outbox.view_message`` and ``outbox.requeue_message`` or
    ``outbox.cancel_message`` (403 otherwise). Without ``post=yes``: the confirmation
    page. 404 for an unknown destination; 400 for another ``how`` or a value that is not
    an ordering key. A key that is not blocked (any more) is reported, nothing changed.
    """
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    require_view(model_admin, request)
    how = request.POST.get("how", "")
    op = RELEASE_OPERATIONS.get(how)
    if op is None:
        raise BadRequest(
            _("Unknown way to release a key; expected %(ways)s. Nothing was changed.")
            % {"ways": " or ".join(RELEASES)}
        )
    if not request.user.has_perm(op.permission):
        raise PermissionDenied
    _require_known(name)
    raw = request.POST.get("key", "")
    try:
        key = clean_ordering_key(raw) or ""
    except InvalidMessage:
        raise BadRequest(
            _("%(value)s is not an ordering key; nothing was changed.") % {"value": repr(raw[:40])}
        ) from None
    back = url(model_admin, "blocked_keys", name)
    state = key_state(model_admin, name, key)
    not_blocked = _("Ordering key %(key)s of %(name)s is not blocked (any more); nothing was changed.") % {
        "key": key,
        "name": name,
    }
    if not state.blocked:
        messages.warning(request, not_blocked)
        return HttpResponseRedirect(back)
    if request.POST.get("post") != "yes":
        return TemplateResponse(
            request,
            f"{TEMPLATES}/release_confirm.html",
            context(
                model_admin,
                request,
                _("%(label)s the head of ordering key %(key)s: are you sure?")
                % {"label": op.label, "key": key},
                name=name,
                key=key,
                how=how,
                state=state,
                destination_url=url(model_admin, "destination", name),
                form_url=url(model_admin, "release_key", name),
                cancel_url=back,
            ),
        )
    try:
        head = release_key(name, key, how)
    except MessageNotFound:  # released by someone else between the two reads
        messages.warning(request, not_blocked)
        return HttpResponseRedirect(back)
    text = _released(how, key, name, head, state.waiting)
    record_change(user_id(request), text, f"ordering key {key} of {name}")
    messages.success(request, text)
    return HttpResponseRedirect(back)
