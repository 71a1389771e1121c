"""The ``outbox_worker`` process (issue 20, items 1 and 2): an idle worker hears a wake-up
at once whatever read timeout the outbox's alias sets, and a stop request (SIGTERM,
SIGINT) ends it within a stated bound whether Redis is up, down or gone for a while.

Real ``manage.py outbox_worker`` processes on real Redis servers; the ones that stop
Redis use a private server of their own, never the suite's.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from django.test import override_settings

import outbox
from outbox.testing import RedisServer
from tests.support import Supervisor, wait_for

ALIAS_TIMEOUT = 1.0  # seconds: the read bound the tests give the outbox's alias (the README says 5)


@contextmanager
def short_read_timeout(settings) -> Iterator[None]:
    """CACHES with the outbox's alias bounded at ALIAS_TIMEOUT seconds per read. On
    database 15 of the test server: django-redis keeps one pool per URL for the whole
    process, so the suite's own URL would bring back the suite's pool (no bound)."""
    default = settings.CACHES["default"]
    options = {**default.get("OPTIONS", {}), "SOCKET_TIMEOUT": ALIAS_TIMEOUT}
    location = default["LOCATION"].rsplit("/", 1)[0] + "/15"
    with override_settings(
        CACHES={**settings.CACHES, "default": {**default, "LOCATION": location, "OPTIONS": options}}
    ):
        from outbox.store.client.connection import get_connection

        get_connection().flushdb()
        yield


def start_worker(
    processes: Supervisor, *args: str, redis_url: str | None = None, env: dict | None = None, preexec_fn=None
) -> subprocess.Popen:
    """A real ``outbox_worker`` (not burst) whose alias bounds reads at ALIAS_TIMEOUT s."""
    env = {"PYTHONUNBUFFERED": "1", "OUTBOX_TEST_SOCKET_TIMEOUT": str(ALIAS_TIMEOUT), **(env or {})}
    return processes.worker("-v", "2", *args, redis_url=redis_url, env=env, preexec_fn=preexec_fn)


output_of = Supervisor.output_of


def wait_until_listening(process: subprocess.Popen, conn) -> None:
    """Until the worker's RQ loop is registered (its housekeeping has beaten, and RQ's
    worker set lists it)."""
    from rq import Worker

    assert wait_for(lambda: process.poll() is not None or Worker.count(connection=conn) > 0), output_of(
        process
    )
    assert process.poll() is None, output_of(process)


# -- item 1: an idle worker is never deaf ------------------------------------------------


@pytest.mark.single_server("RQ is given the outbox's own pool only when both are on the alias")
def test_the_rq_worker_leaves_the_alias_read_bound_alone(settings, worker):
    """RQ's worker raises ``socket_timeout`` above its blocking wait in the pool it is
    given (``Worker._set_connection``); given the alias's pool, that removed the bound
    the project set for every other outbox command in the process."""
    from outbox.store.client.connection import get_connection

    with short_read_timeout(settings):
        pool = get_connection().connection_pool
        assert pool.connection_kwargs["socket_timeout"] == ALIAS_TIMEOUT
        worker()  # a real RQ worker, in burst mode, in this process
        assert pool.connection_kwargs["socket_timeout"] == ALIAS_TIMEOUT


@pytest.mark.single_server("RQ shares the outbox's pool only when both are on the alias")
def test_the_blocking_wait_outlasts_a_connection_made_before_rq_took_the_pool(settings):
    """The condition behind the deaf worker: a connection the outbox made in the pool
    before RQ raised the pool's timeout keeps the alias's short one; RQ's next BLPOP on
    it times out, and RQ backs off 1, 2, 4 ... 60 s. The worker's wait must not."""
    from rq.exceptions import DequeueTimeout

    from outbox.conf import outbox_settings
    from outbox.delivery.worker import rq_worker
    from outbox.store.client.connection import get_connection

    with short_read_timeout(settings):
        get_connection().ping()  # a connection made and given back before the worker exists
        rq = rq_worker(outbox_settings.queue_names)
        waited = int(ALIAS_TIMEOUT * 3)  # seconds (RQ takes whole seconds)
        started = time.monotonic()
        with pytest.raises(DequeueTimeout):  # RQ's "nothing came": not a socket timeout
            rq.queue_class.dequeue_any(rq.queues, waited, connection=rq.connection)
        assert time.monotonic() - started >= waited - 0.1
        # and everything else in the process keeps the alias's bound
        assert get_connection().connection_pool.connection_kwargs["socket_timeout"] == ALIAS_TIMEOUT
        rq.connection.connection_pool.disconnect()


