"""The message list: filters, search, sorting, pagination, and the action form.

A page costs a few O(log N) commands plus one pipeline for its rows, whatever the
number of messages, when an index serves the filter and the sort (see
:mod:`outbox.store.reads.queries`). Sorting follows the index that serves the filter:

==========================  =======================  ==============================
status filter               sorts served             default
==========================  =======================  ==============================
none                        created                  newest created first
pending, retrying, waiting  next attempt             soonest due first
sending                     updated (claim time)     latest claimed first
succeeded/failed/cancelled  updated (entered status) latest first
==========================  =======================  ==============================

Another sort is refused with a note (never a sort of a million rows in Python).
A batch (``?batch=<token>``, the messages one bulk action acted on) is listed in the
order they were acted on. One ordering key (``?destination=<name>&ordering_key=<key>``)
is listed from the key's log, newest created first, by numbered pages whatever the
number of partitions (the log is one sorted set, in the key's partition: a page is one
ZREVRANGE by rank and a ZCARD); no other filter, search or sort applies to it (a status
would have to be checked message by message through the log), and "select all
matching" is not offered there (select the messages instead).

The HTTP status code and error class filters have no index of their own: the page
checks at most :data:`~outbox.store.reads.queries.SCAN_LIMIT` entries of the index serving
the rest of the filter and says so ("only the first N of M were checked"); bulk
actions on "all matching" check every entry. See :mod:`outbox.store.reads.queries`.

Pagination: with one partition (``OUTBOX["PARTITIONS"]`` = 1), numbered pages read by
rank (``?p=``), as Django's admin does. With more, each partition's index lives in its
own hash slot and a page is a k-way merge of a page of each partition
(:func:`~outbox.store.reads.queries.page_at`), so the list pages by **Previous / Next**
(``?c=<token>``, :mod:`outbox.admin_views.page_token`) and has no page numbers: page N
by number would read N pages of every partition (P x N x page size entries), by token it
reads one page of each, however deep. ``?p=`` is then ignored with a note.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from outbox.admin_views import page_token
from outbox.admin_views.base import TEMPLATES, allowed_operations, console_view, context, require_view, url
from outbox.admin_views.filters import (
    KEY_PARAM,
    PAGING_PARAMS,
    SEARCH_PARAM,
    ListQuery,
    parse_list_query,
    search_ids,
)
from outbox.admin_views.formatting import duration, moment, shorten
from outbox.admin_views.ordering import KeyState, key_state
from outbox.admin_views.page_token import PageToken
from outbox.conf import outbox_settings
from outbox.destinations import summary
from outbox.operations.batches import TTL as BATCH_TTL
from outbox.records import STATUSES, Message
from outbox.redaction import destination_options, redact, secrets_for
from outbox.store import get_repository
from outbox.store.indexes import Cursor
from outbox.store.reads import summary as summary_store
from outbox.store.reads.queries import page, page_at, score_field, served_sorts, summaries
from outbox.store.repository import MessageRepository
from outbox.templatetags.outbox_admin import zone_abbreviation

if TYPE_CHECKING:
    from outbox.admin_views.base import ModelAdmin

SORT_LABELS = {
    "created": gettext_lazy("Created"),
    "updated": gettext_lazy("Updated"),
    "next_attempt": gettext_lazy("Next attempt"),
}


@dataclass
class Row:
    """One message in the list (times are aware datetimes; templates localize them)."""

    id: str
    url: str
    destination: str
    content_type: str
    status: str
    retry_count: int
    max_retries: int
    next_attempt: datetime | None
    last_error: str
    last_error_full: str
    status_code: int | None
    error_class: str
    code_url: str
    class_url: str
    created: datetime | None
    updated: datetime | None
    queue: str


#: The largest rank a page of one ordering key is read from (far below Redis's 2**63).
MAX_RANK = 2**53

#: Changes of a link that narrows the list another way: it leaves a search and the list
#: of one ordering key.
LEAVE: dict[str, str | int | None] = {SEARCH_PARAM: None, KEY_PARAM: None}


@dataclass
class Choice:
    """A filter link in the sidebar."""

    label: str
    value: str
    url: str
    selected: bool
    count: int | None = None


@dataclass
class Column:
    """A sortable column header."""

    field: str
    label: str | Promise
    url: str | None
    sorted: bool
    descending: bool


def list_title(status: str | None, destination: str | None, batch: str | None, key: str = "") -> str:
    """The list's title: ``Failed messages to hook``, ``All messages of batch …``,
    ``Messages of ordering key order-42 to hook``."""
    if key:
        return _("Messages of ordering key %(key)s to %(destination)s") % {
            "key": key,
            "destination": destination,
        }
    title = _("%(status)s messages") % {"status": _(status).capitalize()} if status else _("All messages")
    if destination:
        title += " " + _("to %(destination)s") % {"destination": destination}
    if batch:
        title += " " + _("of batch %(batch)s") % {"batch": batch}
    return title


def time_zone_label() -> str:
    """The current time zone for a note: ``America/Chicago (CST)``, or just ``UTC``."""
    name = timezone.get_current_timezone_name()
    abbreviation = zone_abbreviation(timezone.localtime())
    return name if abbreviation == name else f"{name} ({abbreviation})"


def default_sort(status: str | None) -> tuple[str, bool]:
    """(field, descending) a status's list is shown in when no sort is asked for."""
    served = served_sorts(status)[0]
    return served, served != "next_attempt"


