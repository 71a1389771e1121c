"""A starting worker compares its clock with Redis's (``TIME``) and warns past
``CLOCK_SKEW_LIMIT`` (issue 31, "also check" item 5): due times and lease deadlines use
each worker's clock. Real Redis (the single test server, and the real cluster); only the
worker's local clock is shifted."""

from __future__ import annotations

import logging
import time

import pytest

from outbox.delivery import worker as worker_module
from outbox.delivery.worker import CLOCK_SKEW_LIMIT, check_clock
from outbox.store.client.connection import clock_offsets


def test_a_clock_in_step_with_redis_gives_no_warning(redis, caplog):
    with caplog.at_level(logging.WARNING, logger="outbox"):
        skew = check_clock()
    assert skew is not None and skew < CLOCK_SKEW_LIMIT
    assert "clock" not in caplog.text
    (name, offset, error), *_ = clock_offsets()
    assert abs(offset) < 1.0 and 0 <= error < 1.0 and ":" in name


@pytest.mark.parametrize("shift", [5.0, -5.0])
def test_a_clock_off_by_more_than_the_limit_is_warned_about(redis, caplog, shift):
    with caplog.at_level(logging.WARNING, logger="outbox"):
        skew = check_clock(clock=lambda: time.time() + shift)
    assert skew is not None and 4.0 < skew < 6.0
    side = "behind" if shift < 0 else "ahead of"
    assert f"s {side} the Redis server's" in caplog.text
    assert "docs/operations.md" in caplog.text


def test_a_starting_worker_checks_its_clock(redis, caplog, monkeypatch):
    monkeypatch.setattr(worker_module, "check_clock", lambda: logging.getLogger("outbox").warning("checked"))
    with caplog.at_level(logging.WARNING, logger="outbox"):
        worker_module.run_worker(
            ["outbox"], worker_module.WorkerOptions(burst=True, housekeeping=False, relay=False)
        )
    assert "checked" in caplog.text


def test_redis_unreachable_is_no_error(redis, caplog):
    from tests.support import redis_down

    with redis_down(), caplog.at_level(logging.WARNING, logger="outbox"):
        assert check_clock() is None
    assert "clock" not in caplog.text


def test_on_the_cluster_every_primary_is_compared(cluster_mode, caplog):
    offsets = clock_offsets()
    assert len(offsets) >= 3 and all(abs(o) < 1.0 for _, o, _ in offsets)
    with caplog.at_level(logging.WARNING, logger="outbox"):
        assert check_clock(clock=lambda: time.time() - 3.0) > 2.0
    assert "s behind the Redis server's" in caplog.text  # this host's clock is 3 s behind
