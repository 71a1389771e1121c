"""A process forked while another thread held one of the send path's process-wide locks
(``outbox.records.new_message_id``'s, around its per-millisecond sequence; the cluster
client's; the endpoint cache's): ``fork()`` copies a lock in the state it had, held by a
thread the child does not have, so without a new lock in the child its first ``send()``
(or ``publish()``) would wait for good. A web process with threads that forks (a
multiprocessing pool, a pre-fork server loading the app lazily, RQ's forking worker)
would hang so."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from outbox import records

# forking while another thread runs is this module's subject (Python 3.12+ warns of it)
pytestmark = pytest.mark.filterwarnings("ignore:.*multi-threaded.*fork:DeprecationWarning")


def _child(queue) -> None:
    queue.put([records.new_message_id() for _ in range(3)])


def test_a_child_forked_while_a_thread_makes_an_id_makes_ids():
    inside = threading.Event()
    release = threading.Event()
    original = records._id_state

    class Held(list):
        """The id state, whose read parks the thread that holds the lock."""

        def __getitem__(self, index):
            if not inside.is_set():
                inside.set()
                release.wait(30)
            return list.__getitem__(self, index)

    records._id_state = Held(original)
    holder = threading.Thread(target=records.new_message_id, daemon=True)
    holder.start()
    try:
        assert inside.wait(10)  # the holder is inside the lock now
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_child, args=(queue,))
        child.start()
        child.join(20)
        alive = child.is_alive()
        if alive:
            child.kill()
            child.join(5)
        assert not alive, "the child hung on the id lock it inherited held"
        ids = queue.get(timeout=5)
        assert len(set(ids)) == 3 and all(i.startswith("msg_") for i in ids)
    finally:
        release.set()
        holder.join(10)
        records._id_state = original


def _child_takes(getter, queue) -> None:
    queue.put(getter().acquire(timeout=5))


@pytest.mark.parametrize(
    "name",
    ["records._id_lock", "connection._cluster_lock", "config.endpoint_cache._lock", "endpoint._lock"],
)
def test_a_lock_of_the_send_path_held_at_fork_is_free_in_the_child(name):
    """Each process-wide lock that send() or publish() takes (and the endpoint
    transport's pool lock, which an eager delivery takes) is free in a child forked while
    another thread held it."""
    from outbox.destinations import config
    from outbox.store.client import connection
    from outbox.transports import endpoint

    owners = {"records": records, "connection": connection, "config": config, "endpoint": endpoint}
    first, *rest = name.split(".")

    def getter():
        value = owners[first]
        for attribute in rest:
            value = getattr(value, attribute)
        return value

    held, release = threading.Event(), threading.Event()

    def hold():
        with getter():
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        assert held.wait(10)
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_child_takes, args=(getter, queue))
        child.start()
        child.join(20)
        assert child.exitcode == 0
        assert queue.get(timeout=5) is True, f"{name} was still held in the child"
    finally:
        release.set()
        holder.join(10)
