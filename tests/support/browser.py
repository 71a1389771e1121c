"""Helpers of the browser tests: Playwright driving Debian's Chromium against a live server.

Chromium: ``OUTBOX_CHROMIUM`` if set, else ``/usr/bin/chromium`` (Debian's ``chromium``
package; ``scripts/test`` installs it on CI), else ``chromium`` on PATH. Playwright's
own browser downloads are not used. Without Chromium (or the ``playwright`` package) a
browser test is skipped with the reason, except when ``CI`` is set: then it fails, so CI
cannot pass without running it.

Screenshots are written to ``docs/screenshots/`` when ``OUTBOX_SCREENSHOTS=1``, else to
the test's temporary directory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests.support.processes import ROOT

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = ROOT / "docs" / "screenshots"
TIMEOUT_MS = 15_000  # longest wait for one page or element


def chromium_path() -> str | None:
    """The Chromium executable to drive, or None if there is none."""
    configured = os.environ.get("OUTBOX_CHROMIUM")
    candidates = [configured] if configured else ["/usr/bin/chromium", shutil.which("chromium") or ""]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def unavailable(reason: str) -> None:
    """Skip, or fail when ``CI`` is set (CI must not pass by skipping the browser test)."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so the browser test must run, not skip)", pytrace=False)
    pytest.skip(reason)


def require_browser() -> str:
    """The path of Chromium, after checking Playwright is importable."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("the playwright package is not installed (pip install -e '.[test]')")
    path = chromium_path()
    if path is None:
        where = os.environ.get("OUTBOX_CHROMIUM") or "/usr/bin/chromium or chromium on PATH"
        unavailable(
            f"no Chromium found at {where}: install Debian's chromium package (apt-get install chromium)"
        )
    return path


def prepare(django_user_model, tmp_path: Path) -> tuple[str, Path]:
    """Chromium's path (else skip, see :func:`require_browser`) and the directory for the
    screenshots, after creating the superuser "ada" that :func:`logged_in_page` logs in."""
    executable = require_browser()
    django_user_model.objects.create_superuser("ada", "ada@example.com", "correct horse")
    screenshots = SCREENSHOTS if os.environ.get("OUTBOX_SCREENSHOTS") == "1" else tmp_path
    screenshots.mkdir(parents=True, exist_ok=True)
    return executable, screenshots


@contextmanager
def logged_in_page(
    executable: str, base: str, *, dialogs: list[str] | None = None
) -> Iterator[tuple[Any, list[str]]]:
    """A page of a headless Chromium logged in as "ada" through the admin's form, on the
    outbox dashboard, and the list its JavaScript errors go to. Dialogs (``alert()``...)
    are recorded in ``dialogs`` (and dismissed) when it is given, from before the login.
    The browser is closed on leaving, and the database connections the caller's ORM
    calls opened inside the block."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            if dialogs is not None:
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))

            # Log in through the admin's form; "next" leads to the outbox dashboard.
            page.goto(f"{base}/admin/login/?next=/admin/outbox/message/")
            page.fill("#id_username", "ada")
            page.fill("#id_password", "correct horse")
            page.click("input[type=submit]")
            page.wait_for_selector("#count-failed")
            yield page, errors
        finally:
            browser.close()
            # Database connections opened by the test's ORM calls inside this block belong
            # to Playwright's event loop context (Django keeps connections per context
            # there), not to the thread's: pytest-django never closes them, and on
            # PostgreSQL the open session kept the test database from being dropped
            # ("being accessed by other users"). Close them here, in that context (a close
            # is safe there: Django's guard against the ORM in async code lifted for it).
            from django.db import connections

            with mock.patch.dict(os.environ, {"DJANGO_ALLOW_ASYNC_UNSAFE": "true"}):
                connections.close_all()


def shot(page, directory: Path, name: str, *, full_page: bool = True) -> Path:
    path = directory / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    assert path.stat().st_size > 10_000, f"{path} looks empty"
    return path
