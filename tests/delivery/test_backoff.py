"""The backoff schedule: pure functions, no Redis."""

import random

import pytest

from outbox.retry import MAX_DELAY_LIMIT, RetryPolicy, backoff_delay, retry_delay


def test_exponential_without_jitter_doubles_and_caps():
    policy = RetryPolicy(base=1, factor=2, max_delay=10, jitter="none")
    assert [backoff_delay(policy, n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_huge_retry_number_does_not_overflow():
    policy = RetryPolicy(base=1, factor=10, max_delay=60, jitter="none")
    assert backoff_delay(policy, 10_000) == 60


@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_equal_jitter_stays_between_half_and_whole(n):
    policy = RetryPolicy(base=2, factor=2, max_delay=100, jitter="equal")
    full = min(100, 2 * 2 ** (n - 1))
    rng = random.Random(1)
    delays = [backoff_delay(policy, n, rng) for _ in range(500)]
    assert all(full / 2 <= d <= full for d in delays)
    assert max(delays) - min(delays) > full / 4  # it does spread


def test_full_jitter_spans_zero_to_delay():
    policy = RetryPolicy(base=8, factor=1, max_delay=8, jitter="full")
    rng = random.Random(2)
    delays = [backoff_delay(policy, 1, rng) for _ in range(1000)]
    assert 0 <= min(delays) < 1 and 7 < max(delays) <= 8


def test_schedule_repeats_its_last_delay():
    policy = RetryPolicy.from_value([5, 30, 300], default=RetryPolicy(jitter="none"))
    assert [backoff_delay(policy, n) for n in range(1, 6)] == [5, 30, 300, 300, 300]


def test_retry_after_is_never_shortened_but_capped():
    policy = RetryPolicy(base=1, factor=2, max_delay=10, jitter="none")
    assert retry_delay(policy, 1, retry_after=120) == 120
    assert retry_delay(policy, 3, retry_after=1) == 4
    assert retry_delay(policy, 1, retry_after=10**12) == MAX_DELAY_LIMIT


def test_from_value_merges_over_default_and_round_trips():
    default = RetryPolicy(base=3, factor=3, max_delay=99, jitter="full")
    policy = RetryPolicy.from_value({"base": 1}, default=default)
    assert (policy.base, policy.factor, policy.max_delay, policy.jitter) == (1, 3, 99, "full")
    assert RetryPolicy.from_value(policy.to_dict()) == policy


@pytest.mark.parametrize(
    "value",
    [
        {"base": -1},
        {"base": "10"},
        {"factor": 0.5},
        {"max_delay": float("inf")},
        {"jitter": "some"},
        {"strategy": "linear"},
        {"delays": []},
        {"bogus": 1},
        [],
        "10s",
        {"base": True},
        [1, 40 * 24 * 3600],
    ],
)
def test_bad_policies_are_refused(value):
    with pytest.raises(ValueError):
        RetryPolicy.from_value(value)


def test_retry_number_starts_at_one():
    with pytest.raises(ValueError):
        backoff_delay(RetryPolicy(), 0)