def test_an_idle_worker_delivers_at_once(settings, redis, rq_redis, processes):
    """A real worker with a 1 s read bound on its alias, idle for several times that
    bound, delivers a message within about a second of ``send()``, and never logs that
    it could not reach Redis."""
    process = start_worker(processes)
    try:
        wait_until_listening(process, rq_redis)
        time.sleep(ALIAS_TIMEOUT * 5)  # idle: past the alias's bound several times over
        for round_ in range(2):
            sent_at = time.monotonic()
            m = outbox.send("mem", {"round": round_})
            assert wait_for(lambda m=m: outbox.get(m.id).status == "succeeded", timeout=10), output_of(
                process
            )
            took = time.monotonic() - sent_at
            assert took < 1.5, f"delivered {took:.2f} s after send()\n{output_of(process)}"
            time.sleep(ALIAS_TIMEOUT * 3)
    finally:
        log = output_of(process)
    assert "could not connect to Redis" not in log, log
    assert "Timeout reading from socket" not in log, log


# -- item 2: a stop request is never lost ------------------------------------------------

STOP_BOUND = 5.0  # seconds from SIGTERM to exit with no attempt in flight (docs/operations.md)


@pytest.fixture
def own_redis():
    """A private Redis server for one test, which the test may stop and start."""
    with RedisServer() as server:
        yield server


def _stops_within(process: subprocess.Popen, sig: int, bound: float) -> float:
    sent = time.monotonic()
    process.send_signal(sig)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=bound + 30)
    took = time.monotonic() - sent
    log = output_of(process)
    assert took <= bound, f"still running {took:.1f} s after the signal\n{log}"
    return took


def test_sigterm_stops_an_idle_worker(redis, rq_redis, processes):
    process = start_worker(processes)
    wait_until_listening(process, rq_redis)
    _stops_within(process, signal.SIGTERM, STOP_BOUND)
    assert process.returncode == 0


def test_a_stop_signal_swallowed_by_logging_still_stops_an_idle_worker(redis, rq_redis, processes, tmp_path):
    """RQ stops an idle worker by raising StopRequested from its signal handler; raised
    inside a logging call (RQ logs just before its blocking wait), the logging module
    swallows it and RQ waits for a job as if no stop had come. A formatter that stalls on
    that line (tests/support/stalling_log.py) puts the signal there on purpose."""
    stalled = tmp_path / "stalled"
    process = start_worker(processes, env={"OUTBOX_TEST_STALL_FILE": str(stalled)})
    assert wait_for(stalled.exists, timeout=30), output_of(process)
    _stops_within(process, signal.SIGTERM, STOP_BOUND)
    log = output_of(process)
    assert "Logging error" in log, log  # the signal did land inside logging
    assert process.returncode == 0 and "received again" not in log, (
        log
    )  # a stop, not an operator's second signal


@pytest.mark.parametrize("down_for", [0.5, 4.0, 9.0])
def test_sigterm_stops_a_worker_while_redis_is_down(own_redis, down_for, processes):
    """Redis stopped under a running worker, then SIGTERM: at once (RQ's reconnection
    backoff), a little later and a while later (RQ's loop has quit and the outbox waits for
    Redis to start a new one): every time the worker ends within the bound."""
    import redis as redis_py

    process = start_worker(processes, redis_url=own_redis.url)
    wait_until_listening(process, redis_py.Redis.from_url(own_redis.url))
    own_redis.halt()
    time.sleep(down_for)
    _stops_within(process, signal.SIGTERM, STOP_BOUND)


def test_sigint_stops_a_worker_while_redis_is_down(own_redis, processes):
    import redis as redis_py

    process = start_worker(processes, redis_url=own_redis.url)
    wait_until_listening(process, redis_py.Redis.from_url(own_redis.url))
    own_redis.halt()
    time.sleep(2.0)
    _stops_within(process, signal.SIGINT, STOP_BOUND)


