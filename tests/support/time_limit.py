"""The suite's time budget per test (issue 29): a test whose setup, call and teardown
together take longer than ``OUTBOX_TEST_TIME_LIMIT`` seconds (default 60) fails, unless
it carries ``@pytest.mark.slow(reason)`` saying why it needs the time.

CI's budget (README, "Development") is a whole run under 20 minutes on 2 cores; one test
that quietly grows to minutes would spend it. The bound is checked after the test has
run (a report, not a timeout: nothing is interrupted), so a failure names the test and
its time. ``OUTBOX_TEST_TIME_LIMIT=0`` turns the check off (a debugger session).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

DEFAULT_LIMIT_SECONDS = 60.0


def limit_seconds() -> float:
    """The bound in seconds: ``OUTBOX_TEST_TIME_LIMIT``, else 60; 0 means none.

    Raises ``pytest.UsageError`` for a value that is not a number >= 0."""
    raw = os.environ.get("OUTBOX_TEST_TIME_LIMIT", "")
    if not raw:
        return DEFAULT_LIMIT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"OUTBOX_TEST_TIME_LIMIT must be a number of seconds, not {raw!r}") from None
    if value < 0:
        raise pytest.UsageError(f"OUTBOX_TEST_TIME_LIMIT must be >= 0, not {raw!r}")
    return value


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LIMIT] = limit_seconds()
    config.addinivalue_line(
        "markers",
        "slow(reason): may take longer than OUTBOX_TEST_TIME_LIMIT (60 s) per test; the reason says why",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    durations: dict[str, float] = item.stash.setdefault(_DURATIONS, {})
    durations[report.when] = report.duration
    if report.when != "teardown" or report.failed:
        return
    limit = item.config.stash[_LIMIT]
    total = sum(durations.values())
    if not limit or total <= limit or item.get_closest_marker("slow") is not None:
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} took {total:.1f} s (setup {durations.get('setup', 0):.1f} s, call "
        f"{durations.get('call', 0):.1f} s, teardown {durations.get('teardown', 0):.1f} s), over the "
        f"suite's bound of {limit:g} s per test (OUTBOX_TEST_TIME_LIMIT): make it faster, or mark it "
        "@pytest.mark.slow(reason) saying why it needs the time"
    )


_DURATIONS = pytest.StashKey[dict[str, float]]()
_LIMIT = pytest.StashKey[float]()
