"""Query-string parameters of the message list (and of bulk actions, which carry the
same filter): parsing into a :class:`~outbox.store.reads.queries.MessageFilter`, and back.

=================  ==========================================================
parameter          meaning
=================  ==========================================================
``status``         one of the statuses
``destination``    a destination name
``queue``          a django-rq queue name
``created_from``   created at or after (see :func:`parse_time` for formats)
``created_to``     created at or before
``updated_from``   last status change at or after
``updated_to``     last status change at or before
``status_code``    HTTP status of the last attempt (e.g. ``503``)
``error_class``    kind of the last failure (``http``, ``timeout``, ``ConnectError`` ...)
``batch``          the messages one bulk action acted on (its token, see
                   :mod:`outbox.operations.batches`)
``ordering_key``   every message of one ordering key (with ``destination``: the
                   key's partition is known), newest first, from the key's log
                   (:meth:`~outbox.store.MessageRepository.key_log`); no other
                   filter applies to it (each is ignored with an error, a 400)
``q``              search: a message id or an idempotency key (exact, as typed:
                   surrounding spaces are kept, a key may have them), else part
                   of an id as the list shows it (``msg_…4f60b163``, its end
                   ``4f60b163``, or a start ``msg_01a2017c``)
``o``              sort: ``created``, ``updated`` or ``next_attempt``; ``-`` prefix
                   for newest first
``p``              page number, from 1 (one partition, or one ordering key; ignored
                   otherwise)
``c``              page token of a partitioned list (Previous/Next; see
                   :mod:`outbox.admin_views.page_token`); one that is not valid
                   is refused with an error (a 400) and the first page
=================  ==========================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.utils.http import urlencode
from django.utils.translation import gettext as _

from outbox.admin_views import page_token
from outbox.admin_views.page_token import PageToken
from outbox.exceptions import InvalidMessage
from outbox.operations.batches import is_token
from outbox.records import STATUSES
from outbox.sending.validation import MAX_ORDERING_KEY, clean_ordering_key
from outbox.store.reads.queries import SORT_FIELDS, IdSearch, MessageFilter, TimeRange, search
from outbox.times import MAX_EPOCH, parse_time

if TYPE_CHECKING:
    from outbox.store.repository import MessageRepository

TIME_PARAMS = ("created_from", "created_to", "updated_from", "updated_to")
FILTER_PARAMS = ("status", "destination", "queue", *TIME_PARAMS, "status_code", "error_class", "batch")
SEARCH_PARAM = "q"
#: The list of one ordering key (with a destination).
KEY_PARAM = "ordering_key"
SORT_PARAM = "o"
PAGE_PARAM = "p"
#: The page token of a partitioned list (:mod:`outbox.admin_views.page_token`).
CURSOR_PARAM = "c"
PAGING_PARAMS = (PAGE_PARAM, CURSOR_PARAM)
LIST_PARAMS = (*FILTER_PARAMS, KEY_PARAM, SEARCH_PARAM, SORT_PARAM, PAGE_PARAM, CURSOR_PARAM)


def parse_as_of(raw: str | None, now: float) -> float:
    """The ``as_of`` of a confirmed bulk action: epoch seconds, not after ``now``.

    Raises:
        ValueError: not a finite number (``nan`` would reach Redis as a bound it refuses).
    """
    if raw is None or raw == "":
        return now
    try:
        as_of = float(raw)
    except ValueError:
        raise ValueError(f"as_of must be epoch seconds, not {raw[:40]!r}") from None
    if not math.isfinite(as_of) or abs(as_of) > MAX_EPOCH:
        raise ValueError(f"as_of must be finite epoch seconds, not {raw[:40]!r}")
    return min(as_of, now)


def search_text(data: Mapping[str, str]) -> str:
    """The search parameter as typed (not stripped: an idempotency key may have spaces
    around it), or "" when it is blank."""
    text = data.get(SEARCH_PARAM) or ""
    return text if text.strip() else ""


def search_ids(repo: MessageRepository, text: str) -> IdSearch:
    """What a search finds: :func:`~outbox.store.reads.queries.search` (a message id or an
    idempotency key, without surrounding spaces; an idempotency key exactly as typed
    when it has surrounding spaces; else part of an id as the list shows it,
    ``msg_…4f60b163``, with :attr:`~outbox.store.reads.queries.IdSearch.complete` False when
    that search stopped early)."""
    if not text.strip():
        return IdSearch()
    return search(repo, text)


@dataclass
class ListQuery:
    """A parsed message-list query string.

    Attributes:
        filter: what to list.
        search: the search text ("" for none).
        sort: a field of :data:`~outbox.store.reads.queries.SORT_FIELDS`, or "" for the index order.
        descending: newest (largest) first.
        page: page number, from 1.
        token: the page token (a partitioned list's position), or None.
        ordering_key: list every message of this ordering key of ``filter.destination``
            ("" for none); the filter's other conditions, the search and the sort are then
            not applied (see :func:`parse_list_query`).
        params: the accepted parameters as given (for links and hidden inputs).
        errors: messages about parameters that were ignored.
    """

    filter: MessageFilter
    search: str = ""
    sort: str = ""
    descending: bool = True
    page: int = 1
    token: PageToken | None = None
    ordering_key: str = ""
    params: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def querystring(self, **changes: str | int | None) -> str:
        """``?...`` of these parameters with some changed (None removes one).

        Changing anything but the page resets to page 1 (and drops a page token); a page
        number and a page token replace each other.
        """
        params = dict(self.params)
        if changes:  # another filter, sort or page: the old position means nothing there
            for name in PAGING_PARAMS:
                params.pop(name, None)
        for key, value in changes.items():
            if value is None or value == "":
                params.pop(key, None)
            else:
                params[key] = str(value)
        ordered = [(k, params[k]) for k in LIST_PARAMS if k in params]
        return "?" + urlencode(ordered) if ordered else "?"

    @property
    def filter_params(self) -> dict[str, str]:
        """The filter and search parameters alone (what bulk actions carry)."""
        return {k: v for k, v in self.params.items() if k in FILTER_PARAMS or k in (KEY_PARAM, SEARCH_PARAM)}

    @property
    def is_filtered(self) -> bool:
        return bool(self.filter_params)


def parse_filter(
    data: Mapping[str, str], now: float | None = None
) -> tuple[MessageFilter, dict[str, str], list[str]]:
    """Read the filter parameters of ``data`` (a QueryDict or dict).

    Returns:
        (the filter, the accepted parameters as given, error messages for the others).
    """
    params: dict[str, str] = {}
    errors: list[str] = []
    values: dict[str, str | None] = {}
    for name in ("status", "destination", "queue"):
        value = (data.get(name) or "").strip()
        if name == "status" and value and value not in STATUSES:
            errors.append(_("Unknown status %(value)s; showing all statuses.") % {"value": repr(value)})
            value = ""
        values[name] = value or None
        if value:
            params[name] = value
    status_code: int | None = None
    raw = (data.get("status_code") or "").strip()
    if raw:
        if raw.isdigit() and 100 <= int(raw) <= 599:
            status_code = int(raw)
            params["status_code"] = raw
        else:
            errors.append(
                _("HTTP status code %(value)s is not a number from 100 to 599; ignored.")
                % {"value": repr(raw[:40])}
            )
    error_class = (data.get("error_class") or "").strip()[:64] or None
    if error_class:
        params["error_class"] = error_class
    batch = (data.get("batch") or "").strip() or None
    if batch:
        if is_token(batch):
            params["batch"] = batch
        else:
            errors.append(_("Batch %(value)s is not a batch token; ignored.") % {"value": repr(batch[:40])})
            batch = None
    bounds: dict[str, float | None] = {}
    for name in TIME_PARAMS:
        raw = (data.get(name) or "").strip()
        bounds[name] = None
        if not raw:
            continue
        try:
            bounds[name] = parse_time(raw, now)
        except ValueError as exc:
            errors.append(
                _("%(name)s: %(error)s; ignored.")
                % {"name": name.replace("_", " ").capitalize(), "error": exc}
            )
            continue
        params[name] = raw
    flt = MessageFilter(
        status=values["status"],
        destination=values["destination"],
        queue=values["queue"],
        created=TimeRange(bounds["created_from"], bounds["created_to"]),
        updated=TimeRange(bounds["updated_from"], bounds["updated_to"]),
        status_code=status_code,
        error_class=error_class,
        batch=batch,
    )
    return flt, params, errors


def parse_list_query(data: Mapping[str, str], now: float | None = None) -> ListQuery:
    """Parse the message list's query string (see the module docstring); never raises."""
    flt, params, errors = parse_filter(data, now)
    search = search_text(data)
    if search:
        params[SEARCH_PARAM] = search
    sort, descending = "", True
    raw_sort = (data.get(SORT_PARAM) or "").strip()
    if raw_sort:
        name = raw_sort.lstrip("-")
        if name in SORT_FIELDS:
            sort, descending = name, raw_sort.startswith("-")
            params[SORT_PARAM] = raw_sort
        else:
            errors.append(_("Unknown sort %(value)s; ignored.") % {"value": repr(raw_sort)})
    page = 1
    raw_page = (data.get(PAGE_PARAM) or "").strip()
    if raw_page:
        try:
            page = max(1, int(raw_page))
        except ValueError:
            errors.append(_("Page %(value)s is not a number; showing page 1.") % {"value": repr(raw_page)})
        else:
            params[PAGE_PARAM] = str(page)
    token = None
    raw_token = (data.get(CURSOR_PARAM) or "").strip()
    if raw_token:
        try:
            token = page_token.decode(raw_token)
        except ValueError:
            errors.append(
                _("The page link is not valid (changed, cut, or of another list); showing the first page.")
            )
        else:
            params[CURSOR_PARAM] = raw_token
    key = ordering_key_param(data, flt.destination, errors)
    if key:
        params[KEY_PARAM] = key
        ignored = [
            name
            for name in (*FILTER_PARAMS, SEARCH_PARAM, SORT_PARAM)
            if name != "destination" and params.get(name)
        ]
        if ignored:
            errors.append(
                _(
                    "The list of one ordering key shows every message of the key, newest first; "
                    "%(names)s not applied."
                )
                % {"names": ", ".join(LABELS.get(n, n).replace("_", " ") for n in ignored)}
            )
            for name in ignored:
                params.pop(name)
            flt = MessageFilter(destination=flt.destination)
            search, sort, descending, token = "", "", True, None
            params.pop(CURSOR_PARAM, None)
    return ListQuery(flt, search, sort, descending, page, token, key, params, errors)


def ordering_key_param(data: Mapping[str, str], destination: str | None, errors: list[str]) -> str:
    """The ``ordering_key`` parameter: the key exactly as typed (surrounding spaces are
    part of a key), or "" when there is none or it cannot be used (no destination, or
    not an ordering key: :func:`~outbox.sending.validation.clean_ordering_key`), with the
    reason added to ``errors``."""
    raw = data.get(KEY_PARAM) or ""
    if not raw:
        return ""
    if not destination:
        errors.append(
            _(
                "The ordering key filter needs a destination (a key's messages are kept with their "
                "destination); ignored."
            )
        )
        return ""
    try:
        return clean_ordering_key(raw) or ""
    except InvalidMessage:
        errors.append(
            _("%(value)s is not an ordering key (1 to %(max)s printable characters); ignored.")
            % {"value": repr(raw[:40]) + ("…" if len(raw) > 40 else ""), "max": MAX_ORDERING_KEY}
        )
        return ""


#: How a parameter is named in texts (others: their name, ``_`` as a space).
LABELS = {"status_code": "HTTP status", SEARCH_PARAM: "search", SORT_PARAM: "sort"}


def describe(params: Mapping[str, str]) -> str:
    """A short human description of filter parameters, e.g. ``status failed, destination hook``."""
    parts = []
    for name in FILTER_PARAMS:
        if params.get(name):
            label = LABELS.get(name, name.replace("_", " "))
            parts.append(f"{label} {params[name]}")
    if params.get(SEARCH_PARAM):
        parts.append(f"search {params[SEARCH_PARAM]!r}")
    return ", ".join(parts) if parts else "no filter"
