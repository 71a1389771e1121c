"""The console's look on the installed Django, in a real browser (issue 20, item 5).

Django 6.1's admin made its breadcrumbs an ``<ol class="breadcrumbs">`` of ``<li>`` and
styles only that; the console's ``<div class="breadcrumbs">`` was left unstyled there
(no bar, links in the body's colour). Each console page's breadcrumbs must look exactly
like those of one of the admin's own pages (the app index, ``/admin/outbox/``) on the
Django that runs the test: same element, colours, padding, height, font, separators.

Run it on the oldest and the newest Django supported (the nox sessions leave the browser
marker out): ``pytest tests/console/test_browser_look.py`` in this virtualenv (Django 5.2) and in
one with Django 6.1 (Python 3.12+). Screenshots (named after the Django version) go to
``docs/screenshots/`` with ``OUTBOX_SCREENSHOTS=1``, else to the test's temporary
directory; Chromium and Playwright as in :mod:`tests.support.browser`.
"""

from __future__ import annotations

import django
import pytest

from tests.support.browser import TIMEOUT_MS, logged_in_page, prepare, shot
from tests.support.console import make

pytestmark = [pytest.mark.browser, pytest.mark.look, pytest.mark.django_db(transaction=True)]

#: What a page's breadcrumbs look like, read in the browser: the container's element and
#: computed style, its first link's, each item's separator (the ``::after`` content of
#: Django 6.1's list items; the ``›`` in the text of 5.2's), and whether the crumbs sit on
#: one line.
LOOK = """() => {
  const bar = document.querySelector('nav[aria-label] .breadcrumbs');
  if (!bar) return null;
  const style = getComputedStyle(bar);
  const link = getComputedStyle(bar.querySelector('a'));
  const items = [...bar.querySelectorAll('li')];
  const afters = items.map(li => getComputedStyle(li, '::after').content);
  const texts = items.length ? items.map(li => li.innerText.trim())
                             : bar.innerText.split('\\u203a').map(t => t.trim());
  const tops = [...(items.length ? items : bar.querySelectorAll('a'))].map(e => e.getBoundingClientRect().top);
  return {
    element: bar.tagName.toLowerCase(),
    background: style.backgroundColor,
    color: style.color,
    padding: style.padding,
    margin: style.margin,
    height: Math.round(bar.getBoundingClientRect().height),
    fontSize: style.fontSize,
    linkColor: link.color,
    linkFontSize: link.fontSize,
    separator: items.length ? afters[0] : (bar.innerText.includes('\\u203a') ? '\\u203a' : ''),
    separators: items.length ? afters.filter(c => c.includes('\\u203a')).length
                             : (bar.innerText.match(/\\u203a/g) || []).length,
    crumbs: texts,
    oneLine: Math.max(...tops) - Math.min(...tops) < 2,
  };
}"""

#: The style a page's breadcrumbs share with the admin's own (everything but the crumbs).
SHARED = (
    "element",
    "background",
    "color",
    "padding",
    "margin",
    "height",
    "fontSize",
    "linkColor",
    "linkFontSize",
)


def look(page, url: str) -> dict:
    page.goto(url)
    page.wait_for_selector("nav[aria-label] .breadcrumbs", timeout=TIMEOUT_MS)
    found = page.evaluate(LOOK)
    assert found is not None, f"no breadcrumbs on {url}"
    return found


def box(page, selector: str) -> dict:
    """The bounding box of the first element matching ``selector`` (x, y, width, height)."""
    found = page.locator(selector).first.bounding_box(timeout=TIMEOUT_MS)
    assert found is not None, f"{selector} is not shown"
    return found


def assert_list_layout(page) -> None:
    """The message list as a changelist: the filter beside the results on their right, the
    search field and its button on one line (on 6.1, the old markup put the filter under
    the results and squeezed the search into a column)."""
    results, side = box(page, "#result_list"), box(page, "#changelist-filter")
    assert side["x"] >= results["x"] + results["width"], (results, side)
    # the whole row is seen at 1,400 px: the results do not scroll sideways (the table's
    # box can end left of the filter while its last column is cut by its container)
    widths = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " return [r.scrollWidth, r.clientWidth]; }"
    )
    assert widths[0] <= widths[1], widths
    assert side["y"] < results["y"], (results, side)  # side by side: it starts beside the toolbar
    field, button = box(page, "#searchbar"), box(page, "#changelist-search input[type=submit]")
    assert abs(field["y"] + field["height"] / 2 - (button["y"] + button["height"] / 2)) < 6, (field, button)


def assert_detail_layout(page) -> None:
    """A message's action buttons at the top right, above its records (on 6.1, the old
    markup left them on the left in the content)."""
    content, action, record = (
        box(page, "#content"),
        box(page, "#detail-requeue"),
        box(page, "#message-record"),
    )
    assert action["x"] > content["x"] + content["width"] / 2, (content, action)
    assert action["y"] + action["height"] <= record["y"], (action, record)


def test_console_breadcrumbs_look_like_the_admins_own(live_server, repo, django_user_model, tmp_path):
    """On every kind of console page, the breadcrumbs match the admin app index's, on the
    installed Django, and the list and the detail are laid out as the admin's changelist
    and change form; screenshots of each page named after the Django version."""
    executable, screenshots = prepare(django_user_model, tmp_path)
    (failed,) = make(repo, 1, "failed", "mem")
    version = "django-" + ".".join(map(str, django.VERSION[:2]))
    base = live_server.url
    pages = {
        "dashboard": ("/admin/outbox/message/", ["Home", "Outbox", "Dashboard"]),
        "list": (
            "/admin/outbox/message/messages/?status=failed",
            ["Home", "Outbox", "Dashboard", "Messages"],
        ),
        "detail": (
            f"/admin/outbox/message/messages/{failed.id}/",
            ["Home", "Outbox", "Dashboard", "Messages", failed.id],
        ),
        "destination": (
            "/admin/outbox/message/destinations/mem/",
            ["Home", "Outbox", "Dashboard", "Destination mem"],
        ),
    }
    with logged_in_page(executable, base) as (page, errors):
        admin_own = look(page, f"{base}/admin/outbox/")  # Django's app_index.html
        assert admin_own["crumbs"] == ["Home", "Outbox"] and admin_own["separators"] == 1, admin_own
        assert admin_own["background"] not in ("rgba(0, 0, 0, 0)", "transparent"), admin_own
        shot(page, screenshots, f"breadcrumbs-admin-app-index-{version}", full_page=False)
        for name, (path, crumbs) in pages.items():
            console = look(page, base + path)
            assert {k: console[k] for k in SHARED} == {k: admin_own[k] for k in SHARED}, (name, console)
            assert console["separator"] == admin_own["separator"], (name, console)
            assert console["crumbs"] == crumbs, (name, console)
            assert console["separators"] == len(crumbs) - 1 and console["oneLine"], (name, console)
            {"list": assert_list_layout, "detail": assert_detail_layout}.get(name, lambda page: None)(page)
            shot(page, screenshots, f"console-{name}-{version}", full_page=False)
        assert errors == [], errors
