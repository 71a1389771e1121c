"""send() writes on a connection its thread keeps (outbox.store.client.thread_client), against a
real Redis: one connection per thread, given back when the thread ends, made again when
the server closed it, never shared with a forked child, never more than a quarter of a
bounded pool."""

from __future__ import annotations

import gc
import multiprocessing
import subprocess
import sys
import threading
import weakref

import pytest
from redis import BlockingConnectionPool, ConnectionPool, Redis
from redis.exceptions import ResponseError

import outbox
from outbox.store.client.thread_client import ThreadClients


def in_threads(n, fn):
    threads = [threading.Thread(target=fn) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_each_sending_thread_holds_one_connection_and_gives_it_back_when_it_ends(repo):
    clients = repo.thread_clients
    pool = repo.connection.connection_pool
    in_use = set(pool._in_use_connections)  # this thread's own, if an earlier test sent
    seen: list[int] = []
    lock = threading.Lock()
    alive = threading.Barrier(4)  # no thread ends (giving its connection back) too soon

    def send_three():
        for i in range(3):
            outbox.send("mem", {"i": i})
        held = clients.get()
        assert held is not repo.connection and held is clients.get()
        with lock:
            seen.append(held.client_id())
            seen_clients.append(weakref.ref(held))
        alive.wait(30)

    seen_clients: list = []
    in_threads(4, send_three)
    assert len(set(seen)) == 4  # a connection of its own per thread, kept for its sends
    assert repo.count("pending") == 12
    gc.collect()
    assert all(ref() is None for ref in seen_clients)  # the threads ended
    # ... and their connections are back in the pool, open, for whoever comes next.
    assert set(pool._in_use_connections) == in_use and len(pool._available_connections) >= 4


def test_a_held_connection_the_server_closed_is_made_again(repo):
    first = outbox.send("mem", "before")
    old_id = repo.thread_clients.get().client_id()
    killed = repo.connection.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    after = outbox.send("mem", "after")  # ThreadClients.run: once more, on a new connection
    assert [repo.get(m.id).body for m in (first, after)] == [b"before", b"after"]
    assert repo.thread_clients.get().client_id() != old_id
    assert repo.count("pending") == 2


def _child_sends(queue):
    from outbox.store import get_repository

    repo = get_repository()
    messages = [outbox.send("mem", {"child": i}) for i in range(20)]
    queue.put((repo.thread_clients.get().client_id(), [m.id for m in messages]))


def test_a_forked_child_sends_on_a_connection_of_its_own(repo):
    outbox.send("mem", "parent first")
    parent_id = repo.thread_clients.get().client_id()
    queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_child_sends, args=(queue,))
    child.start()
    child_id, child_ids = queue.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0
    assert child_id != parent_id  # the inherited socket is never used
    parent = [outbox.send("mem", {"parent": i}) for i in range(20)]
    assert repo.thread_clients.get().client_id() == parent_id
    assert all(m is not None for m in repo.get_many(child_ids + [m.id for m in parent]))
    assert repo.count("pending") == 41


def test_a_bounded_pool_lends_threads_at_most_a_quarter_of_it(redis):
    url = repo_url()
    pool = ConnectionPool.from_url(url, max_connections=8)
    clients = ThreadClients(Redis(connection_pool=pool))
    got: list[Redis] = []
    lock = threading.Lock()
    gate = threading.Barrier(4)

    def take():
        client = clients.get()
        with lock:
            got.append(client)
        gate.wait()  # all four alive at once

    in_threads(4, take)
    held = [c for c in got if c is not clients.client]
    assert len(held) == 2 and len(got) == 4
    assert ThreadClients(Redis(connection_pool=BlockingConnectionPool.from_url(url))).limit == 0
    pool.disconnect()


def repo_url():
    from outbox.store.client.connection import get_connection

    kwargs = get_connection().connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


