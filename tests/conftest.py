"""Fixtures: a private Redis (see tests/settings.py), real RQ workers, real HTTP receivers."""

from __future__ import annotations

import json
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings


@pytest.fixture(autouse=True)
def redis(settings):
    """The private test Redis, emptied before each test; outbox caches reset."""
    from outbox.testing.state import empty_outbox

    with empty_outbox() as conn:
        yield conn


@pytest.fixture
def repo(redis):
    from outbox.store.connection import get_repository

    return get_repository()


def run_worker(
    *, burst: bool = True, simple: bool = False, max_jobs: int | None = None, relay: bool = False
) -> None:
    """Run a real outbox worker (RQ) on the outbox queues in this process, in burst mode:
    one housekeeping pass (relay, recovery, wake-ups), then every queued job.

    It forks a work horse per job (RQ's default) unless ``simple``. The relay of captured
    messages runs only with ``relay`` (it needs database access: ``django_db`` tests).
    """
    from outbox.conf import outbox_settings
    from outbox.delivery.worker import run_worker as outbox_run_worker

    outbox_run_worker(
        outbox_settings.queue_names,
        burst=burst,
        fork=not simple,
        max_jobs=max_jobs,
        logging_level="WARNING",
        relay=relay,
    )


@pytest.fixture
def worker() -> Callable[..., None]:
    return run_worker


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)  # when the request arrived (epoch seconds)

    def json(self):
        return json.loads(self.body)


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 that answers from a script of responses.

    ``responses`` is a list of (status, headers, delay seconds) used in turn; the last
    one repeats. Every request is recorded in ``requests``; ``most_active`` is the
    largest number of requests it was answering at once.
    """

    url: str = ""
    requests: list[Received] = field(default_factory=list)
    responses: list[tuple[int, dict[str, str], float]] = field(default_factory=lambda: [(200, {}, 0.0)])
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: int = 0
    most_active: int = 0

    def respond(self, *responses: int | tuple) -> None:
        self.responses = [r if isinstance(r, tuple) else (r, {}, 0.0) for r in responses]

    def next_response(self) -> tuple[int, dict[str, str], float]:
        with self.lock:
            index = min(len(self.requests) - 1, len(self.responses) - 1)
            return self.responses[index]


@contextmanager
def serving(server: socketserver.BaseServer) -> Iterator[socketserver.BaseServer]:
    """Run a socketserver (HTTP, SMTP...) on loopback in a daemon thread for the block."""
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A :class:`Receiver` listening on loopback for the block (the ``receiver`` fixture;
    a test that needs two receivers opens a second one with this)."""
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else headers and body in two writes meet delayed ACKs: +40 ms

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(length)
            with state.lock:
                state.requests.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                state.active += 1
                state.most_active = max(state.most_active, state.active)
            status, headers, delay = state.next_response()
            if delay:
                time.sleep(delay)
            with state.lock:
                state.active -= 1
            payload = b"ok" if status < 300 else b"nope"
            try:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:  # the client gave up (its timeout): nothing to answer
                self.close_connection = True

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        # socketserver's backlog of 5 drops the SYNs of a worker opening 16 or more
        # connections at once; each dropped one connects a second later (SYN retry).
        request_queue_size = 128

    with serving(Server(("127.0.0.1", 0), Handler)) as server:
        state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        yield state


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as state:
        yield state


def with_destinations(
    transport: str | None = None, *, retry=(0,), max_retries: int = 3, **entries: dict
) -> override_settings:
    """override_settings: the test OUTBOX with destinations added or replaced.

    Each entry gets ``TRANSPORT`` (when ``transport`` is given), ``RETRY`` and
    ``MAX_RETRIES`` unless it sets them itself. Webhook entries get
    ``OPTIONS["allow_private_networks"] = True`` unless they set it: the test receivers
    listen on 127.0.0.1, which the SSRF guard refuses by default.
    """
    from django.conf import settings

    defaults = {"RETRY": list(retry), "MAX_RETRIES": max_retries}
    if transport:
        defaults["TRANSPORT"] = transport
    config = {**settings.OUTBOX}
    built = {name: {**defaults, **e} for name, e in entries.items()}
    for entry in built.values():
        if entry.get("TRANSPORT") == "webhook" and isinstance(entry.get("OPTIONS", {}), dict):
            entry["OPTIONS"] = {"allow_private_networks": True, **entry.get("OPTIONS", {})}
    config["DESTINATIONS"] = {**config["DESTINATIONS"], **built}
    return override_settings(OUTBOX=config)


def hook_settings(url: str, **destination) -> override_settings:
    """override_settings with the 'hook' destination pointing at ``url``."""
    options = {"url": url, "timeout": 5, **destination.pop("OPTIONS", {})}
    return with_destinations("webhook", hook={**destination, "OPTIONS": options})