def test_sigterm_lets_the_attempt_in_flight_finish_and_claims_nothing_more(
    receiver, redis, rq_redis, processes
):
    """A stop during an attempt: that attempt is answered and written as succeeded, the
    messages not yet claimed stay pending for the next worker, and the worker exits soon
    after the attempt ends."""
    receiver.respond((200, {}, 2.0))
    process = start_worker(
        processes,
        env={"OUTBOX_TEST_HOOK_URL": receiver.url, "OUTBOX_TEST_HOOK_EXTRA": '{"MAX_IN_FLIGHT": 1}'},
    )
    try:
        wait_until_listening(process, rq_redis)
        first = outbox.send("hook", {"n": 0})
        rest = [outbox.send("hook", {"n": n}) for n in range(1, 4)]
        assert wait_for(lambda: len(receiver.requests) == 1, timeout=10), output_of(process)
    except BaseException:
        output_of(process)
        raise
    took = _stops_within(process, signal.SIGTERM, STOP_BOUND + 2.0)
    assert took >= 1.0  # it waited for the attempt in flight (2 s from its start)
    assert outbox.get(first.id).status == "succeeded"
    assert len(receiver.requests) == 1  # nothing claimed after the stop request
    assert {outbox.get(m.id).status for m in rest} == {"pending"}


def test_a_stop_while_redis_goes_away_gives_up_writing_outcomes_after_a_grace(receiver, own_redis, processes):
    """SIGTERM during an attempt, then Redis stops: the run tries to write the outcome for
    STOP_WRITE_GRACE seconds after the request (not half the lease), and the worker ends.
    The unwritten outcome is an attempt in flight lost: the recovery sweep takes it back."""
    import redis as redis_py

    from outbox.delivery.loop import STOP_WRITE_GRACE

    receiver.respond((200, {}, 2.0))
    conn = redis_py.Redis.from_url(own_redis.url)
    process = start_worker(
        processes,
        redis_url=own_redis.url,
        env={"OUTBOX_TEST_HOOK_URL": receiver.url, "OUTBOX_TEST_VISIBILITY_TIMEOUT": "120"},
    )
    try:
        wait_until_listening(process, conn)
        with override_settings(CACHES=_caches_at(own_redis.url)):
            outbox.send("hook", {"n": 1})
        assert wait_for(lambda: len(receiver.requests) == 1, timeout=10), output_of(process)
    except BaseException:
        output_of(process)
        raise
    process.send_signal(signal.SIGTERM)
    own_redis.halt()
    # the attempt (2 s from its start), the grace, and a margin for a loaded machine
    _stops_within(process, signal.SIGTERM, 2.0 + STOP_WRITE_GRACE + 3.0)


def test_a_worker_started_with_sigint_ignored_keeps_ignoring_it(redis, rq_redis, processes):
    """A shell starts its background commands with SIGINT ignored (scripts/demo's worker:
    a Ctrl-C reaches the whole process group); the worker keeps it so (RQ would not) and
    stops on SIGTERM."""
    process = start_worker(processes, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    wait_until_listening(process, rq_redis)
    process.send_signal(signal.SIGINT)
    time.sleep(2.0)
    assert process.poll() is None, output_of(process)
    _stops_within(process, signal.SIGTERM, STOP_BOUND)


def _caches_at(url: str) -> dict:
    from django.conf import settings

    return {**settings.CACHES, "default": {**settings.CACHES["default"], "LOCATION": url}}


def test_a_second_sigterm_stops_at_once_with_one_log_line_and_no_traceback(
    receiver, redis, rq_redis, processes
):
    """Issue 30, item 9: the second signal (RQ's cold shutdown) printed a raw traceback
    ending in SystemExit. It ends the worker at once, said in one line."""
    receiver.respond((200, {}, 8.0))
    process = start_worker(
        processes,
        env={"OUTBOX_TEST_HOOK_URL": receiver.url, "OUTBOX_TEST_HOOK_EXTRA": '{"MAX_IN_FLIGHT": 1}'},
    )
    wait_until_listening(process, rq_redis)
    outbox.send("hook", {"n": 0})
    assert wait_for(lambda: len(receiver.requests) == 1, timeout=10), output_of(process)
    process.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # RQ ignores a second signal within 1 s of the first
    _stops_within(process, signal.SIGTERM, 3.0)  # not the 8 s attempt
    log = output_of(process)
    assert "SystemExit" not in log and "handling failed execution" not in log, log
    assert log.count("SIGTERM received again; stopping now") == 1, log