def shown_error(message: Message) -> str:
    """The message's last error with its and its destination's secrets redacted."""
    return redact(
        message.last_error or "",
        secrets=secrets_for(message.headers, destination_options(message.destination)),
    )


def _row(model_admin: ModelAdmin, m: Message, query: ListQuery) -> Row:
    error = shown_error(m)
    code = m.last_status_code
    return Row(
        id=m.id,
        url=url(model_admin, "message_detail", m.id),
        destination=m.destination,
        content_type=m.content_type,
        status=m.status,
        retry_count=m.retry_count,
        max_retries=m.max_retries,
        next_attempt=moment(m.next_attempt_at),
        last_error=shorten(error, 120),
        last_error_full=error,
        status_code=code,
        error_class=m.last_error_class,
        code_url=query.querystring(status_code=code, **LEAVE) if code is not None else "",
        class_url=query.querystring(error_class=m.last_error_class, **LEAVE) if m.last_error_class else "",
        created=moment(m.created_at),
        updated=moment(m.updated_at),
        queue=m.queue,
    )


def _choices(
    query: ListQuery, param: str, values: list[str], counts: dict[str, int] | None = None
) -> list[Choice]:
    """Sidebar links for one filter parameter; following one leaves a search and the
    list of one ordering key."""
    current = "" if query.ordering_key else query.params.get(param, "")
    out = [
        Choice(
            "All", "", query.querystring(**{param: None, **LEAVE}), current == "" and not query.ordering_key
        )
    ]
    for value in values:
        count = counts.get(value) if counts is not None else None
        link = query.querystring(**{param: value, **LEAVE})
        out.append(Choice(value, value, link, current == value, count))
    return out


#: Destinations the sidebar lists past ``LIVE_DESTINATIONS``: the summary's first ones.
DESTINATION_CHOICES = 50


def _destination_values(repo: MessageRepository, current: str | None) -> list[str]:
    """The sidebar's destinations: every one ever sent to, or past ``LIVE_DESTINATIONS``
    the configured ones and the summary's first :data:`DESTINATION_CHOICES` (failing
    first), with the one filtered by (the dashboard pages through all of them)."""
    if not summary.many(repo):
        return repo.destinations()
    names = [
        *outbox_settings.DESTINATIONS,
        *(r.name for r in summary_store.page(repo, 0, DESTINATION_CHOICES)),
    ]
    if current:
        names.append(current)
    return sorted(set(names))


def _columns(query: ListQuery, sort: str, descending: bool) -> list[Column]:
    served = () if query.filter.batch or query.ordering_key else served_sorts(query.filter.status)
    columns = []
    for name, label in SORT_LABELS.items():
        if name not in served:
            columns.append(Column(name, label, None, False, False))
            continue
        is_sorted = name == sort
        flip = not descending if is_sorted else default_sort(query.filter.status)[1]
        columns.append(
            Column(name, label, query.querystring(o=("-" if flip else "") + name), is_sorted, descending)
        )
    return columns


@dataclass
class CursorLinks:
    """The paging links of a partitioned list (query strings), None where there is none."""

    previous: str | None = None
    next: str | None = None
    first: str | None = None


