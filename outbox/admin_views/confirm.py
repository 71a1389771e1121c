"""Bulk actions: the confirmation page, the action itself, and background progress.

Flow (all mutations are POSTs through the admin's CSRF protection):

1. The list (or a detail page) POSTs ``action`` with either ``_selected_action`` ids
   or ``select_across=1`` and the list's filter parameters to
   ``admin:outbox_message_action``.
2. Without ``post=yes`` the view answers with the confirmation page: how many
   messages the action will act on and what will happen. Nothing changes.
3. The confirmation POSTs the same fields with ``post=yes`` and ``as_of`` (when the
   page was shown). Selected ids, and "all matching" selections of up to
   ``MessageAdmin.sync_action_limit`` messages, run in the request (1,000 ids per
   Lua call) and the user is sent back with a report "N requeued, M skipped".
   Larger selections (or ones whose size a bounded scan could not pin down) run as a
   background RQ job (:mod:`.tasks`, registered in the outbox's own keys) and the user
   is sent to its progress page.
4. The ids acted on are kept as a batch (:mod:`outbox.operations.batches`, 24 hours): the report
   links to the list of exactly those messages (``?batch=<token>``). Deleted messages
   are gone, so a delete keeps no batch.

Every step checks the operation's permission (403 otherwise), and each action is
recorded in the admin history (LogEntry) with the user.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from outbox.admin_views import tasks
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
from outbox.admin_views.filters import (
    FILTER_PARAMS,
    KEY_PARAM,
    SEARCH_PARAM,
    describe,
    parse_as_of,
    parse_filter,
    search_ids,
    search_text,
)
from outbox.admin_views.history import record
from outbox.operations.batches import recorder_for
from outbox.operations.operation import MAX_SELECTED, OPERATIONS, Operation, Selection, execute, report
from outbox.store import get_repository

if TYPE_CHECKING:
    from outbox.admin_views.base import ModelAdmin

#: Selected ids listed on the confirmation page (the count covers them all).
IDS_SHOWN = 20
#: Longest message id accepted from a form.
MAX_ID_LENGTH = 100
#: What an RQ job id may hold (RQ refuses others with a ValueError).
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class SelectionError(ValueError):
    """The POSTed selection cannot be acted on; the text says why (sent back to the list)."""


class InvalidSelection(BadRequest):
    """The POSTed filter or ``as_of`` is invalid: answered 400, nothing changed."""


def _next_url(model_admin: ModelAdmin, request: HttpRequest) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, {request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return url(model_admin, "message_list")


def selection_from_post(data: QueryDict, now: float) -> Selection:
    """The selection a POST describes.

    Raises:
        SelectionError: nothing selected, or too many ids.
        InvalidSelection: an invalid filter (acting on a filter with a parameter ignored
            would act on more than the user chose), an ordering key (no filter of "all
            matching" holds one) or ``as_of``.
    """
    if data.get("select_across") == "1":
        if data.get(KEY_PARAM):
            raise InvalidSelection(
                _(
                    "“All matching” cannot act on the messages of one ordering key (its filter would "
                    "select every message of the destination), so nothing was changed: select them "
                    "on the key's list instead."
                )
            )
        search = search_text(data)
        if search:
            return Selection(
                ids=search_ids(get_repository(), search).ids,
                description=_("the messages found for %(search)s") % {"search": repr(search)},
            )
        flt, params, errors = parse_filter(data, now)
        if errors:
            raise InvalidSelection(_("The filter is not valid, so nothing was changed: ") + " ".join(errors))
        try:
            as_of = parse_as_of(data.get("as_of"), now)
        except ValueError as exc:
            raise InvalidSelection(_("%(error)s; nothing was changed.") % {"error": exc}) from None
        return Selection(
            filter=flt,
            as_of=as_of,
            description=_("all messages matching %(filter)s") % {"filter": describe(params)},
        )
    ids = list(dict.fromkeys(i for i in data.getlist("_selected_action") if i and len(i) <= MAX_ID_LENGTH))
    if not ids:
        raise SelectionError(
            _("Items must be selected in order to perform actions on them. No items have been changed.")
        )
    if len(ids) > MAX_SELECTED:
        raise SelectionError(
            _("At most %(n)s messages can be selected; use “select all matching” instead.")
            % {"n": f"{MAX_SELECTED:,}"}
        )
    noun = (
        _("message %(id)s") % {"id": ids[0]}
        if len(ids) == 1
        else _("%(n)s selected messages") % {"n": f"{len(ids):,}"}
    )
    return Selection(ids=ids, description=noun)


def _hidden_fields(data: QueryDict, op: Operation, as_of: float) -> list[tuple[str, str]]:
    """The fields the confirmation form POSTs again (selection, filter, return URL)."""
    fields = [("action", op.name), ("as_of", repr(as_of))]
    for name in ("select_across", "next", SEARCH_PARAM, *FILTER_PARAMS):
        if value := data.get(name):
            fields.append((name, value))
    if data.get("select_across") != "1":
        fields += [("_selected_action", i) for i in dict.fromkeys(data.getlist("_selected_action"))]
    return fields


@console_view
def message_action(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """POST only (``admin:outbox_message_action``): confirm, then run, a bulk action.

    Needs ``outbox.view_message`` and the operation's own permission
    (``outbox.requeue_message``, ``outbox.cancel_message``, ``outbox.delete_message``).
    """
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    require_view(model_admin, request)
    next_url = _next_url(model_admin, request)
    op = OPERATIONS.get(request.POST.get("action", ""))
    if op is None:
        messages.warning(request, _("No action selected."))
        return HttpResponseRedirect(next_url)
    if not request.user.has_perm(op.permission):
        raise PermissionDenied
    now = time.time()
    try:
        selection = selection_from_post(request.POST, now)
    except SelectionError as exc:
        messages.warning(request, str(exc))
        return HttpResponseRedirect(next_url)
    repo = get_repository()
    count = selection.count(repo, op)
    limit = getattr(model_admin, "sync_action_limit", 20_000)
    background = selection.all_matching and (count.n > limit or not count.exact)

    if request.POST.get("post") != "yes":
        return TemplateResponse(
            request,
            f"{TEMPLATES}/action_confirm.html",
            context(
                model_admin,
                request,
                _("%(label)s messages: are you sure?") % {"label": op.label},
                op=op,
                selection=selection,
                count=count,
                selected=len(selection.ids) if selection.ids is not None else None,
                ids_shown=(selection.ids or [])[:IDS_SHOWN],
                statuses=", ".join(op.statuses),
                background=background,
                hidden_fields=_hidden_fields(request.POST, op, now),
                action_url=url(model_admin, "message_action"),
                cancel_url=next_url,
            ),
        )

    recorder = recorder_for(repo, op)
    if background:
        job_id = tasks.start(
            op, selection, user_id(request), count.n, batch=recorder.token if recorder else None
        )
        record(
            user_id(request),
            op,
            f"{op.label} {selection.description}: started in the background "
            f"({'' if count.exact else 'at least '}{count.n:,} messages; job {job_id}).",
        )
        return HttpResponseRedirect(url(model_admin, "message_action_status", job_id))

    result = execute(repo, op, selection, applied=recorder)
    text = report(op, result, selection.description)
    single = selection.ids[0] if selection.ids is not None and len(selection.ids) == 1 else None
    record(user_id(request), op, text, object_id=single)
    shown: str = text
    if recorder is not None and result.acted:
        shown = batch_report(model_admin, text, recorder.token, result.acted, op.past)
    (messages.success if result.acted else messages.warning)(request, shown)
    return HttpResponseRedirect(next_url)


def batch_report(
    model_admin: ModelAdmin, text: str, token: str, acted: int, past: str | Promise
) -> SafeString:
    """A report ``text`` followed by a link to the message list of exactly the ``acted``
    messages of batch ``token`` ("Show the 137 messages requeued")."""
    return format_html(
        '{} <a href="{}" class="outbox-batch-link">{}</a>',
        text,
        list_url(model_admin, batch=token),
        ngettext("Show the %(n)s message %(past)s", "Show the %(n)s messages %(past)s", acted)
        % {"n": f"{acted:,}", "past": past},
    )


@console_view
def action_status(model_admin: ModelAdmin, request: HttpRequest, job_id: str) -> HttpResponse:
    """GET: progress of a background action (``admin:outbox_message_action_status``).

    Read only; refreshes itself every 2 seconds until the job ends. 404 for an id that
    is not shaped like an RQ job id or that the registry of console jobs does not hold
    (:mod:`.tasks`: no RQ job is fetched, so nothing is unpickled).
    """
    require_view(model_admin, request)
    if not JOB_ID.fullmatch(job_id):
        raise Http404("No such background action (not a job id).")
    task = tasks.status(job_id)
    if task is None:
        raise Http404("No such background action.")
    return TemplateResponse(
        request,
        f"{TEMPLATES}/action_status.html",
        context(
            model_admin,
            request,
            _("%(label)s in progress") % {"label": OPERATIONS[task.operation].label},
            task=task,
            batch_url=list_url(model_admin, batch=task.batch) if task.batch and task.acted else "",
        ),
    )
