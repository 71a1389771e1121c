"""Template filters and tags of the outbox console (``{% load outbox_admin %}``).

A reusable app cannot require ``django.contrib.humanize`` in ``INSTALLED_APPS``, so the
console brings its own number grouping; and its own time display, which always says
the time zone and keeps the exact moment in a ``<time datetime>`` element; and its
breadcrumbs in the markup of the installed Django's admin (:func:`breadcrumbs_tag`,
:func:`crumb`), which its CSS styles.
"""

from __future__ import annotations

from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

import django
from django import template
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.dateparse import parse_datetime
from django.utils.formats import number_format
from django.utils.html import format_html
from django.utils.safestring import SafeString

from outbox.records import PARTITION_SUFFIX

register = template.Library()

#: Django 6.1 changed the admin's markup, and its CSS styles only the new one:
#: breadcrumbs are an ordered list (``<ol class="breadcrumbs">`` of ``<li>``, the
#: separators drawn by the CSS, the current page ``aria-current``), not a ``<div>`` of
#: links separated by ``&rsaquo;``; a changelist's filter comes first inside
#: ``.changelist-form-container`` with the rest in a ``<div>`` beside it, not after that
#: container; object tools sit beside the title (``{% block object-tools %}``), not at
#: the top of the content. The console writes the markup of the Django it runs on.
NEW_ADMIN_MARKUP = django.VERSION >= (6, 1)

#: Date formats (``django.utils.dateformat``) of the ``when`` filter's styles.
FULL = "Y-m-d H:i:s"
SAME_DAY = "H:i:s"
SAME_YEAR = "M j, H:i"
OTHER_YEAR = "Y-m-d"


@register.filter
def grouped(value: Any) -> Any:
    """An integer with thousands separators for display (``1234567`` → ``1,234,567`` in
    English); anything that is not a number is returned unchanged. Keep raw numbers in
    ``data-`` attributes for scripts and tests."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = int(str(value))
        except (TypeError, ValueError):
            return value
    return number_format(value, force_grouping=True)


def zone_abbreviation(moment: datetime) -> str:
    """The time zone's short name at ``moment`` (``CET``, ``EST``, ``UTC``); zones with
    no abbreviation (``-03``) are shown as an offset from UTC (``UTC-03``)."""
    name = date_format(moment, "T")
    return f"UTC{name}" if name[:1] in "+-" else name


@register.filter
def zone(value: datetime | None) -> str:
    """The abbreviation of the current time zone at ``value`` (``CET``), or ``""``."""
    return zone_abbreviation(timezone.localtime(value)) if isinstance(value, datetime) else ""


@register.filter
def when(value: datetime | str | None, style: str = "full") -> str:
    """A moment in the current time zone inside ``<time datetime="ISO 8601">``.

    Styles: ``full`` (``2025-11-21 22:10:57 CET``), ``precise`` (with milliseconds),
    ``short`` (for tables: ``22:10:57`` today, ``Nov 21, 22:10`` this year, else
    ``2025-11-21``; the full moment with its zone in the ``title``). ``None`` or ``""``
    is ``–``; an ISO 8601 string (as RQ stores times) is parsed, else shown as it is.
    """
    if isinstance(value, str):
        try:
            parsed = parse_datetime(value.strip())
        except ValueError:
            parsed = None
        if parsed is None:
            return value or "–"
        value = parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, dt_timezone.utc)
    if value is None:
        return "–"
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    zone = zone_abbreviation(local)
    iso = local.isoformat()
    full = f"{date_format(local, FULL)} {zone}"
    if style == "short":
        today = timezone.localtime().date()
        if local.date() == today:
            shown = date_format(local, SAME_DAY)
        elif local.year == today.year:
            shown = date_format(local, SAME_YEAR)
        else:
            shown = date_format(local, OTHER_YEAR)
        return format_html('<time datetime="{}" title="{}">{}</time>', iso, full, shown)
    if style == "precise":
        full = f"{date_format(local, FULL)}.{local.microsecond // 1000:03d} {zone}"
    return format_html('<time datetime="{}">{}</time>', iso, full)


@register.filter
def id_parts(message_id: str, tail: int = 8) -> tuple[str, str, str]:
    """A message id cut for a short display: ``(prefix, middle, end)``, e.g.
    ``("msg_", "01a2017c4826cc7d", "4f60b163")``. The end is the random part that tells
    ids apart (the middle is the creation time, shared by messages sent together), and
    the partition the id names, if it names one (``"4f60b163_p7"``: ``tail`` digits and
    the ``_p<k>`` after them); templates show the prefix and the end, and keep the middle
    in the text (hidden), so the whole id is still copied when the text is selected."""
    prefix, sep, rest = message_id.partition("_")
    if not sep:
        prefix, rest = "", message_id
    else:
        prefix += sep
    suffix = PARTITION_SUFFIX.search(rest)
    digits, part = (rest[: suffix.start()], suffix.group(0)) if suffix else (rest, "")
    if len(digits) <= tail + 1:
        return prefix, "", rest
    return prefix, digits[:-tail], digits[-tail:] + part


@register.simple_tag
def new_admin_markup() -> bool:
    """True on Django 6.1+ (see :data:`NEW_ADMIN_MARKUP`):
    ``{% new_admin_markup as new_admin_markup %}{% if new_admin_markup %}...``."""
    return NEW_ADMIN_MARKUP


@register.simple_tag
def breadcrumbs_tag() -> str:
    """The element of the breadcrumbs container, ``ol`` (Django 6.1+) or ``div`` (5.2,
    6.0): ``{% breadcrumbs_tag as tag %}<{{ tag }} class="breadcrumbs">...</{{ tag }}>``."""
    return "ol" if NEW_ADMIN_MARKUP else "div"


@register.simple_tag
def crumb(label: Any, link: str = "", first: bool = False) -> SafeString:
    """One breadcrumb in the installed admin's markup (see :data:`NEW_ADMIN_MARKUP`).

    Args:
        label: the text shown (escaped).
        link: its URL; "" for the current page (the last crumb: not a link).
        first: the first crumb (Home), which has no separator before it in 5.2's markup.

    Returns ``<li><a href>label</a></li>`` / ``<li aria-current="page">label</li>`` on
    Django 6.1+, else ``&rsaquo; <a href>label</a>`` / ``&rsaquo; label``."""
    if NEW_ADMIN_MARKUP:
        if link:
            return format_html('<li><a href="{}">{}</a></li>\n', link, label)
        return format_html('<li aria-current="page">{}</li>\n', label)
    separator = "" if first else "&rsaquo; "
    if link:
        return format_html('{}<a href="{}">{}</a> ', SafeString(separator), link, label)
    return format_html("{}{} ", SafeString(separator), label)
