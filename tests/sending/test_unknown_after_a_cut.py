"""Issue 30, item 2, the other side of a lost reply: the write reached Redis and ran, the
connection broke before the reply came back, and the one retry on a new connection could
not connect (Redis went away meanwhile). The error of the retry ("Error 111 connecting
to ...") says nothing of the first write; ``send()`` must still say that the outcome is
unknown, not that nothing was stored: the message is in Redis and will be delivered.

A TCP proxy on loopback stands between the outbox and a real private Redis: it relays
the warm-up, then relays the next write to Redis, closes the outbox's side before the
reply, and stops listening (the retry is refused)."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest
from redis import Redis

import outbox
from outbox.testing import RedisServer, free_port
from tests.support import redis_at

pytestmark = pytest.mark.single_server("a proxy in front of a private plain server")


class CuttingProxy:
    """Relays 127.0.0.1:``port`` to ``upstream``; after :meth:`cut`, the next bytes a
    client sends go to Redis, then that client's connection and the listener close."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.cutting = threading.Event()
        self.written = threading.Event()  # the cut write reached Redis
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.cutting.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        while data := client.recv(65536):
            server.sendall(data)
            if self.cutting.is_set():
                self.written.set()
                with contextlib.suppress(OSError):  # closed already, by another client's thread
                    self.listener.shutdown(socket.SHUT_RDWR)  # the retry finds nothing listening
                self.listener.close()
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
                client.close()
                return

    def _pump(self, server: socket.socket, client: socket.socket) -> None:
        try:
            while data := server.recv(65536):
                if self.cutting.is_set():
                    continue  # the reply of the cut write is dropped
                client.sendall(data)
        except OSError:
            pass


def test_a_write_that_ran_then_lost_its_connection_and_retry_is_unknown():
    from outbox.store import get_repository

    with RedisServer() as server:
        proxy = CuttingProxy(("127.0.0.1", server.port))
        try:
            with redis_at(f"redis://127.0.0.1:{proxy.port}/0"):
                get_repository.cache_clear()
                outbox.send("mem", {"warm": True})  # this thread's held connection, through the proxy
                proxy.cut()
                with pytest.raises(outbox.OutboxUnavailable) as raised:
                    outbox.send("mem", {"order": 1})
            assert proxy.written.is_set()
            exc = raised.value
            # the write ran: the message is in Redis, to be delivered
            stored = {
                k.decode().rsplit(":", 1)[1] for k in Redis.from_url(server.url).keys("outbox:message:*")
            }
            assert len(stored) == 2
            assert isinstance(exc, outbox.SendOutcomeUnknown), f"{type(exc).__name__}: {exc}"
            assert "nothing was stored" not in str(exc)
            assert len(exc.unknown) == 1 and exc.unknown[0].id in stored  # the one it stored
            with redis_at(server.url):  # Redis reachable again: send_again stores it once
                get_repository.cache_clear()
                assert [m.id for m in outbox.send_again(exc.unknown)] == [exc.unknown[0].id]
                assert get_repository().count() == 2
        finally:
            get_repository.cache_clear()


def test_a_send_after_a_restart_on_a_held_connection_is_stored():
    """The same retry when the first write cannot have been taken by the new server: a
    restarted Redis (no persistence: its scripts are gone too) closed the held
    connection; the retry connects, meets ``NOSCRIPT``, the steps load the scripts and
    write: the send succeeds (the retry's answer is the outcome), not "unknown"."""
    from outbox.store import get_repository

    with RedisServer() as server:
        try:
            with redis_at(server.url):
                get_repository.cache_clear()
                outbox.send("mem", {"warm": True})
                server.halt()  # SIGTERM: the held connection is closed with the process
                server.start()
                message = outbox.send("mem", {"after": "restart"})
                assert get_repository().get(message.id).body == b'{"after":"restart"}'
        finally:
            get_repository.cache_clear()


def test_the_same_under_a_retry_configured_on_the_pool():
    """A deployment that gives its pool a redis-py ``Retry`` (django-redis's
    ``CONNECTION_POOL_KWARGS``): redis-py runs the cut write again itself, and its last
    failure ("Error 111 connecting to ...") still says nothing of the first write."""
    from django.conf import settings
    from django.test import override_settings
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from outbox.store import get_repository

    with RedisServer() as server:
        proxy = CuttingProxy(("127.0.0.1", server.port))
        caches = {
            **settings.CACHES,
            "default": {
                "BACKEND": "django_redis.cache.RedisCache",
                "LOCATION": f"redis://127.0.0.1:{proxy.port}/0",
                "OPTIONS": {
                    "SOCKET_CONNECT_TIMEOUT": 0.5,
                    "SOCKET_TIMEOUT": 1,
                    "CONNECTION_POOL_KWARGS": {"retry": Retry(NoBackoff(), 2)},
                },
            },
        }
        try:
            with redis_at(server.url), override_settings(CACHES=caches):
                get_repository.cache_clear()
                outbox.send("mem", {"warm": True})
                assert (
                    get_repository().thread_clients.get().connection.retry._retries == 2
                )  # redis-py 5 has no get_retries()
                proxy.cut()
                with pytest.raises(outbox.OutboxUnavailable) as raised:
                    outbox.send("mem", {"order": 1})
            stored = {
                k.decode().rsplit(":", 1)[1] for k in Redis.from_url(server.url).keys("outbox:message:*")
            }
            assert len(stored) == 2
            exc = raised.value
            assert isinstance(exc, outbox.SendOutcomeUnknown), f"{type(exc).__name__}: {exc}"
            assert exc.unknown[0].id in stored
        finally:
            get_repository.cache_clear()
