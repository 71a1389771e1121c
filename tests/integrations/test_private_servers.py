"""outbox.testing's private servers start even when a port they picked is taken before the
server binds it (CI's stop 28: a 6-node cluster failed to start because one node's port,
free when it was picked, was in use when the node started; the error said only "exited
with code 1")."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis import Redis

from outbox.testing import cluster_server, redis_server
from outbox.testing.cluster_server import ClusterServer
from outbox.testing.redis_server import RedisServer, ServerExited


@contextmanager
def taken_port() -> Iterator[int]:
    """A port another process's listener holds (here, a socket of this one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_server_on_a_taken_port_says_why_it_exited():
    with taken_port() as port:
        server = RedisServer(port=port)
        try:
            with pytest.raises(ServerExited) as exited:
                server.start()
        finally:
            server.stop()
    assert exited.value.address_in_use
    assert "Address already in use" in str(exited.value)


def test_a_server_whose_picked_port_was_taken_starts_on_another(monkeypatch):
    with taken_port() as port:
        picks = iter([port])
        real = redis_server.free_ports
        monkeypatch.setattr(redis_server, "free_ports", lambda n: [next(picks, None) or real(1)[0]])
        with RedisServer() as server:
            assert server.port != port
            assert Redis(port=server.port).ping()


def test_a_restarted_server_keeps_its_port_even_when_taken():
    """A restart must not move a server its clients know by port: it fails, saying why."""
    server = RedisServer().start()
    try:
        port = server.port
        server.halt()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
            with pytest.raises(ServerExited):
                server.start()
        assert server.port == port
        server.start()
        assert Redis(port=port).ping()
    finally:
        server.stop()


def test_free_ports_are_distinct():
    ports = redis_server.free_ports(64)
    assert len(set(ports)) == 64


@pytest.mark.cluster
def test_a_cluster_whose_node_ports_were_taken_starts_on_others(monkeypatch):
    """The first node's port and the second node's bus port are taken between the pick
    and the start: those nodes start on new ports and the cluster forms."""
    with taken_port() as port, taken_port() as bus_port:
        real = cluster_server.free_ports

        def rigged(count: int) -> list[int]:
            ports = real(count)
            if count == 6:  # the first pick: 3 primaries' ports and bus ports
                ports[0], ports[3] = port, bus_port
            return ports

        monkeypatch.setattr(cluster_server, "free_ports", rigged)
        with ClusterServer(primaries=3) as cluster:
            assert port not in [p for _, p in cluster.nodes]
            client = cluster.client()
            try:
                client.set("a", 1)
                assert client.get("a") == b"1"
            finally:
                client.close()


def test_free_ports_are_picked_below_the_kernels_ephemeral_range():
    """A port bound with port 0 is one the kernel also gives the local end of outgoing
    connections; the suite makes thousands, and one took a receiver's port between its
    pick and its bind (CI: "That port is already in use"). Picked ports lie below that
    range, where the kernel gives none (when the range leaves room: Linux's default does)."""
    low, high = redis_server.ephemeral_range()
    if low - redis_server.LOWEST_PICKED_PORT < 1000:
        pytest.skip(f"the ephemeral range {low}-{high} leaves no room below it")
    ports = redis_server.free_ports(200)
    assert len(set(ports)) == 200
    assert all(redis_server.LOWEST_PICKED_PORT <= p < low for p in ports), sorted(ports)[-5:]
    for port in ports[:20]:  # free indeed: a server can listen there
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