def redis_down() -> override_settings:
    """override_settings: CACHES pointing the outbox's alias at a port where nothing listens."""
    from django.conf import settings

    from outbox.testing import free_port

    caches = {
        **settings.CACHES,
        "default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{free_port()}/0"},
    }
    return override_settings(CACHES=caches)


@pytest.fixture
def hook(receiver):
    """The 'hook' destination pointed at the ``receiver`` fixture for the test."""
    with hook_settings(receiver.url):
        yield receiver


def assert_index_invariant(repo) -> None:
    """Every message id is in exactly one status index, the one its resend record names,
    of its own destination, and in that destination's created index; no index across
    destinations (kept by 0.1) is written."""
    from outbox.records import STATUSES

    conn = repo.connection
    assert not conn.exists(*repo.keys.legacy_indexes(STATUSES)), "an index across destinations was written"
    seen: dict[str, str] = {}
    all_ids: set[str] = set()
    for destination in repo.destinations():
        for status in STATUSES:
            for raw in conn.zrange(repo.keys.status(status, destination), 0, -1):
                message_id = raw.decode()
                assert message_id not in seen, f"{message_id} in both {seen[message_id]} and {status}"
                seen[message_id] = status
                assert conn.hget(repo.keys.resend(message_id), "destination").decode() == destination
        all_ids |= {r.decode() for r in conn.zrange(repo.keys.created(destination), 0, -1)}
    assert set(seen) == all_ids, "status indexes and the created index disagree"
    for message_id, status in seen.items():
        assert conn.hget(repo.keys.resend(message_id), "status").decode() == status
    # A pending or retrying message waits in exactly one place: its queue's due index, its
    # queue's quarantine index (a suspect, attempted alone), or its destination's parked
    # set (paused, disabled, circuit breaker open). A parked set holds nothing else.
    waiting = {i: s for i, s in seen.items() if s in ("pending", "retrying")}
    for key in conn.scan_iter(match=f"{repo.keys.prefix}:parked:*"):
        destination = key.decode().split(":parked:", 1)[1]
        for raw in conn.zrange(key, 0, -1):
            message_id = raw.decode()
            assert message_id in waiting, f"{message_id} parked but {seen.get(message_id, 'gone')}"
            record = conn.hmget(repo.keys.resend(message_id), "destination", "queue")
            assert record[0].decode() == destination
            assert conn.zscore(repo.keys.due(record[1].decode()), message_id) is None, (
                f"{message_id} both parked and due"
            )
            waiting.pop(message_id)
    for message_id in waiting:
        queue = conn.hget(repo.keys.resend(message_id), "queue").decode()
        due = conn.zscore(repo.keys.due(queue), message_id) is not None
        quarantined = conn.zscore(repo.keys.quarantine(queue), message_id) is not None
        assert due != quarantined, f"{message_id} is {seen[message_id]}: due {due}, quarantined {quarantined}"
        if quarantined:
            assert conn.hexists(repo.keys.resend(message_id), "suspect"), (
                f"{message_id} quarantined, no suspect"
            )
    for key in conn.scan_iter(match=f"{repo.keys.prefix}:quarantine:*"):
        for raw in conn.zrange(key, 0, -1):
            assert raw.decode() in waiting, f"{raw.decode()} quarantined but {seen.get(raw.decode(), 'gone')}"


def settle(worker, ids, *, passes: int = 20) -> None:
    """Run burst workers in this process (``simple``: no fork) until every message of
    ``ids`` is succeeded or failed. A retry due at once can be left to the next pass's
    wake-up, so one pass is not always enough.

    Raises:
        AssertionError: still unsettled after ``passes`` passes.
    """
    import outbox

    for _ in range(passes):
        worker(simple=True)
        if all(outbox.get(i).status in ("succeeded", "failed") for i in ids):
            return
        time.sleep(0.1)
    raise AssertionError(f"not settled: {[outbox.get(i).status for i in ids]}")


def settle_due(worker, messages) -> None:
    """Run burst workers until none of ``messages`` is due within a second (a retry due
    a few milliseconds after a burst worker stopped waits for the next one)."""
    import outbox

    for _ in range(10):
        worker()
        soon = time.time() + 1
        if not any(
            m.status in ("pending", "retrying", "sending") and (m.next_attempt_at or 0) <= soon
            for m in (outbox.get(x.id) for x in messages)
        ):
            return
        time.sleep(0.05)


def wait_for(predicate: Callable[[], object], timeout: float = 15.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` every ``interval`` seconds until it is true (True) or
    ``timeout`` seconds have passed (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