def _scan_note(limits: list[str], scanned: int, index_total: int, matches: int) -> str:
    """The note of a first page that a bounded scan read (with partitions, the first
    entries of each, the budget shared)."""
    return _(
        "No index serves the %(limits)s filter, so only the first %(scanned)s of %(total)s "
        "messages were checked: %(matches)s of them match. Narrow the list by status, "
        "destination or a time range the index serves (created without a status; updated "
        "with a finished status) to see the rest. Actions on all matching messages check "
        "every one."
    ) % {
        "limits": _(" and ").join(limits),
        "scanned": f"{scanned:,}",
        "total": f"{index_total:,}",
        "matches": f"{matches:,}",
    }


def _note_empty_batch(batch: str | None, index_total: int, notes: list[str]) -> None:
    if batch and not index_total:
        notes.append(
            _(
                "Batch %(batch)s holds no messages: it expired (%(hours)s hours after its action) or never existed."
            )
            % {"batch": batch, "hours": BATCH_TTL // 3600}
        )


def _status_counts(repo: MessageRepository, destination: str | None, notes: list[str]) -> dict[str, int]:
    """The sidebar's counts per status: of one destination, read now; of every one, read
    now up to ``LIVE_DESTINATIONS``, else the destination summary's, with a note of its age."""
    counts, made = summary.status_counts(destination, repo)
    if made is not None:
        notes.append(
            _("The counts by status are of %(age)s ago (every destination, counted by the workers).")
            % {"age": duration(made.age())}
        )
    return counts


def _parked_note(repo: MessageRepository, destination: str | None) -> list[str]:
    """For the failed list: the messages that are not failed but parked (a breaker open,
    a destination paused or disabled), which a user looking for failures would miss."""
    if destination is None and summary.many(repo):
        made = summary.current(repo)
        if not made.parked:
            return []
        return [
            _(
                "%(n)s more messages were not failed but parked %(age)s ago (their destination's circuit "
                "breaker open, or it paused or disabled); the dashboard lists their destinations."
            )
            % {"n": f"{made.parked:,}", "age": duration(made.age())}
        ]
    parked = repo.parked_counts([destination] if destination else repo.destinations())
    if not parked:
        return []
    n = sum(parked.values())
    where = ", ".join(f"{name}: {count:,}" for name, count in sorted(parked.items()))
    return [
        ngettext(
            "%(n)s more message is not failed but parked (%(where)s): its destination's circuit "
            "breaker is open, or it is paused or disabled. It spends no retries and goes back to its "
            "queue when the destination recovers; the dashboard and the destination's page show it.",
            "%(n)s more messages are not failed but parked (%(where)s): their destination's circuit "
            "breaker is open, or it is paused or disabled. They spend no retries and go back to their "
            "queue when the destination recovers; the dashboard and the destination's page show them.",
            n,
        )
        % {"n": f"{n:,}", "where": where}
    ]


def _cursor_page(
    repo: MessageRepository, query: ListQuery, per_page: int, descending: bool, notes: list[str]
) -> tuple[list[str], int, bool, CursorLinks]:
    """A page of a partitioned list by position (:func:`~outbox.store.reads.queries.page_at`):
    (its ids, the count, whether the count is exact, its paging links). A page token of
    another kind of list is refused (an error: the answer is 400) for the first page."""
    flt = query.filter
    scored = "batch" if flt.batch else score_field(flt.status)
    token = query.token
    if token is not None and token.scored != scored:
        query.errors.append(
            _("The page link is not valid (changed, cut, or of another list); showing the first page.")
        )
        token = None
    if query.page > 1:
        notes.append(
            _(
                "With the outbox's data in %(n)s partitions the list pages by Previous and Next, not by "
                "number; this is the first page."
            )
            % {"n": repo.keys.partitions}
        )
    result = page_at(
        repo,
        flt,
        cursor=token.cursor if token else None,
        backward=token.backward if token else False,
        limit=per_page,
        descending=descending,
    )

    def link(cursor: Cursor | None, backward: bool) -> str | None:
        if cursor is None:
            return None
        return query.querystring(c=page_token.encode(PageToken(cursor, backward, scored)))

    links = CursorLinks(
        previous=link(result.previous, True),
        next=link(result.next, False),
        first=query.querystring(c=None) if result.previous is not None else None,
    )
    if not result.exact and token is None:  # from the start: as with one partition
        notes.append(_scan_note(result.plan.limits, result.scanned, result.index_total, result.total))
    elif not result.exact:
        notes.append(
            _(
                "No index serves the %(limits)s filter, so this page checked %(scanned)s of the "
                "%(total)s messages the index holds: %(matches)s of them match. Next goes on from "
                "where it stopped. Narrow the list by status, destination or a time range the index "
                "serves (created without a status; updated with a finished status) to check fewer. "
                "Actions on all matching messages check every one."
            )
            % {
                "limits": _(" and ").join(result.plan.limits),
                "scanned": f"{result.scanned:,}",
                "total": f"{result.index_total:,}",
                "matches": f"{result.total:,}",
            }
        )
    _note_empty_batch(flt.batch, result.index_total, notes)
    return result.ids, result.total, result.exact, links


def _key_page(
    repo: MessageRepository, destination: str, query: ListQuery, per_page: int, notes: list[str]
) -> tuple[list[str], int, int]:
    """A page of the list of one ordering key, newest first, by number (one ZREVRANGE and
    a ZCARD of the key's log: :meth:`~outbox.store.MessageRepository.key_log`):
    (its ids, how many the key has, the page number shown). A page past the end shows
    the last one, with a note."""
    current = query.page
    # a rank Redis can take (?p=10000000000000000000 reads an empty page, then the last)
    offset = min((current - 1) * per_page, MAX_RANK)
    ids, total = repo.key_log(destination, query.ordering_key, offset, per_page)
    last = max(1, -(-total // per_page))
    if current > last:
        notes.append(_("There is no such page; this is the last page, %(last)s.") % {"last": f"{last:,}"})
        current = last
        ids, total = repo.key_log(destination, query.ordering_key, (current - 1) * per_page, per_page)
    return ids, total, current


def _list_sort(query: ListQuery, notes: list[str]) -> tuple[str, bool]:
    """The (field, descending) the list is shown in: the sort asked for when the index
    serving the filter has it, else its default with a note (a batch: its own order)."""
    flt = query.filter
    sort, descending = default_sort(flt.status)
    if flt.batch:
        if query.sort:
            notes.append(_("A batch is listed in the order its messages were acted on; the sort is ignored."))
        return "", False  # the order the action acted on them
    if not query.sort:
        return sort, descending
    if query.sort in served_sorts(flt.status):
        return query.sort, query.descending
    values = {"sort": str(SORT_LABELS[query.sort]).lower(), "served": str(SORT_LABELS[sort]).lower()}
    if flt.status:
        text = _(
            "Sorting by %(sort)s is not available for %(status)s messages: they are listed by "
            "%(served)s, the order of the index that serves this list."
        ) % {**values, "status": flt.status}
    else:
        text = (
            _(
                "Sorting by %(sort)s is not available without a status filter: they are listed by "
                "%(served)s, the order of the index that serves this list."
            )
            % values
        )
    notes.append(text)
    return sort, descending


@dataclass(frozen=True)
class ListPage:
    """The page of the list shown (:func:`_list_page`): its ids, how many match (exact or
    a lower bound), the page number, the paging links of a partitioned list, whether it
    pages by number, and the ordering key's state when it lists one key."""

    ids: list[str]
    total: int
    exact: bool
    current: int
    links: CursorLinks
    numbered: bool
    key: KeyState | None = None


def _list_page(
    model_admin: ModelAdmin, repo: MessageRepository, query: ListQuery, descending: bool, notes: list[str]
) -> ListPage:
    """The page asked for: of one ordering key, of a search by id, by position (with
    partitions) or by number."""
    per_page = model_admin.list_per_page
    numbered = not repo.keys.partitioned
    if query.ordering_key:
        destination = query.filter.destination or ""  # parse_list_query keeps a key only with a destination
        key = key_state(model_admin, destination, query.ordering_key)
        ids, total, current = _key_page(repo, destination, query, per_page, notes)
        return ListPage(ids, total, True, current, CursorLinks(), True, key)
    if query.search:
        found = search_ids(repo, query.search)
        if not found.complete:
            notes.append(
                _(
                    "The search by part of an id stopped after %(n)s matches or %(examined)s messages "
                    "checked; type more of the id (its start msg_… narrows by creation time)."
                )
                % {"n": len(found.ids), "examined": f"{found.examined:,}"}
            )
        return ListPage(found.ids, len(found.ids), found.complete, 1, CursorLinks(), numbered)
    if repo.keys.partitioned:
        ids, total, exact, links = _cursor_page(repo, query, per_page, descending, notes)
        return ListPage(ids, total, exact, 1, links, numbered)
    return _numbered_page(repo, query, per_page, descending, notes)


def _numbered_page(
    repo: MessageRepository, query: ListQuery, per_page: int, descending: bool, notes: list[str]
) -> ListPage:
    """A page of a list in one partition by number (:func:`~outbox.store.reads.queries.page`);
    a page past the end shows the last one, with a note."""
    flt = query.filter
    current = query.page
    result = page(repo, flt, offset=(current - 1) * per_page, limit=per_page, descending=descending)
    last = max(1, -(-result.total // per_page))
    if current > last:  # past the end (?p=10000000000000000000): the last page instead
        notes.append(_("There is no such page; this is the last page, %(last)s.") % {"last": f"{last:,}"})
        current = last
        if result.total:
            result = page(repo, flt, offset=(current - 1) * per_page, limit=per_page, descending=descending)
    if not result.exact:
        notes.append(_scan_note(result.plan.limits, result.scanned, result.index_total, result.total))
    _note_empty_batch(flt.batch, result.index_total, notes)
    return ListPage(result.ids, result.total, result.exact, current, CursorLinks(), True)


def _page_links(
    query: ListQuery, paginator: Paginator[int], current: int
) -> list[tuple[str | None, str | int, bool]]:
    """The numbered page links (query string, number or ellipsis, whether it is the page
    shown) of a list that pages by number."""
    links: list[tuple[str | None, str | int, bool]] = []
    for number in paginator.get_elided_page_range(
        min(current, paginator.num_pages), on_each_side=2, on_ends=1
    ):
        if not isinstance(number, int):  # Paginator.ELLIPSIS
            links.append((None, number, False))
        else:
            links.append((query.querystring(p=number), number, number == current))
    return links


@console_view
def message_list(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """GET: the message list (``admin:outbox_message_list``). Needs ``outbox.view_message``.

    A parameter that cannot be used (a status that does not exist, ``created_from=nan``,
    ``p=abc``...) is ignored with a note, and the page is answered with status 400; a
    page number past the last page shows the last page, with a note."""
    require_view(model_admin, request)
    repo = get_repository()
    query = parse_list_query(request.GET)
    flt = query.filter
    notes: list[str] = []
    sort, descending = _list_sort(query, notes)
    shown = _list_page(model_admin, repo, query, descending, notes)
    rows = [_row(model_admin, m, query) for m in summaries(repo, shown.ids) if m is not None]
    paginator = Paginator(range(shown.total), model_admin.list_per_page)
    paged = paginator.num_pages > 1 and not query.search and shown.numbered
    page_links = _page_links(query, paginator, shown.current) if paged else []

    if flt.status == "failed":
        notes += _parked_note(repo, flt.destination)
    destination_counts = _status_counts(repo, flt.destination, notes) if not query.search else None
    operations = allowed_operations(request)
    return TemplateResponse(
        request,
        f"{TEMPLATES}/message_list.html",
        context(
            model_admin,
            request,
            list_title(flt.status, flt.destination, flt.batch, query.ordering_key),
            query=query,
            rows=rows,
            total=shown.total,
            exact=shown.exact,
            notes=notes,
            errors=query.errors,
            sort_columns={c.field: c for c in _columns(query, sort, descending)},
            page_links=page_links,
            previous_url=shown.links.previous,
            next_url=shown.links.next,
            first_url=shown.links.first,
            page_number=shown.current,
            num_pages=paginator.num_pages if shown.numbered else 1,
            key=shown.key,
            status_choices=_choices(query, "status", list(STATUSES), destination_counts),
            destination_choices=_choices(query, "destination", _destination_values(repo, flt.destination)),
            queue_choices=_choices(query, "queue", outbox_settings.queue_names),
            operations=operations,
            action_url=url(model_admin, "message_action"),
            hidden_filters=sorted(query.filter_params.items()),
            clear_url=query.querystring(**{k: None for k in query.params}),
            time_form_hidden=[
                (k, v)
                for k, v in query.params.items()
                if k in ("status", "destination", "queue", "o", "status_code", "error_class", "batch")
            ],
            error_form_hidden=[
                (k, v)
                for k, v in query.params.items()
                if k not in ("status_code", "error_class", SEARCH_PARAM, KEY_PARAM, *PAGING_PARAMS)
            ],
            time_zone=timezone.get_current_timezone_name(),
            time_zone_label=time_zone_label(),
            # not for one ordering key: "all matching" carries the filter, which has no key
            can_select_across=bool(operations)
            and not query.search
            and not shown.key
            and shown.total > len(rows),
        ),
        # Parameters that were ignored make it a bad request; the page still shows the rest.
        status=400 if query.errors else 200,
    )
