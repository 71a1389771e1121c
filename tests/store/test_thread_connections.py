"""send() writes on a connection its thread keeps (outbox.store.client.thread_client), against a
real Redis: one connection per thread, given back when the thread ends, made again when
the server closed it, never shared with a forked child, never more than a quarter of a
bounded pool."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import weakref

from redis import BlockingConnectionPool, ConnectionPool, Redis

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