def test_execute_answers_as_the_client_does(redis):
    """ThreadClients.execute (send()'s write, without redis-py's per-command wrapper) gives
    each kind of reply as ``Redis.execute_command`` gives it, and an error reply as the
    same exception, on the held connection it keeps."""
    clients = ThreadClients(Redis.from_url(repo_url()))
    plain = Redis.from_url(repo_url())
    held = clients.get()
    assert held is not clients.client
    commands = [
        ("SET", "t:k", "v"),  # a reply redis-py parses (True)
        ("GET", "t:k"),
        ("GET", "t:missing"),
        ("HSET", "t:h", "a", 1, "b", 2.5),
        ("HGETALL", "t:h"),  # parsed into a dict
        ("RPUSH", "t:l", "a", 2, 3.5, b"\x00bytes"),
        ("LRANGE", "t:l", 0, -1),
        ("EVAL", "return {1, 'two', {3}}", 0),
    ]

    def on(prefix, command):  # each side on keys of its own
        return tuple(w.replace("t:", prefix) if isinstance(w, str) else w for w in command)

    for command in commands:
        assert clients.execute(on("o:", command)) == plain.execute_command(*on("p:", command)), command
    assert clients.execute(("LRANGE", "o:l", 0, -1)) == [b"a", b"2", b"3.5", b"\x00bytes"]
    for bad in [("EVALSHA", "0" * 40, 0), ("INCR", "o:l"), ("NOSUCHCOMMAND",)]:  # o:l holds a list
        with pytest.raises(ResponseError) as ours_error:
            clients.execute(bad)
        with pytest.raises(ResponseError) as theirs_error:
            plain.execute_command(*bad)
        assert type(ours_error.value) is type(theirs_error.value), bad
    assert clients.get() is held and held.connection is not None  # an error reply keeps the connection
    assert clients.execute(("GET", "o:k")) == b"v"
    plain.delete(*(p + k for p in ("o:", "p:") for k in ("k", "h", "l")))


def test_execute_after_the_server_closed_a_held_connection_runs_once_more(redis):
    clients = ThreadClients(Redis.from_url(repo_url()))
    plain = Redis.from_url(repo_url())
    assert clients.execute(("SET", "t:once", "1")) is True or clients.execute(("GET", "t:once")) == b"1"
    old_id = clients.get().client_id()
    assert plain.client_kill_filter(_id=old_id) == 1
    assert clients.execute(("INCR", "t:once")) == 2  # ran once: on a new connection
    assert clients.get().client_id() != old_id
    plain.delete("t:once")


_METRICS_CHILD = """
import sys
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from redis import Redis
from redis.observability.config import MetricGroup, OTelConfig
from redis.observability.providers import get_observability_instance

reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
get_observability_instance().init(OTelConfig(metric_groups=[MetricGroup.COMMAND]))

from outbox.store.client.thread_client import ThreadClients

clients = ThreadClients(Redis.from_url(sys.argv[1]))
assert clients.get() is not clients.client
for _ in range(3):
    clients.execute(("SET", "t:metrics", "v"))
Redis.from_url(sys.argv[1]).execute_command("SET", "t:other", "v")  # redis-py's own path: counted apart
points = [
    point
    for resource in reader.get_metrics_data().resource_metrics
    for scope in resource.scope_metrics
    for metric in scope.metrics
    if metric.name == "db.client.operation.duration"
    for point in metric.data.data_points
    if point.attributes.get("db.operation.name") == "SET"
]
print(sum(point.count for point in points), [dict(point.attributes) for point in points])
"""


def test_execute_records_redis_py_client_metrics_when_they_are_configured(redis):
    """redis-py's own client metrics (its OpenTelemetry observability, when a project
    turns it on) count the writes that execute makes without its wrapper."""
    pytest.importorskip("redis.observability.recorder", reason="redis-py 7+ has client metrics")
    pytest.importorskip("opentelemetry.sdk.metrics", reason="the otel extra is not installed")
    done = subprocess.run(
        [sys.executable, "-c", _METRICS_CHILD, repo_url()], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0] == "4", done.stdout  # 3 by execute, 1 by execute_command
