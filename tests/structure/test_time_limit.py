"""The suite's per-test time bound (tests/support/time_limit.py): a test over the bound
fails with its time unless it is marked ``slow(reason)``; ``0`` turns the check off."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TESTS = """
import time
import pytest

def test_quick():
    pass

def test_over_the_bound():
    time.sleep(0.3)

@pytest.mark.slow("needs the time on purpose")
def test_marked_slow():
    time.sleep(0.3)

@pytest.fixture
def slow_teardown():
    yield
    time.sleep(0.3)

def test_slow_teardown_counts(slow_teardown):
    pass
"""


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, limit: str) -> pytest.RunResult:
    monkeypatch.setenv("OUTBOX_TEST_TIME_LIMIT", limit)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_budget=TESTS)
    return pytester.runpytest_subprocess(
        "-p", "tests.support.time_limit", "-p", "no:django", "-p", "no:cacheprovider"
    )


def test_a_test_over_the_bound_fails_with_its_time(pytester, monkeypatch):
    result = run(pytester, monkeypatch, "0.2")
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*test_over_the_bound took 0.3 s*over the suite's bound of 0.2 s per test*@pytest.mark.slow(reason)*",
            "*test_slow_teardown_counts took 0.3 s*teardown 0.3 s*",
        ]
    )
    assert "test_marked_slow took" not in result.stdout.str()


def test_within_the_bound_or_switched_off_nothing_fails(pytester, monkeypatch):
    run(pytester, monkeypatch, "5").assert_outcomes(passed=4)


def test_zero_switches_the_check_off(pytester, monkeypatch):
    run(pytester, monkeypatch, "0").assert_outcomes(passed=4)


def test_a_bad_bound_is_a_usage_error(pytester, monkeypatch):
    result = run(pytester, monkeypatch, "soon")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*OUTBOX_TEST_TIME_LIMIT must be a number of seconds, not 'soon'*"])
